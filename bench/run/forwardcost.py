"""What one forward pass of a replica costs this host's CPU: measured once from the checkpoint it serves, cached.

    replica manifest ──► key: checkpoint hash + the manifest's model keys + max_batch + this host + TIMING
                         + code (the source of the server modules `_child` runs) ──► hit
                     └─► miss: a child python loads the checkpoint as policy-server does (device, dtype,
                         hyper_params, execution_horizon, torch_threads), times forward passes with RTC guidance
                         at batch 1 and at max_batch in CPU time beside the speed probe ──► ms at the reference
                         probe (bench.run.usage.COST_REFERENCE_PROBE_MS) ──► cache

Owns `forward_cost` (bench.run.sizing prices a replica's forward passes with it) and the cache file
($XDG_CACHE_HOME or ~/.cache, fleet-inference/forward_ms.json). `code` is a sha256 over the source files of the
modules `_child` imports from the server (CHILD_IMPORTS) and every module of this tree they import in turn,
found by `ast` without importing them (no torch in the preflight): server/policies/ (the policy classes and
their RTC guidance; train.py too, as the package imports it), runtime.py, processors.py, accel.py. A change
there times the pass again; a change to the timing itself (`_child`, the speed probe) bumps TIMING.
Invariant: never raises for a replica it cannot time (no weights, a cuda device, a child that failed): the
cost says why and carries bench.run.sizing.REPLICA_FORWARD_MS, the reacher MLP's pass, instead.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CACHE_FILE = "forward_ms.json"
MAX_TIMED_BATCH = 64  # a max_batch above it is priced along the line through batch 1 and this one
CHILD_TIMEOUT_S = 180.0
ROUNDS = 5
CPU_PER_BATCH_S = 0.3  # CPU time spent timing each batch size in a round (at least 3 passes, at most 25)
# How `_child` times, part of the cache key: bump it when the timing changes, so entries timed the older way are
# timed again rather than read back (1: one pass of each batch size scaled by the best of five probes; 2: ROUNDS)
TIMING = 2
# What `_child` imports from this tree (a test holds the two together); the code fingerprint follows their imports
CHILD_IMPORTS = ("server.policies.checkpoint", "server.runtime")
SOURCE_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ForwardCost:
    """CPU ms of one forward pass at the reference speed probe: `at_1` at batch 1, `at_max` at `max_batch`,
    linear between; `source` is "measured", "cached" or "constant: <why it could not be measured>"."""

    at_1: float
    at_max: float
    max_batch: int
    source: str

    def ms(self, batch: float) -> float:
        if self.max_batch <= 1:
            return self.at_1
        return self.at_1 + (max(batch, 1.0) - 1.0) * (self.at_max - self.at_1) / (self.max_batch - 1)

    @property
    def measured(self) -> bool:
        return not self.source.startswith("constant")


def constant(ms: float, why: str) -> ForwardCost:
    return ForwardCost(ms, ms, 1, f"constant: {why}")


def cache_path() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fleet-inference" / CACHE_FILE


def checkpoint_hash(directory: Path) -> str:
    """server.policies.checkpoint.checkpoint_hash of a checkpoint directory (that module imports torch; the
    bench's preflight does not): sha256 over config.json, model.safetensors, stats.json, each fed as name, NUL,
    byte length (8 bytes little-endian), bytes; for a LeRobot directory, over every file in it, sorted by name
    (a cache key here, not the server's hash)."""
    digest = hashlib.sha256()
    names = ("config.json", "model.safetensors", "stats.json")
    if not (directory / "stats.json").is_file():  # a LeRobot directory: every file (server.policies.lerobot)
        names = tuple(sorted(p.name for p in directory.iterdir() if p.is_file()))
    for name in names:
        data = (directory / name).read_bytes()
        digest.update(name.encode() + b"\0" + len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def _module_files(module: str, root: Path) -> list[Path]:
    """The source file of `module` under `root` and its packages' __init__.py (importing it runs them); [] where
    it is not in this tree (a library)."""
    parts = module.split(".")
    files = [root.joinpath(*parts[:i], "__init__.py") for i in range(1, len(parts))]
    leaf = root.joinpath(*parts)
    files.append(leaf / "__init__.py" if leaf.is_dir() else leaf.with_suffix(".py"))
    return [f for f in files if f.is_file()] if files[-1].is_file() else []


def _imports(path: Path) -> set[str]:
    """Every module an `import` or `from ... import` in the file names, a function's lazy imports included; for
    `from package import name`, also `package.name` (the name may be a submodule)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def code_files(root: Path | None = None, modules: tuple[str, ...] = CHILD_IMPORTS) -> list[Path]:
    """The source files a timed forward pass runs from this tree: `modules` and, transitively, every module they
    import that is a file under `root` (libraries such as torch are not followed)."""
    root = root or SOURCE_ROOT
    seen: set[Path] = set()
    todo = [f for m in modules for f in _module_files(m, root)]
    while todo:
        f = todo.pop()
        if f not in seen:
            seen.add(f)
            todo.extend(g for m in _imports(f) for g in _module_files(m, root))
    return sorted(seen)


_fingerprints: dict[Path, tuple[tuple, str]] = {}  # root -> (its files' (path, mtime, size), fingerprint)


def _signature(files: list[Path]) -> tuple:
    return tuple((str(f), st.st_mtime_ns, st.st_size) for f in files for st in (f.stat(),))


def code_fingerprint(root: Path | None = None) -> str:
    """sha256 over `code_files`, each fed as its path under the root, NUL, byte length (8 bytes little-endian),
    bytes. Kept while none of those files changes (their imports are parsed again only then: ~40 ms)."""
    root = root or SOURCE_ROOT
    known = _fingerprints.get(root)
    if known is not None:
        try:
            if _signature([Path(p) for p, _, _ in known[0]]) == known[0]:
                return known[1]
        except OSError:  # a file went away: its importer changed too
            pass
    files = code_files(root)
    signature = _signature(files)  # before reading: a file changed while read is read again next time
    digest = hashlib.sha256()
    for f in files:
        data = f.read_bytes()
        digest.update(f.relative_to(root).as_posix().encode() + b"\0" + len(data).to_bytes(8, "little"))
        digest.update(data)
    _fingerprints[root] = (signature, digest.hexdigest())
    return digest.hexdigest()


def _host() -> str:
    model = ""
    try:
        model = next(
            (
                ln.split(":", 1)[1].strip()
                for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")
            ),
            "",
        )
    except OSError:
        pass
    try:
        from importlib.metadata import version

        torch = version("torch")
    except Exception:
        torch = "?"
    return f"{platform.node()}|{model or platform.processor()}|{os.cpu_count()}|torch {torch}"


def forward_cost(manifest: dict, fallback_ms: float, measure: bool = True, cache: Path | None = None) -> ForwardCost:
    """The forward cost of the replica `manifest` describes (`model.repo_or_path`, `model.device`, `model.dtype`,
    `model.hyper_params`, `execution_horizon`, `torch_threads`, `scheduling.max_batch`): from the cache, else
    measured here when `measure`, else `fallback_ms` with the reason."""
    model = manifest.get("model") or {}
    path = Path(str(model.get("repo_or_path", "")))
    device = str(model.get("device", "cpu"))
    max_batch = max(1, int((manifest.get("scheduling") or {}).get("max_batch", 1) or 1))
    if device != "cpu":
        return constant(fallback_ms, f"{device} device: its forward passes are not this host's CPU work")
    if not (path / "model.safetensors").is_file():
        return constant(fallback_ms, f"{path.name or path}: no weights to time")
    spec = {
        "path": str(path),
        "dtype": str(model.get("dtype", "float32")),
        "hyper_params": dict(model.get("hyper_params") or {}),
        "execution_horizon": manifest.get("execution_horizon"),
        "torch_threads": int(manifest.get("torch_threads", 1) or 1),
        "max_batch": min(max_batch, MAX_TIMED_BATCH),
        "trained_fps": manifest.get("trained_fps"),  # a LeRobot checkpoint's rate (its config records none)
    }
    try:
        key = json.dumps(
            {
                **{k: v for k, v in spec.items() if k not in ("path", "trained_fps")},  # the rate times nothing
                "checkpoint": checkpoint_hash(path),
                "code": code_fingerprint(),
                "host": _host(),
                "timing": TIMING,
            },
            sort_keys=True,
        )
    except OSError as exc:
        return constant(fallback_ms, f"{path.name}: {exc}")
    cache = cache or cache_path()
    entries = _read(cache)
    if key in entries:
        e = entries[key]
        return _priced(e, max_batch, "cached")
    if not measure:
        return constant(fallback_ms, f"{path.name} not measured on this host yet")
    print(f"bench: timing {path.name}'s forward passes on this host, once (cached in {cache})", file=sys.stderr)
    try:
        e = _measure_in_child(spec)
    except RuntimeError as exc:
        return constant(fallback_ms, f"{path.name}: {exc}")
    e.update(checkpoint=path.name, measured_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    entries = _read(cache)
    entries[key] = e
    _write(cache, entries)
    return _priced(e, max_batch, "measured")


def _priced(e: dict, max_batch: int, source: str) -> ForwardCost:
    timed = ForwardCost(float(e["at_1"]), float(e["at_max"]), int(e["max_batch"]), source)
    return ForwardCost(timed.at_1, timed.ms(max_batch), max_batch, source)


def _read(cache: Path) -> dict:
    try:
        return json.loads(cache.read_text())
    except (OSError, ValueError):
        return {}


def _write(cache: Path, entries: dict) -> None:
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entries, indent=1, sort_keys=True))
        tmp.replace(cache)
    except OSError:
        pass  # an unwritable cache costs the next preflight a measurement, nothing else


def _measure_in_child(spec: dict) -> dict:
    """Time in a child python: torch, its threads and the loaded weights stay out of the bench's process."""
    code = "import json, sys; from bench.run.forwardcost import _child; print(json.dumps(_child(json.load(sys.stdin))))"
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["torch_threads"]), "MKL_NUM_THREADS": str(spec["torch_threads"])}
    try:
        p = subprocess.run(
            [sys.executable, "-c", code],
            input=json.dumps(spec),
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            env=env,
            cwd=str(Path(__file__).resolve().parents[2]),
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"timing its forward passes took over {CHILD_TIMEOUT_S:g} s") from None
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"timing its forward passes failed: {last}")
    last = (p.stdout.strip().splitlines() or [""])[-1]
    try:  # the child's last line; anything else (a library's print after it, nothing) is a failed timing
        e = json.loads(last)
        return {**e, "at_1": float(e["at_1"]), "at_max": float(e["at_max"]), "max_batch": int(e["max_batch"])}
    except (ValueError, TypeError, KeyError) as exc:
        raise RuntimeError(f"timing its forward passes printed no timing ({last[:80]!r}: {exc})") from None


def _child(spec: dict) -> dict:
    """Load the checkpoint as policy-server does and time forward passes the way requests run them (one
    session's pipeline per sample, RTC prefix and delay where the policy supports it): CPU ms at batch 1 and
    at `max_batch`, scaled to the reference speed probe timed in the same process."""
    import numpy as np

    from bench.run.usage import COST_REFERENCE_PROBE_MS, speed_probe_cpu_ms
    from server.policies.checkpoint import load_checkpoint
    from server.runtime import InferItem, ModelRuntime, set_torch_threads

    set_torch_threads(spec["torch_threads"])
    loaded = load_checkpoint(spec["path"], device="cpu", dtype=spec["dtype"], trained_fps=spec.get("trained_fps"))
    if spec["hyper_params"]:
        loaded.policy.override_hyper_params(spec["hyper_params"])
    runtime = ModelRuntime(loaded, None, spec["execution_horizon"])
    runtime.warmup(5)
    cfg = runtime.config
    state = np.zeros(cfg.state_dim, np.float32)
    images = {name: np.zeros((s[1], s[2], 3), np.uint8) for name, s in cfg.image_features.items()}
    prefix = np.zeros((runtime.execution_horizon, cfg.action_dim), np.float32) if runtime.supports_rtc else None

    def cpu_ms(n: int) -> float:
        items = [
            InferItem(runtime.new_pipeline(), state, images, 1, prefix, prefix, rtc=runtime.supports_rtc)
            for _ in range(n)
        ]
        times: list[float] = []
        spent = 0.0
        while len(times) < 3 or (spent < CPU_PER_BATCH_S and len(times) < 25):
            t0 = time.process_time()
            res = runtime.infer(items, emulate=False)
            times.append(time.process_time() - t0)
            spent += times[-1]
            if res[0].error:
                raise RuntimeError(res[0].error)
        return sorted(times)[len(times) // 2] * 1e3

    # five rounds, each scaled by the speed probe timed around it, and the middle of each kept: on the shared 2-core VM
    # the reacher's pass read 2.7 to 4.9 ms within seconds, and the probe moved with it (30 to 52 ms); scaled, 2.0
    # to 3.4, and the middle of five rounds within ~15 % from one timing to the next
    rounds = []
    for _ in range(ROUNDS):
        before = speed_probe_cpu_ms(0.25)
        at_1 = cpu_ms(1)
        at_max = at_1 if spec["max_batch"] == 1 else cpu_ms(spec["max_batch"])  # max_batch 1: the same pass
        scale = COST_REFERENCE_PROBE_MS / ((before + speed_probe_cpu_ms(0.25)) / 2)
        rounds.append((at_1 * scale, at_max * scale, COST_REFERENCE_PROBE_MS / scale))
    at_1, at_max, probe = (sorted(r[i] for r in rounds)[ROUNDS // 2] for i in range(3))
    return {
        "at_1": round(at_1, 3),
        "at_max": round(at_max, 3),
        "max_batch": spec["max_batch"],
        "probe_ms": round(probe, 2),
        "type": cfg.type,
    }
