"""Reading a manifest: YAML with line numbers, overrides (`--set a.b=value`, the command-line flags) merged
into the same tree, then validation against the schema (server/manifest/sections.py).

    m.yaml ──► wire.yamlines ──► overrides (flags, --set) ──► pydantic validation ──► Manifest

A value from `--set` or a flag goes through exactly the checks a file value does; the keys it touched
are marked, so an error about them says "(override)" instead of a file line.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from server.manifest.fields import ManifestError, _show
from server.manifest.sections import Manifest, _build
from wire import yamlines
from wire.yamlines import OVERRIDE, LineDict

# ---- YAML with line numbers: wire.yamlines (shared with the scenario language) -------------------------------------


def _parse(text: str, source: str) -> Any:
    try:
        return yamlines.load(text)
    except yamlines.YamlError as exc:
        raise ManifestError(
            source, exc.line or None, "", f"not valid YAML: {exc.problem}; fix it at that line"
        ) from None


# ---- loading and overrides ---------------------------------------------------------------------------------------


def validate_manifest(raw: Mapping[str, Any], source: str) -> Manifest:
    """A manifest given as data (a bench replica's, merged from its scenario): validated as a file would be;
    ManifestError names `source`, the dotted key and the fix."""
    return _build(Manifest, raw, "", None, source)


def load_manifest(path: str | os.PathLike, overrides: list[str] | Mapping[str, Any] | None = None) -> Manifest:
    """Read `path`, apply `overrides` (later wins), validate; raise ManifestError naming file, line, key, fix."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ManifestError(source, None, "", f"cannot read the manifest: {exc.strerror}; check the path") from None
    except UnicodeDecodeError as exc:
        raise ManifestError(
            source,
            None,
            "",
            f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
            "give a YAML manifest saved as UTF-8",
        ) from None
    raw = _parse(text, source)
    if raw is None:
        raise ManifestError(source, None, "", "the manifest is empty; start from examples/manifests/minimal.yaml")
    if not isinstance(raw, Mapping):
        raise ManifestError(source, 1, "", f"the manifest must be a YAML mapping of keys, got {_show(raw)}")
    apply_overrides(raw, overrides, source)
    return _build(Manifest, raw, "", None, source)


def apply_overrides(raw: dict, overrides: list[str] | Mapping[str, Any] | None, source: str = "<override>") -> dict:
    """Apply `--set a.b=value` strings (value read as YAML) or a {dotted.key: value} mapping to `raw`, in order.

    A mapping value merges into an existing mapping; anything else replaces. Touched keys are
    marked as overridden, so errors about them say so instead of naming a file line."""
    if not overrides:
        return raw
    items = list(overrides.items()) if isinstance(overrides, Mapping) else [_split(o) for o in overrides]
    for dotted, value in items:
        parts = str(dotted).split(".")
        if not all(parts):
            raise ManifestError(source, OVERRIDE, str(dotted), "is not a dotted key like scheduling.max_batch")
        cur = raw
        for i, p in enumerate(parts[:-1]):
            nxt = cur.get(p)
            if nxt is None:
                nxt = LineDict()
                _set(cur, p, nxt)
            elif not isinstance(nxt, dict):
                raise ManifestError(
                    source,
                    OVERRIDE,
                    ".".join(parts[: i + 1]),
                    f"is {_show(nxt)}, not a mapping, so {dotted} cannot be set; override "
                    f"{'.'.join(parts[: i + 1])} itself",
                )
            cur = nxt
        _merge(cur, parts[-1], value)
    return raw


def _set(m: dict, key: str, value: Any) -> None:
    m[key] = value
    if isinstance(m, LineDict):
        m.key_lines[key] = OVERRIDE


def _merge(m: dict, key: str, value: Any) -> None:
    old = m.get(key)
    if isinstance(value, Mapping) and isinstance(old, dict):
        for k, v in value.items():
            _merge(old, k, v)
    else:
        _set(m, key, dict(value) if isinstance(value, Mapping) else value)


def _split(text: str) -> tuple[str, Any]:
    key, sep, value = str(text).partition("=")
    if not sep or not key.strip():
        raise ManifestError("--set", None, "", f"{text!r} is not KEY=VALUE (e.g. scheduling.max_batch=8)")
    if not value.strip():
        return key.strip(), None
    try:
        return key.strip(), yaml.safe_load(value)
    except yaml.YAMLError:
        return key.strip(), value


# ---- command-line flags ------------------------------------------------------------------------------------------

# (flag, dotted key, argparse type, metavar, help): single common fields; `--set` reaches everything else.
_FLAGS: list[tuple[str, str, Callable, str, str]] = [
    ("--model-path", "model.repo_or_path", str, "DIR", "local checkpoint directory"),
    ("--model-id", "model_id", str, "ID", "model id in the keys"),
    ("--replica-id", "replica_id", str, "ID", "replica id in the keys"),
    ("--max-sessions", "max_sessions", int, "N", "session capacity"),
    ("--health-port", "health_port", int, "PORT", "health/metrics port (0 = any, -1 = off)"),
    ("--serving-mode", "serving_mode", str, "MODE", "shared or exclusive"),
    ("--scheduler", "scheduling.strategy", str, "NAME", "scheduler strategy"),
    ("--max-batch", "scheduling.max_batch", int, "N", "sessions per forward pass"),
    ("--emulated-latency-ms", "emulated_latency", float, "MS", "emulated accelerator ms per forward pass (fixed)"),
    ("--audit-path", "audit_path", str, "FILE", "JSON-lines audit log"),
    ("--capture-dir", "debug.capture_dir", str, "DIR", "debug capture directory"),
]


def _dest(key: str) -> str:
    return "ov_" + key.replace(".", "__")


def add_cli_arguments(ap: argparse.ArgumentParser) -> None:
    """Add the override flags (a group) to `ap`; read them back with `overrides_from_args`."""
    g = ap.add_argument_group("manifest overrides (checked like the file; the file, then flags, then --set)")
    for flag, key, typ, metavar, help_ in _FLAGS:
        g.add_argument(flag, dest=_dest(key), type=typ, default=None, metavar=metavar, help=f"{help_} ({key})")
    g.add_argument(
        "--connect",
        dest=_dest("zenoh.connect_endpoints"),
        action="append",
        default=None,
        metavar="ENDPOINT",
        help="router endpoint, repeatable; replaces zenoh.connect_endpoints",
    )
    g.add_argument(
        "--set",
        dest="ov_set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any manifest key, value read as YAML, e.g. --set drain.timeout_s=5",
    )


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """{dotted.key: value} from the flags `add_cli_arguments` added; `--set` entries come last and win."""
    out: dict[str, Any] = {}
    for _flag, key, _typ, _metavar, _help in _FLAGS:
        v = getattr(args, _dest(key), None)
        if v is not None:
            out[key] = v
    connect = getattr(args, _dest("zenoh.connect_endpoints"), None)
    if connect:
        out["zenoh.connect_endpoints"] = list(connect)
    for text in getattr(args, "ov_set", None) or []:
        k, v = _split(text)
        out.pop(k, None)  # re-insert so dict order keeps "--set last"
        out[k] = v
    return out
