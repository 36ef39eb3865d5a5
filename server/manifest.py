"""The policy server's manifest: one YAML file (design 8.6 merged with 003's scheduling/models/clients).

    load_manifest("m.yaml", overrides) ──► YAML with line numbers ──► SCHEMA walk ──► Manifest
                                            (bench.yamlines)         every key checked: unknown keys,
                                                                     types, ranges, choices, files

Owns `SCHEMA` (every key, its type, default and meaning: docs/manifest.md is generated from it by
`python -m server.manifest --doc`), `load_manifest`, CLI overrides, and `ManifestError`, whose text is
``file:line: dotted.key: what is wrong; what to do``.

Invariants: weights load only from a local directory (a hub id is refused with the command that
downloads it); a value from `--set` or a flag goes through exactly the checks a file value does.
"""

from __future__ import annotations

import argparse
import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

REQUIRED = object()


class ManifestError(ValueError):
    def __init__(self, source: str, line: int | None, key: str, message: str):
        self.source, self.line, self.key = source, line, key
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")


@dataclass(frozen=True)
class Field:
    kind: str  # str int float bool list[str] path dir choice any emulated known_models known_clients
    default: Any
    doc: str
    lo: float | None = None
    hi: float | None = None
    choices: tuple | Callable[[], list[str]] | None = None
    nullable: bool = False


def _scheduler_names() -> list[str]:
    try:
        from server.scheduling import scheduler_names

        return list(scheduler_names())
    except Exception:  # pragma: no cover - the module ships with the server
        return ["round_robin", "deadline_aware", "model_deadline", "priority_tiered", "batch_optimized"]


SCHEMA: dict[str, Any] = {
    "model": {
        "repo_or_path": Field("dir", REQUIRED, "local checkpoint directory (config.json, model.safetensors, stats.json)"),
        "revision": Field("str", None, "revision label reported to clients; default: the checkpoint's, else `main`", nullable=True),
        "dtype": Field("choice", "float32", "weights dtype", choices=("float32", "bfloat16", "float16")),
        "device": Field("str", "cpu", "torch device: cpu, cuda or cuda:N"),
    },
    "model_id": Field("str", None, "model id in the keys; default: the checkpoint directory name", nullable=True),
    "replica_id": Field("str", "r0", "replica id in the keys (several replicas of a model share a router)"),
    "root": Field("str", "@fleet", "the verbatim root key chunk"),
    "default_task": Field("str", "", "task used when a client sends none"),
    "pin_task": Field("bool", False, "refuse sessions asking for another task than default_task"),
    "serving_mode": Field("choice", "shared", "shared: many sessions; exclusive: one (forced for chunk-stateful policies)",
                          choices=("shared", "exclusive")),
    "max_sessions": Field("int", 8, "capacity; session opens beyond it get CAPACITY with the load", lo=1),
    "warmup_inferences": Field("int", 2, "dummy forward passes before the replica declares itself ready", lo=0),
    "strict_fps": Field("bool", False, "reject clients whose fps differs from the trained fps (else warn)"),
    "trained_fps": Field("float", None, "override the checkpoint's trained fps", lo=0.0, nullable=True),
    "execution_horizon": Field("int", None, "RTC prefix rows; default: the checkpoint's", lo=1, nullable=True),
    "emulated_latency": Field("emulated", None, "emulated accelerator time per forward pass: ms, or {distribution: "
                              "fixed|normal|lognormal|uniform, mean_ms, std_ms, min_ms, max_ms, per_batch_item_ms}",
                              nullable=True),
    "torch_threads": Field("int", 1, "torch intra-op threads (1 keeps a 2-core host responsive)", lo=1),
    "zenoh": {
        "connect_endpoints": Field("list[str]", REQUIRED, "router endpoints, e.g. [tcp/127.0.0.1:7447]"),
        "lease_ms": Field("int", 1000, "this session's lease: how fast the router notices the server died", lo=100),
        "tls": {
            "root_ca_certificate": Field("path", None, "CA file (enables TLS)", nullable=True),
            "connect_certificate": Field("path", None, "this server's certificate (mTLS)", nullable=True),
            "connect_private_key": Field("path", None, "its private key", nullable=True),
        },
    },
    "health_port": Field("int", 0, "HTTP /healthz /readyz /metrics port on health_host; 0 = any free port, -1 = off",
                         lo=-1, hi=65535),
    "health_host": Field("str", "127.0.0.1", "address the health server binds"),
    "audit_path": Field("str", None, "JSON-lines audit log (one line per request); null = off", nullable=True),
    "debug": {
        "capture_dir": Field("str", None, "keep request/response batches here for `policy-server replay`", nullable=True),
        "capture_max": Field("int", 256, "newest forward passes kept (a ring of files)", lo=1),
    },
    "scheduling": {
        "strategy": Field("choice", "round_robin", "scheduler strategy", choices=_scheduler_names),
        "scoring": Field("str", None, "registered scoring function for deadline_aware/model_deadline", nullable=True),
        "max_queue_size": Field("int", 500, "pending requests (one per session) before the overflow policy", lo=1),
        "request_ttl_ms": Field("float", 5000.0, "a request waiting longer is answered EXPIRED", lo=0.0),
        "overflow_policy": Field("choice", "drop_oldest", "what a full queue drops",
                                 choices=("drop_oldest", "drop_newest", "reject")),
        "max_retries": Field("int", 0, "retries of a failed forward pass", lo=0),
        "max_batch": Field("int", 1, "sessions per forward pass (1 = no micro-batching)", lo=1, hi=1024),
        "batch_window_ms": Field("float", 2.0, "how long a partial batch waits for more sessions", lo=0.0),
    },
    "models": {
        "known": Field("known_models", {}, "per model id: {max_inflight: N} concurrent forward passes"),
        "default_max_inflight": Field("int", 1, "concurrent forward passes for a model not in `known`", lo=1),
    },
    "clients": {
        "defaults": {"latency_budget_ms": Field("float", 50.0, "default latency budget (deadline scheduling)", lo=0.0)},
        "known": Field("known_clients", [], "[{id, latency_budget_ms, priority}] per-client settings"),
        "accept_unknown": Field("bool", True, "accept clients not in `known`"),
        "allowlist": Field("list[str]", [], "client uuids or tag=value allowed to open sessions; empty = all"),
    },
    "session": {"gc_grace_s": Field("float", 2.0, "a session whose client liveliness is lost is closed after this", lo=0.0)},
    "limits": {
        "max_message_bytes": Field("int", 32 * 1024 * 1024, "largest observation body accepted", lo=1024),
        "max_elements": Field("int", 64 * 1024 * 1024, "largest tensor (elements)", lo=1),
    },
    "response_tracking": {
        "cadence_alpha": Field("float", 0.3, "EWMA weight of a session's request cadence", lo=0.0, hi=1.0),
    },
    "metrics": {"ring_buffer_size": Field("int", 10000, "samples kept per series for percentiles", lo=10)},
    "drain": {"timeout_s": Field("float", 10.0, "SIGTERM: longest wait for the batch in flight", lo=0.0)},
}


class Section:
    """Attribute access over a validated mapping; `to_dict()` gives it back."""

    def __init__(self, values: dict):
        self.__dict__.update(values)

    def to_dict(self) -> dict:
        return {k: (v.to_dict() if isinstance(v, Section) else v) for k, v in self.__dict__.items()}

    def get(self, key, default=None):
        return self.__dict__.get(key, default)

    def __repr__(self) -> str:
        return f"Section({self.to_dict()!r})"


Manifest = Section


def _line(node, key=None) -> int | None:
    if key is not None and hasattr(node, "line_of"):
        return node.line_of(key)
    return getattr(node, "line", None)


def _walk(schema: dict, raw, source: str, prefix: str, parent_line: int | None) -> Section:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ManifestError(source, _line(raw) or parent_line, prefix.rstrip("."), f"must be a mapping, got {type(raw).__name__}")
    for key in raw:
        if key not in schema:
            close = difflib.get_close_matches(str(key), list(schema), n=1)
            hint = f"did you mean {prefix}{close[0]}?" if close else f"known keys here: {', '.join(schema)}"
            raise ManifestError(source, _line(raw, key), f"{prefix}{key}", f"unknown key; {hint}")
    out = {}
    for key, spec in schema.items():
        path = f"{prefix}{key}"
        line = _line(raw, key) if key in raw else _line(raw) or parent_line
        if isinstance(spec, dict):
            out[key] = _walk(spec, raw.get(key), source, path + ".", line)
            continue
        if key not in raw:
            if spec.default is REQUIRED:
                raise ManifestError(source, line, path, f"is required: {spec.doc}")
            out[key] = _copy(spec.default)
            continue
        out[key] = _check(spec, raw[key], source, line, path)
    return Section(out)


def _copy(v):
    return list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v


def _check(spec: Field, v, source: str, line, path: str):
    def fail(msg: str):
        raise ManifestError(source, line, path, msg)

    if v is None:
        if spec.nullable or spec.default is None:
            return None
        fail(f"may not be null; {spec.doc}")
    k = spec.kind
    if k in ("str", "path", "dir"):
        if not isinstance(v, str) or (not v and k != "str"):
            fail(f"must be a {'non-empty ' if k != 'str' else ''}string, got {v!r}")
        if k == "path" and not os.path.isfile(v):
            fail(f"file {v!r} does not exist; check the path")
        if k == "dir":
            if not os.path.isdir(v):
                if "/" in v and not v.startswith((".", "/", "~")) and v.count("/") == 1:
                    fail(f"{v!r} is not a local directory. Weights load only from local paths: download it first "
                         f"(e.g. `huggingface-cli download {v} --local-dir checkpoints/{v.split('/')[-1]}`) and give that path")
                fail(f"directory {v!r} does not exist; give a local checkpoint directory")
        return v
    if k == "bool":
        if not isinstance(v, bool):
            fail(f"must be true or false, got {v!r}")
        return v
    if k in ("int", "float"):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (k == "int" and not isinstance(v, int)):
            fail(f"must be {'an integer' if k == 'int' else 'a number'}, got {v!r}")
        if spec.lo is not None and v < spec.lo or spec.hi is not None and v > spec.hi:
            rng = f"[{spec.lo if spec.lo is not None else '-inf'}, {spec.hi if spec.hi is not None else 'inf'}]"
            fail(f"{v} is outside {rng}")
        return float(v) if k == "float" else v
    if k == "choice":
        choices = spec.choices() if callable(spec.choices) else spec.choices
        if v not in choices:
            fail(f"{v!r} is not one of {', '.join(choices)}; pick one of them")
        return v
    if k == "list[str]":
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
            fail(f"must be a list of strings, got {v!r}")
        if spec.default is REQUIRED and not v:
            fail("needs at least one entry")
        return list(v)
    if k == "emulated":
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if v < 0:
                fail("must be >= 0 ms")
            return {"distribution": "fixed", "mean_ms": float(v)}
        known = {"distribution", "mean_ms", "std_ms", "min_ms", "max_ms", "per_batch_item_ms", "seed"}
        if not isinstance(v, dict):
            fail("must be a number of ms or a mapping {distribution, mean_ms, ...}")
        bad = sorted(set(v) - known)
        if bad:
            fail(f"unknown keys {bad}; known: {', '.join(sorted(known))}")
        if v.get("distribution", "fixed") not in ("fixed", "normal", "lognormal", "uniform"):
            fail(f"distribution {v.get('distribution')!r} is not one of fixed, normal, lognormal, uniform")
        for key in known - {"distribution", "seed"}:
            if key in v and (isinstance(v[key], bool) or not isinstance(v[key], (int, float)) or v[key] < 0):
                fail(f"{key} must be a number >= 0, got {v[key]!r}")
        return dict(v)
    if k == "known_models":
        if not isinstance(v, dict):
            fail("must be a mapping model_id -> {max_inflight: N}")
        for mid, conf in v.items():
            if not isinstance(conf, dict) or set(conf) - {"max_inflight"} or not isinstance(conf.get("max_inflight", 1), int) \
                    or conf.get("max_inflight", 1) < 1:
                fail(f"{mid}: give {{max_inflight: N}} with N >= 1")
        return {str(m): dict(c) for m, c in v.items()}
    if k == "known_clients":
        if not isinstance(v, list):
            fail("must be a list of {id, latency_budget_ms, priority}")
        for i, c in enumerate(v):
            if not isinstance(c, dict) or "id" not in c or set(c) - {"id", "model", "latency_budget_ms", "priority"}:
                fail(f"[{i}] needs `id` and only id, model, latency_budget_ms, priority")
        return [dict(c) for c in v]
    raise AssertionError(f"unknown field kind {k}")  # pragma: no cover - a schema bug


def load_manifest(path: str | os.PathLike, overrides: list[str] | dict | None = None) -> Section:
    """Read, override and validate a manifest; raise ManifestError naming the key, line and fix."""
    from bench.yamlines import load

    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ManifestError(source, None, "", f"cannot read the manifest: {exc.strerror}; check the path") from None
    try:
        raw = load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ManifestError(source, mark.line + 1 if mark else None, "",
                            f"not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if raw is None:
        raise ManifestError(source, None, "", "the manifest is empty; start from examples/manifests/minimal.yaml")
    if not isinstance(raw, dict):
        raise ManifestError(source, 1, "", "the manifest must be a YAML mapping")
    apply_overrides(raw, overrides)
    return _walk(SCHEMA, raw, source, "", 1)


def manifest_from_dict(data: dict, source: str = "<dict>") -> Section:
    return _walk(SCHEMA, data, source, "", None)


def apply_overrides(raw: dict, overrides: list[str] | dict | None) -> None:
    """`--set a.b=value` strings (value parsed as YAML) or a {dotted: value} dict, applied in place."""
    if not overrides:
        return
    items = overrides.items() if isinstance(overrides, dict) else (_split(o) for o in overrides)
    for dotted, value in items:
        cur = raw
        parts = dotted.split(".")
        for p in parts[:-1]:
            nxt = cur.get(p)
            if not isinstance(nxt, dict):
                nxt = {}
                cur[p] = nxt
            cur = nxt
        cur[parts[-1]] = value


def _split(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ManifestError("--set", None, "", f"{text!r} is not KEY=VALUE (e.g. scheduling.max_batch=8)")
    try:
        return key.strip(), yaml.safe_load(value) if value.strip() else None
    except yaml.YAMLError:
        return key.strip(), value


_FLAGS = [
    ("--model-path", "model.repo_or_path", str, "local checkpoint directory"),
    ("--model-id", "model_id", str, "model id in the keys"),
    ("--replica-id", "replica_id", str, "replica id in the keys"),
    ("--max-sessions", "max_sessions", int, "session capacity"),
    ("--health-port", "health_port", int, "health/metrics port (0 = any, -1 = off)"),
    ("--serving-mode", "serving_mode", str, "shared or exclusive"),
    ("--scheduler", "scheduling.strategy", str, "scheduler strategy"),
    ("--max-batch", "scheduling.max_batch", int, "sessions per forward pass"),
    ("--emulated-latency-ms", "emulated_latency", float, "emulated accelerator ms per forward pass"),
    ("--audit-path", "audit_path", str, "JSON-lines audit log"),
    ("--capture-dir", "debug.capture_dir", str, "debug capture directory"),
]


def add_cli_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("manifest overrides (validated like the file)")
    for flag, key, typ, help_ in _FLAGS:
        g.add_argument(flag, dest="ov_" + key.replace(".", "__"), type=typ, default=None, help=f"{help_} ({key})")
    g.add_argument("--connect", action="append", default=None, metavar="ENDPOINT",
                   help="router endpoint (repeatable; replaces zenoh.connect_endpoints)")
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any manifest key, e.g. drain.timeout_s=5")


def overrides_from_args(args) -> dict:
    out: dict = {}
    for _flag, key, _typ, _help in _FLAGS:
        v = getattr(args, "ov_" + key.replace(".", "__"), None)
        if v is not None:
            out[key] = v
    if getattr(args, "connect", None):
        out["zenoh.connect_endpoints"] = list(args.connect)
    for text in getattr(args, "set", []) or []:
        k, v = _split(text)
        out[k] = v
    return out


def schema_doc() -> str:
    """The manifest reference table (docs/manifest.md)."""
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]

    def walk(schema, prefix):
        for key, spec in schema.items():
            if isinstance(spec, dict):
                walk(spec, f"{prefix}{key}.")
                continue
            default = "required" if spec.default is REQUIRED else f"`{spec.default!r}`" if spec.default is not None else "null"
            kind = spec.kind
            if spec.kind == "choice":
                ch = spec.choices() if callable(spec.choices) else spec.choices
                kind = " \\| ".join(ch)
            rows.append(f"| `{prefix}{key}` | {kind} | {default} | {spec.doc} |")

    walk(SCHEMA, "")
    return "\n".join(rows)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--doc"]:
        print(schema_doc())
    else:
        print("usage: python -m server.manifest --doc")
