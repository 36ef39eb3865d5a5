"""The Python half of scripts/device/{wheels.sh,run.sh}: wheel pins and checks, the step record, packing, the summary.

    python3 scripts/device/device.py pins PACKAGES              name==version of each, as installed here
    python3 scripts/device/device.py check-wheels DIR PACKAGES HAS [--limit-mb N]
                                                                one wheel per package, every need carried or on
                                                                the machine (HAS), total under the limit; MANIFEST.txt
    python3 scripts/device/device.py missing DIR                the wheels in DIR whose distribution is missing or older
    python3 scripts/device/device.py record STEPS NAME RC SECONDS TIMEOUT [NOTE]
    python3 scripts/device/device.py pack SRC DEST.tar.gz [--cap-mb N]
    python3 scripts/device/device.py summary WORK STEPS

Runs on the accelerator machine's Python 3.12 and on this machine's: standard library (and `packaging`,
which pip brings, for wheel metadata) only. What comes back from that machine is at most 8 files of at most
16 MiB each, so a run's reports travel as one tar.gz per step (`pack`: records over the cap are left out and
named, logs travel as their tails) and the figures a resolving note needs are printed last (`summary`).
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import tarfile
import zipfile
from pathlib import Path

# The accelerator machine's interpreter (KINDS.md: Python 3.12.3 on x86-64 Linux) for wheel markers.
DEVICE_MARKERS = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}
LOG_TAIL_LINES = {".log": 400, ".jsonl": 40, ".txt": 400}
RETURN_FILE_LIMIT_MB = 16  # the device tool brings back files of at most 16 MiB


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_names(path: str | Path, left_out: bool = False) -> list[str]:
    """Distribution names in a list file: one or more per line, `#` starts a comment. A name written `-name`
    is a need left out on purpose: returned (without the `-`) only when `left_out` is true."""
    names = []
    for line in Path(path).read_text().splitlines():
        names += [n.removeprefix("-") for n in line.split("#", 1)[0].split() if n.startswith("-") == left_out]
    return names


def wheel_name(path: Path) -> tuple[str, str]:
    """(normalized distribution name, version) from a wheel's file name."""
    dist, version = path.name.split("-")[:2]
    return norm(dist), version


# --- wheels.sh ------------------------------------------------------------------------------------------------


def cmd_pins(packages: str) -> int:
    from importlib import metadata

    missing = []
    for name in read_names(packages):
        try:
            print(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            missing.append(name)
    if missing:
        print(
            f"device.py pins: not installed here: {', '.join(missing)} (pip install -e '.[all]' first: the "
            f"wheels are pinned to this machine's versions)",
            file=sys.stderr,
        )
        return 2
    return 0


def wheel_requirements(path: Path) -> list[str]:
    """The names a wheel needs on the device's interpreter (Requires-Dist, markers evaluated, extras off)."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode("utf-8", "replace")
    needs = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is None or req.marker.evaluate(DEVICE_MARKERS):
            needs.append(norm(req.name))
    return needs


def check_wheels(
    directory: Path, packages: list[str], device_has: list[str], limit_mb: float, left_out: list[str] = ()
) -> list[str]:
    """Problems with a wheel folder: a package without its wheel, two versions of one, a need neither carried
    nor on the machine nor left out on purpose, the total over the limit. Writes MANIFEST.txt and prints the
    wheels and the total."""
    wheels = sorted(directory.glob("*.whl"))
    by_name: dict[str, list[Path]] = {}
    for w in wheels:
        by_name.setdefault(wheel_name(w)[0], []).append(w)
    wanted = {norm(p) for p in packages}
    has = {norm(p) for p in device_has} | {norm(p) for p in left_out}
    problems = [f"no wheel for {p}" for p in sorted(wanted - set(by_name))]
    problems += [
        f"{n}: {len(ws)} wheels ({', '.join(w.name for w in ws)}); keep one: two stop the install"
        for n, ws in by_name.items()
        if len(ws) > 1
    ]
    problems += [f"{n}: carried but not in packages.txt" for n in sorted(set(by_name) - wanted)]
    for w in wheels:
        for need in wheel_requirements(w):
            if need not in by_name and need not in has:
                problems.append(
                    f"{w.name} needs {need}, neither carried nor on the machine (device-has.txt) nor "
                    f"left out on purpose (`-{need}` in packages.txt)"
                )
    total = sum(w.stat().st_size for w in wheels)
    lines = [f"{w.stat().st_size / 2**20:8.2f} MiB  {w.name}" for w in wheels]
    lines.append(f"{total / 2**20:8.2f} MiB  total, {len(wheels)} wheels (limit {limit_mb:g} MiB)")
    (directory / "MANIFEST.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if total > limit_mb * 2**20:
        problems.append(
            f"{total / 2**20:.1f} MiB of wheels is over the {limit_mb:g} MiB limit (the carry limit is "
            f"64 MiB for the working tree and every carried path together)"
        )
    return problems


def cmd_check_wheels(argv: list[str]) -> int:
    limit = 60.0
    if "--limit-mb" in argv:
        i = argv.index("--limit-mb")
        limit = float(argv[i + 1])
        argv = argv[:i] + argv[i + 2 :]
    directory, packages, has = argv
    problems = check_wheels(
        Path(directory), read_names(packages), read_names(has), limit, read_names(packages, left_out=True)
    )
    for p in problems:
        print(f"device.py check-wheels: {p}", file=sys.stderr)
    return 1 if problems else 0


# --- run.sh ---------------------------------------------------------------------------------------------------


def needs_install(carried: str, have: str | None) -> bool:
    """A carried wheel goes in where its distribution is missing or older than the carried one (installed
    into a folder ahead on PYTHONPATH, it shadows the older copy for this run only); a newer one stays."""
    if have is None:
        return True
    try:
        from packaging.version import Version

        return Version(have) < Version(carried)
    except Exception:  # an unparsable version: keep what the machine has
        return False


def cmd_missing(directory: str) -> int:
    """Print the wheels to install (needs_install); on stderr, the ones this interpreter already has."""
    from importlib import metadata

    for w in sorted(Path(directory).glob("*.whl")):
        name, carried = wheel_name(w)
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = None
        if needs_install(carried, have):
            print(w)
            if have is not None:
                print(f"device.py: {name} {have} is older than the carried {carried}: installing it", file=sys.stderr)
            continue
        same = "same" if have == carried else f"carried {carried}, kept {have}"
        print(f"device.py: {name} {have} already installed ({same})", file=sys.stderr)
    return 0


def cmd_record(steps: str, name: str, rc: str, seconds: str, timeout: str, note: str = "") -> int:
    """Add (or replace) one step's outcome in steps.json, rewritten whole after every step."""
    path = Path(steps)
    data = json.loads(path.read_text()) if path.is_file() else {"steps": []}
    data["steps"] = [s for s in data["steps"] if s["name"] != name]
    entry = {
        "name": name,
        "rc": int(rc),
        "seconds": round(float(seconds), 1),
        "timeout_s": int(timeout),
        "timed_out": int(rc) == 124,
    }
    if note:
        entry["note"] = note
    data["steps"].append(entry)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return 0


def _tail(path: Path, lines: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 256 * 1024 * max(1, lines // 100)))
        data = f.read()
    return b"\n".join(data.splitlines()[-lines:]) + b"\n"


def pack(src: Path, dest: Path, cap_mb: float = 4.0, limit_mb: float = 15.0) -> list[str]:
    """tar.gz of a reports tree that comes back from the device: files up to `cap_mb` whole, logs as their
    tails, bigger records left out; halves the cap until the archive is under `limit_mb`. Returns PACKED.txt."""
    src, dest = Path(src), Path(dest)
    files = sorted(p for p in src.rglob("*") if p.is_file())
    while True:
        listing = []
        with tarfile.open(dest, "w:gz") as tar:
            for p in files:
                rel = str(p.relative_to(src))
                size = p.stat().st_size
                tail = (
                    LOG_TAIL_LINES.get(p.suffix) if "logs" in p.relative_to(src).parts or p.suffix == ".log" else None
                )
                if tail is not None and size > 64 * 1024:
                    data = _tail(p, tail)
                    info = tarfile.TarInfo(rel)
                    info.size, info.mtime = len(data), int(p.stat().st_mtime)
                    tar.addfile(info, io.BytesIO(data))
                    listing.append(f"tail {tail:>4} lines  {size:>11}  {rel}")
                elif size <= cap_mb * 2**20:
                    tar.add(p, arcname=rel)
                    listing.append(f"whole            {size:>11}  {rel}")
                else:
                    listing.append(f"LEFT OUT (> {cap_mb:g} MiB) {size:>11}  {rel}")
            text = ("\n".join(listing) + "\n").encode()
            info = tarfile.TarInfo("PACKED.txt")
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
        if dest.stat().st_size <= limit_mb * 2**20 or cap_mb < 0.1:
            return listing
        cap_mb /= 2


def cmd_pack(argv: list[str]) -> int:
    cap = 4.0
    if "--cap-mb" in argv:
        i = argv.index("--cap-mb")
        cap = float(argv[i + 1])
        argv = argv[:i] + argv[i + 2 :]
    src, dest = Path(argv[0]), Path(argv[1])
    if not src.is_dir():
        print(f"device.py pack: {src} does not exist: nothing to pack", file=sys.stderr)
        return 1
    listing = pack(src, dest, cap)
    left = [line for line in listing if line.startswith("LEFT OUT")]
    print(
        f"packed {len(listing) - len(left)} files of {src} into {dest} ({dest.stat().st_size / 2**20:.2f} MiB)"
        + (f"; {len(left)} left out over the cap (PACKED.txt names them)" if left else "")
    )
    return 0


# --- the summary printed last ---------------------------------------------------------------------------------


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _fmt(v, spec: str = ".2f") -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def _val(v) -> str:
    return format(v, ".4g") if isinstance(v, float) else repr(v)


PASSES = ("guided", "plain", "training_time")  # benchmarks.gpu_forward's (this script imports no torch)


def forward_lines(report: dict | None, label: str) -> list[str]:
    """The forward step's figures; a report cut short at the step's limit (`complete: false`) gives what it has."""
    if not report:
        return [f"{label}: no report"]
    fwd, runtime = report.get("forward") or {}, report.get("runtime") or {}
    sizes = list(fwd) or [n for n in runtime if n != "gpu_jpeg_decode"]  # --stages without forward: runtime's sizes

    def timed(n: str, k: str) -> dict:  # a stage not run: no figures
        return (fwd.get(n) or {}).get(k) or {}

    out = [
        f"{label}: {report['preset']} ({report['parameters'] / 1e6:.1f}M params) on {report['device']}, torch "
        f"{report['torch']}, autocast {report['autocast']}, {report['cameras']} x {report['image_size']}px cameras, "
        f"compile={report['compile']}"
        + (f", passes {'/'.join(report['passes'])}" if len(report.get("passes") or PASSES) < len(PASSES) else "")
        + ("" if report.get("complete", True) else f"; STOPPED at its limit after {report.get('seconds')} s (partial)"),
        f"  batch {'/'.join(sizes) or '-'}: guided ms "
        + "/".join(_fmt(timed(n, 'guided').get('median_ms')) for n in sizes)
        + "; plain ms "
        + "/".join(_fmt(timed(n, 'plain').get('median_ms')) for n in sizes)
        + (
            "; training-time ms " + "/".join(_fmt(fwd[n]['training_time'].get('median_ms')) for n in sizes)
            if fwd and all('training_time' in fwd[n] for n in sizes)
            else ""
        )
        + "; runtime (JPEG, whole batched path) ms "
        + (
            "/".join(_fmt((runtime.get(n) or {}).get('median_ms')) for n in sizes)
            if any('median_ms' in (runtime.get(n) or {}) for n in sizes)
            else "not timed"
        )
        + (
            "; runtime training-time ms " + "/".join(_fmt(runtime[n]['training_time_ms']) for n in sizes)
            if sizes and all('training_time_ms' in (runtime.get(n) or {}) for n in sizes)
            else ""
        ),
    ]
    if sizes and all("gpu_jpeg_gain" in (runtime.get(n) or {}) for n in sizes):
        out.append(
            "  JPEG decode, training-time path, CPU decoder -> nvjpeg, ms: "
            + "/".join(
                f"{_fmt(runtime[n]['training_time_cpu_jpeg_ms'])} -> {_fmt(runtime[n]['training_time_ms'])}"
                for n in sizes
            )
            + "; gain "
            + "/".join(_fmt(runtime[n]['gpu_jpeg_gain']) + "x" for n in sizes)
        )
    labels = [
        (k, k.replace("_", "-"))
        for k in PASSES  # --compile: the eager baseline of the same run
        if fwd and all(k + "_eager" in fwd[n] for n in sizes)
    ]  # (guided_eager: reports since the guided compile)
    if labels:
        out.append(
            "  eager in the same process, ms: "
            + "; ".join(
                f"{name} " + "/".join(_fmt(fwd[n][k + '_eager'].get('median_ms')) for n in sizes) for k, name in labels
            )
            + "; compile's gain: "
            + ", ".join(
                f"{name} "
                + "/".join(
                    _fmt(fwd[n][k].get('compile_gain'), '.2f') + ("x" if 'compile_gain' in fwd[n][k] else "")
                    for n in sizes
                )
                for k, name in labels
            )
        )
    for n in fwd:
        out += [f"  FAILED: the {k} pass at batch {n}: {row['error']}" for k, row in fwd[n].items() if "error" in row]
    for reason in report.get("compile_fallbacks") or []:
        out.append(f"  compile fell back: {reason}")
    g = report.get("micro_batching") or {}
    gains = [(k, g[k]) for k in PASSES if k in g]
    if gains:
        out.append(
            f"  micro-batching at {g['sessions']} sessions, requests/s one at a time -> micro-batched: "
            + "; ".join(
                f"{k.replace('_', '-')} FAILED: {row['error']}"
                if "error" in row
                else f"{k.replace('_', '-')} {_fmt(row['throughput_one_at_a_time_rps'], '.1f')} -> "
                f"{_fmt(row['throughput_micro_batched_rps'], '.1f')} (gain {_fmt(row['gain'])}x)"
                for k, row in gains
            )
            + f"; GPU JPEG decode: {runtime.get('gpu_jpeg_decode')}; load {_fmt(report['load_avg_before'][0])} -> "
            f"{_fmt((report.get('load_avg_after') or [None])[0])}"
        )
    else:
        out.append("  micro-batching: not timed")
    return out


def capacity_lines(root: Path) -> list[str]:
    sweeps = sorted(root.glob("*/*/sweep.json"))
    if not sweeps:
        return ["capacity: no sweep.json (refused or stopped before its first load step ended)"]
    out = []
    for path in sweeps:  # capacity and capacity-compile (the scenario named capacity_gpu_compile): one block each
        out += _sweep_lines(root, path)
    return out


def _sweep_lines(root: Path, path: Path) -> list[str]:
    sweep = _load(path) or {}
    cap = sweep.get("capacity") or {}
    f, m = cap.get("figures") or {}, cap.get("formula_measured") or {}
    knee = f.get("knee") if f.get("first_failure") is not None else f">= {f.get('knee')} (no load step failed)"
    out = [
        f"capacity ({path.parent.relative_to(root)}): knee {knee} sessions (first failure "
        f"{f.get('first_failure')}, {f.get('steps')} steps); P10 formula from the measured forward time "
        f"t {_fmt(m.get('t_ms'), '.1f')} ms, r {_fmt(m.get('r_hz'))} Hz, rtt {_fmt(m.get('rtt_ms'), '.1f')} ms: "
        f"n_max {_fmt(m.get('n_max'), '.1f')}; knee / n_max {_fmt(f.get('knee_ratio'))}"
        + (
            f"; without the bench's measured share: knee {f.get('knee_without_bench')}, first failure "
            f"{f.get('first_failure_without_bench')}"
            if "knee_without_bench" in f
            else ""
        )
    ]
    for v in sweep.get("variants", []):
        r = v.get("row") or {}
        out.append(
            f"  {v['value']:>4} sessions: {r.get('verdict')}, goodput {_fmt(r.get('goodput_ratio'))}, inference "
            f"p50 {_fmt(r.get('inference_ms_p50'), '.1f')} ms, queue wait p95 {_fmt(r.get('queue_wait_ms_p95'), '.1f')} ms, rtt p99 {_fmt(r.get('rtt_ms_p99'), '.0f')} ms"
            + (f"; failed: {'; '.join(r['failed_assertions'])}" if r.get("failed_assertions") else "")
        )
    out += [
        f"  sweep assertion {a['result']}: {a['expression']} (value {_val(a.get('value'))})"
        for a in sweep.get("assertions") or []
    ]
    return out


def fleet_lines(root: Path) -> list[str]:
    summaries = sorted(root.glob("*/*/summary.json"))
    if not summaries:
        return ["fleet: no summary.json"]
    s = _load(summaries[-1]) or {}
    fig = s.get("figures") or {}
    out = [
        f"fleet ({summaries[-1].parent.relative_to(root)}): {s.get('verdict')} (exit {s.get('exit_code')}), "
        f"{s.get('robots')} robots, wall {_fmt(s.get('wall_s'), '.0f')} s"
        + (f", error: {s['error']}" if s.get("error") else "")
    ]
    out.append(
        "  "
        + ", ".join(
            f"{k} {_fmt(fig.get(k), '.3f')}"
            for k in (
                "fallback_tick_ratio",
                "none_tick_ratio",
                "goodput_ratio",
                "host_late_tick_ratio",
                "recovered_within_s",
                "unrecovered_robots",
                "server_queue_depth_max",
                "host_cpu_percent",
            )
        )
    )
    failed = [
        f"{a['expression']} (value {_val(a.get('value'))}"
        + (
            f"; without the bench's measured share {_val(a['without_bench'].get('value'))}: "
            f"{a['without_bench'].get('result')}"
            if a.get("without_bench")
            else ""
        )
        + ")"
        for a in s.get("assertions", [])
        if a.get("result") != "pass"
    ]
    out.append(
        f"  assertions: {len(s.get('assertions', [])) - len(failed)} pass"
        + (f"; not passing: {'; '.join(failed)}" if failed else "")
    )
    cpu = s.get("cpu") or {}
    split = sorted((cpu.get("split") or {}).items(), key=lambda kv: -kv[1])
    if split:
        out.append(
            f"  cpu: host {_fmt(cpu.get('host_percent'), '.0f')} % of {cpu.get('cores')} cores; % of one core: "
            + ", ".join(f"{k} {v:.0f}" for k, v in split[:12])
            + (" ..." if len(split) > 12 else "")
        )
    est, got = (cpu.get("estimate") or {}).get("split") or {}, cpu.get("by_kind") or {}
    if est and got:  # issue 17's "where the CPU went", against the cost model the docs' sizing table comes from
        out.append(
            "  cores by kind, measured / estimated: "
            + ", ".join(f"{k} {_fmt(got.get(k))} / {_fmt(est.get(k))}" for k in est)
            + f" (ratio {_fmt(cpu.get('estimate_ratio'))}"
            + (
                f"; {_fmt(cpu['estimate_ratio_at_reference'])} unscaled"
                if cpu.get("estimate_ratio_at_reference")
                else ""
            )
            + ")"
        )
    threads = cpu.get("shard_threads") or {}
    if threads.get("cores"):  # inside the shards, by thread role: what the bench's own loop cost against the engines
        out.append(
            "  shards' threads, cores: "
            + ", ".join(f"{k} {v:.2f}" for k, v in threads["cores"].items() if v >= 0.005)
            + f" (of {_fmt(threads.get('process_cores'))}, accounted {_fmt(threads.get('accounted'))}); loop "
            f"{_fmt(threads.get('loop_us_per_robot_tick'), '.1f')} us a robot-tick, engine "
            f"{_fmt(threads.get('engine_ms_per_request'))} + zenoh {_fmt(threads.get('zenoh_ms_per_request'))} "
            "ms a request"
        )
    share = (s.get("fidelity") or {}).get("bench_share") or {}
    if (share.get("rtt_ms") or {}).get("p50") is not None:
        p99 = share["rtt_ms"].get("p99")
        out.append(
            f"  the bench's share of the round trip: ~{share['rtt_ms']['p50']:.1f} ms at p50"
            + (f", ~{p99:.1f} at p99" if p99 is not None else "")
            + " ("
            + ", ".join(
                f"{k[:-3]} {share[k]['p50']:.1f}"
                for k in (
                    (
                        "uplink_to_router_ms",
                        "uplink_from_router_ms",
                        "queue_wait_ms",
                        "inference_ms",
                        "downlink_to_router_ms",
                        "downlink_from_router_ms",
                    )
                    if share.get("uplink_to_router_ms")
                    else (
                        "uplink_ms",
                        "downlink_ms",
                        "queue_wait_ms",
                        "inference_ms",
                        "uplink_from_router_ms",
                        "downlink_to_router_ms",
                    )
                )
                if (share.get(k) or {}).get("p50") is not None
            )
            + f" at p50); proxy priority {', '.join((s.get('chaos_proxy') or {}).get('priority') or ['?'])}, "
            f"{(s.get('chaos_proxy') or {}).get('processes', '?')} proxy process(es)"
        )
        phases = [
            f"{name} {_fmt(v.get('p50'), '.1f')} / {_fmt(v.get('p99'), '.1f')} ({v.get('requests')} requests)"
            for name, v in (
                ("away from the faults", share["rtt_ms"].get("steady")),
                ("around them", share["rtt_ms"].get("around_faults")),
            )
            if v
        ]
        phases += [
            f"{b['fault']} at t {b['t_start']:g} s {_fmt(b.get('p50'), '.1f')} / {_fmt(b.get('p99'), '.1f')} "
            f"({b['requests']})"
            for b in share["rtt_ms"].get("by_fault") or []
        ]
        if phases:
            out.append("    p50 / p99 ms: " + "; ".join(phases))
    for q in (s.get("fidelity") or {}).get("queue_replay") or []:
        if q.get("replay_error_ms_p50") is not None:
            out.append(
                f"  replica {q['replica']} queue: reported p50/p99 {q['queue_wait_ms_p50']}/{q['queue_wait_ms_p99']} "
                f"ms, replay error {q['replay_error_ms_p50']}/{q['replay_error_ms_p99']}, unloaded "
                f"{q['unloaded_ms_p50']}/{q['unloaded_ms_p99']}"
            )
    hops = {r["figure"]: r for r in s.get("latency_budget") or []}
    parts = [
        (name, hops.get(k) or {})
        for name, k in (
            ("up to router", "uplink_to_router_ms"),
            ("router to server", "uplink_from_router_ms"),
            ("down to router", "downlink_to_router_ms"),
            ("router to robot", "downlink_from_router_ms"),
        )
    ]
    if any(r.get("p50_ms") is not None for _, r in parts):
        out.append(
            "  hops at the router, p50/p99 ms: "
            + "; ".join(
                f"{name} {r['p50_ms']:.1f}/{r['p99_ms']:.1f}"
                + (
                    f" (the bench's part {r['bench_p50_ms']:.1f}/{r['bench_p99_ms']:.1f})"
                    if r.get("bench_p99_ms") is not None
                    else ""
                )
                for name, r in parts
                if r.get("p50_ms") is not None
            )
        )
    for c in (s.get("state_changes") or [])[:6]:  # why robots left STREAMING or died, commonest kinds first
        out.append(
            f"  {c['from']} -> {c['to']}: {c['changes']} changes, {c['robots']} robots, t {c['t_first']:g}.."
            f"{c['t_last']:g} s: {c['example'][:160]}"
        )
    fid = s.get("fidelity") or {}
    if fid and not fid.get("valid", True):
        out.append(f"  fidelity not valid: {'; '.join(map(str, fid.get('reasons') or []))[:400]}")
    return out


def cmd_summary(work: str, steps: str) -> int:
    work_dir = Path(work)
    record = _load(Path(steps)) or {"steps": []}
    out = [
        "== device run summary: "
        + "; ".join(
            f"{s['name']} rc={s['rc']}{' (timed out)' if s['timed_out'] else ''} {s['seconds']:.0f}s/{s['timeout_s']}s"
            + (f" [{s['note']}]" if s.get("note") else "")
            for s in record["steps"]
        )
    ]
    names = {s["name"] for s in record["steps"]}
    if "forward" in names:
        out += forward_lines(_load(work_dir / "gpu_forward.json"), "forward")
    if "forward-compile" in names:
        out += forward_lines(_load(work_dir / "gpu_forward_compile.json"), "forward-compile")
    if "capacity" in names:
        out += capacity_lines(work_dir / "capacity")
    if "fleet" in names:
        out += fleet_lines(work_dir / "fleet")
    print("\n".join(out))
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "pins":
        return cmd_pins(*rest)
    if cmd == "check-wheels":
        return cmd_check_wheels(rest)
    if cmd == "missing":
        return cmd_missing(*rest)
    if cmd == "record":
        return cmd_record(*rest)
    if cmd == "pack":
        return cmd_pack(rest)
    if cmd == "summary":
        return cmd_summary(*rest)
    print(f"device.py: unknown command {cmd!r} (pins, check-wheels, missing, record, pack, summary)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
