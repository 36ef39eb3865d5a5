"""The server audit log (design 12): one JSON line per request, and the reader incident replay uses.

Each line holds the section-12 fields, always present (null when not given)
    ts, session_id, client_uuid, seq_id, episode_id, queue_wait_ms, inference_ms,
    chunk_range, superseded_seqs, outcome
plus `mono_ms` and any extra fields of the record, in that order. The server adds, among others,
`client_mono_ns` (the request header's, echoed: opaque here, the client's join key) and, on an answered
request, `received_mono_ms` / `picked_mono_ms` / `sent_mono_ms` (this server's monotonic clock when the
observation reached it, when its batch was picked to run (one value for a whole batch: `queue_wait_ms` ends
there) and when the chunk went to Zenoh), and `routed_mono_ms` where a router stamped the observation (the
same clock when the first router routed it: Zenoh routers timestamp what they route).

`ts` is the wall-clock time of THIS server (UTC, ISO 8601), for humans joining logs ("robot #217
stuttered at 14:03"); it is never compared with a client clock (design 11, clock iron rule) — the
join with client logs is on (session_id, seq_id). `mono_ms` is this server's monotonic clock, for
ordering and durations within one server run. A record may not supply either: they are stamped here.

Invariant: each `write` is one `os.write` of one complete line on an O_APPEND descriptor, with no
user-space buffer in between, so a SIGKILL loses at most the line being written; a torn line left
by a crash is terminated when the log is reopened, and `read_audit` skips it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)

FIELDS = (
    "session_id",
    "client_uuid",
    "seq_id",
    "episode_id",
    "queue_wait_ms",
    "inference_ms",
    "chunk_range",
    "superseded_seqs",
    "outcome",
)
STAMPED = ("ts", "mono_ms")  # written by AuditLog only


def _json_default(obj: Any) -> Any:
    # numpy scalars and arrays (seq ids, timings) arrive from the worker; anything else is stringified.
    if hasattr(obj, "item") and getattr(obj, "ndim", 1) == 0:
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    if isinstance(obj, Path):
        return str(obj)
    return repr(obj)


def _finite(obj: Any) -> Any:
    """Non-finite floats -> None, recursively, so every line is strict JSON (jq, Loki) and not just Python JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _dumps(line: dict) -> str:
    try:
        return json.dumps(line, default=_json_default, allow_nan=False, separators=(",", ":"))
    except ValueError:  # NaN or inf somewhere: rare, so only then walk the record
        return json.dumps(_finite(json.loads(json.dumps(line, default=_json_default))), separators=(",", ":"))


class AuditLog:
    """Appends audit lines to `path` (created with its parent directories) and/or `stream`.

    With neither, `write` is a no-op (audit disabled). Safe to call from any thread.
    """

    def __init__(self, path: str | Path | None, stream: IO[str] | None = None):
        self.path = Path(path) if path is not None else None
        self.stream = stream
        self.write_errors = 0
        self._lock = threading.Lock()
        self._closed = False
        self._fd: int | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._terminate_torn_line()

    def _terminate_torn_line(self) -> None:
        # A previous run killed mid-line left no newline; without this the first new line would be glued to it.
        with open(self.path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                os.write(self._fd, b"\n")

    def write(self, record: dict) -> bool:
        """Append one line for `record`. Returns False (and counts `write_errors`) if the OS refused it:
        a full disk must not take down inference, but the failure is logged."""
        for key in STAMPED:
            if key in record:
                raise ValueError(
                    f"audit record may not carry {key!r}: the audit log stamps it with the server's own clock"
                )
        with self._lock:
            if self._closed:
                raise ValueError("AuditLog is closed")
            # Stamped under the lock so lines appear in file order of mono_ms.
            line: dict[str, Any] = {
                "ts": datetime.now(UTC).isoformat(timespec="microseconds"),
                "mono_ms": round(time.monotonic() * 1000.0, 3),
            }
            for key in FIELDS:
                line[key] = record.get(key)
            for key, value in record.items():
                if key not in line:
                    line[key] = value
            text = _dumps(line) + "\n"
            try:
                if self._fd is not None:
                    data = text.encode("utf-8")
                    while data:  # os.write may be partial only on signals or odd filesystems
                        data = data[os.write(self._fd, data) :]
                if self.stream is not None:
                    self.stream.write(text)
                    self.stream.flush()
            except OSError:
                self.write_errors += 1
                if self.write_errors == 1 or self.write_errors % 1000 == 0:
                    log.exception("audit write failed (%d failures so far)", self.write_errors)
                return False
        return True

    def close(self) -> None:
        """Close the file (not the stream, which the caller owns); idempotent."""
        with self._lock:
            self._closed = True
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _as_utc(when: datetime | str | float) -> datetime:
    """A bound for read_audit: datetime (naive = UTC, as the log is), ISO string, or epoch seconds."""
    if isinstance(when, (int, float)):
        return datetime.fromtimestamp(when, UTC)
    if isinstance(when, str):
        when = datetime.fromisoformat(when)
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when


def read_audit(
    path: str | Path,
    start: datetime | str | float | None = None,
    end: datetime | str | float | None = None,
    client_uuid: str | None = None,
) -> list[dict]:
    """Audit records of `path` with `start <= ts < end` and the given `client_uuid`, in file order.

    Lines that are not complete JSON objects (a crash mid-write) are skipped with a warning.
    """
    lo = _as_utc(start) if start is not None else None
    hi = _as_utc(end) if end is not None else None
    out: list[dict] = []
    torn: list[int] = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except ValueError:  # json.JSONDecodeError and UnicodeDecodeError of a torn multi-byte char
                torn.append(lineno)
                continue
            if not isinstance(rec, dict):
                torn.append(lineno)
                continue
            if client_uuid is not None and rec.get("client_uuid") != client_uuid:
                continue
            if lo is not None or hi is not None:
                try:
                    ts = _as_utc(rec["ts"])
                except (KeyError, TypeError, ValueError):
                    torn.append(lineno)
                    continue
                if (lo is not None and ts < lo) or (hi is not None and ts >= hi):
                    continue
            out.append(rec)
    if torn:
        log.warning("%s: skipped %d torn audit line(s) at line(s) %s", path, len(torn), torn[:10])
    return out
