"""The manifest's value checks, keyed by the word a checked field type names (server/manifest/fields.py):
checkpoint directories, files, output paths, key chunks, endpoints, torch devices.

Each check is `check(value, fail)` and calls `fail(message)` with what is wrong and what to do.
`device_problem` is the device rule for other callers (`policy-server replay --device`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

from wire.errors import WireError
from wire.keys import sanitize, sanitize_root
from wire.transport import endpoint_problem

_DEVICE_RE = re.compile(r"^(cpu|cuda|cuda:\d+)$")


def _check_checkpoint_dir(v: str, fail) -> None:
    if not v:
        fail("must be a non-empty path to a local checkpoint directory")
    if os.path.isdir(v):
        return
    if os.path.exists(v):
        fail(f"{v!r} is a file; give the checkpoint directory that holds config.json, model.safetensors, stats.json")
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", v) and not v.startswith("."):
        fail(
            f"{v!r} is not a local directory. Weights load only from local paths: download it first "
            f"(`huggingface-cli download {v} --local-dir checkpoints/{v.split('/')[-1]}`) and give that path"
        )
    fail(f"directory {v!r} does not exist (relative paths start at {os.getcwd()}); give a local checkpoint directory")


def _check_file(v: str, fail) -> None:
    if not os.path.isfile(v):
        fail(f"file {v!r} does not exist; check the path (relative paths start at {os.getcwd()})")


def _check_not_file(v: str, fail) -> None:
    if os.path.isfile(v):
        fail(f"{v!r} is a file; give a directory (created if missing)")


def _check_not_dir(v: str, fail) -> None:
    if os.path.isdir(v):
        fail(f"{v!r} is a directory; give a file path (created if missing)")


def _check_key_chunk(v: str, fail) -> None:
    try:
        sanitize(v, "value")
    except WireError as exc:
        fail(f"{str(exc).split('] ', 1)[-1]}; rename it")


def _check_key_root(v: str, fail) -> None:
    try:
        sanitize_root(v)
    except WireError as exc:
        fail(f"{str(exc).split('] ', 1)[-1]}; e.g. @fleet")


def _check_endpoint(v: str, fail) -> None:
    why = endpoint_problem(v)  # the edge's config checks its endpoints with the same rule
    if why:
        fail(why)


def _check_listen_endpoint(v: str, fail) -> None:
    why = endpoint_problem(v, listen=True)
    if why:
        fail(why)


def _cuda_device_count() -> int | None:
    """CUDA devices torch sees; None when torch is not installed (a seam for tests)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _check_device(v: str, fail) -> None:
    if not _DEVICE_RE.match(v):
        fail(f"{v!r} is not a device; use cpu, cuda or cuda:N")
    if v == "cpu":
        return
    n = _cuda_device_count()
    if n is None:
        fail("torch is not installed; `pip install fleet-inference[server]` or use device: cpu")
    if n == 0:
        fail(
            f"{v!r} but this torch has no CUDA device (build or driver); use device: cpu, "
            "or install a CUDA build of torch on a GPU host"
        )
    idx = int(v.split(":")[1]) if ":" in v else 0
    if idx >= n:
        fail(f"{v!r} but torch sees {n} CUDA device(s); use cuda:0..cuda:{n - 1} (or CUDA_VISIBLE_DEVICES)")


def device_problem(device: str) -> str | None:
    """Why a model cannot run on `device` on this host (the manifest's `device` rule), or None."""
    problems: list[str] = []

    class _Refused(Exception):
        pass

    def fail(message: str) -> None:
        problems.append(message)
        raise _Refused

    try:
        _check_device(device, fail)
    except _Refused:
        pass
    return problems[0] if problems else None


_CHECKS: dict[str, Callable[[str, Callable[[str], None]], None]] = {
    "checkpoint_dir": _check_checkpoint_dir,
    "file": _check_file,
    "not_file": _check_not_file,
    "not_dir": _check_not_dir,
    "key_chunk": _check_key_chunk,
    "key_root": _check_key_root,
    "endpoint": _check_endpoint,
    "listen_endpoint": _check_listen_endpoint,
    "device": _check_device,
}


def _is_chunk(s: str) -> bool:
    try:
        sanitize(s)
        return True
    except WireError:
        return False


def _checkpoint_meta(directory: str) -> dict:
    """config.json of the checkpoint when it reads as JSON, else {} (loading it is the server's job)."""
    try:
        meta = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}
