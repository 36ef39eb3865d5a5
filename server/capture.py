"""Bounded debug capture of request/response pairs, and the offline replay that checks them.

    dispatch ──► CaptureWriter.record_batch([(session, header, observation bytes, chunk bytes), ...])
                   └─► <capture_dir>/slot-<k>.msgpack   (one file per forward pass; a ring of the newest
                                                         `capture_max` batches)
    policy-server replay <capture_dir> --checkpoint DIR
                   └─► same batches, same order, fresh per-session pipelines ─► byte-for-byte compare

Each file holds the exact wire bytes the server received and sent, plus what the pipeline needs that
is not on the wire (the session's merge mode and horizon). A file is a whole batch, because a batch
of another size may differ in the last bit (BLAS blocking): replaying each batch as it ran
reproduces a deterministic policy's floats exactly; a stateful policy replays correctly from an
episode start on.

A capture file that is not such a record (another program's file, a truncated copy), or that cannot be
read at all (a directory in its place, a dangling symlink, no permission), and a capture directory that
cannot be listed, are a user error, `CaptureError`, naming the file (and request) and what to do: replay
refuses it before loading the checkpoint. Every read of a capture file or directory is in `read_capture`.
"""

from __future__ import annotations

import fnmatch
import os
import threading
from pathlib import Path

import msgpack
import numpy as np

from wire import ActionChunk, Observation, WireError, decode_message, unpack_header

# what replay reads of each captured request, and the type the writer gave it
REQUEST_FIELDS = {"header": bytes, "observation": bytes, "chunk": bytes, "rtc_enabled": bool, "execution_horizon": int}


class CaptureError(ValueError):
    """A capture directory or file replay cannot read; the message names it and what to do."""


class CaptureWriter:
    def __init__(self, directory: str | os.PathLike, capture_max: int, server=None):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max = max(1, int(capture_max))
        self.server = server
        self._n = 0
        self._lock = threading.Lock()

    def record_batch(self, entries: list[tuple]) -> None:
        """entries: (session, header, observation bytes, chunk bytes) in batch order."""
        if not entries:
            return
        with self._lock:
            n = self._n
            self._n += 1
        info = getattr(self.server, "info", None)
        rec = {
            "n": n,
            "checkpoint_hash": getattr(info, "checkpoint_hash", ""),
            "model_id": getattr(info, "model_id", ""),
            "requests": [
                {
                    "header": header.pack(),
                    "observation": observation,
                    "chunk": chunk,
                    "session_id": session.session_id,
                    "client_uuid": session.client_uuid,
                    "rtc_enabled": bool(session.rtc_enabled),
                    "execution_horizon": int(session.execution_horizon),
                }
                for session, header, observation, chunk in entries
            ],
        }
        path = self.dir / f"slot-{n % self.max:06d}.msgpack"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(msgpack.packb(rec, use_bin_type=True))
        os.replace(tmp, path)  # a reader never sees a half-written record


def read_capture(directory: str | os.PathLike) -> list[dict]:
    """The captured batches, oldest first: {"n", "checkpoint_hash", "model_id", "requests": [...], "file"}."""
    directory = Path(directory)
    try:
        # listdir, not glob: glob reads an unlistable directory as an empty one ("no capture files")
        names = sorted(name for name in os.listdir(directory) if fnmatch.fnmatchcase(name, "slot-*.msgpack"))
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise CaptureError(
            f"capture directory {str(directory)!r} "
            f"{'does not exist' if isinstance(exc, FileNotFoundError) else 'is not a directory'}; "
            "pass the server's debug.capture_dir"
        ) from None
    except OSError as exc:
        raise CaptureError(
            f"capture directory {str(directory)!r}: cannot list it ({exc.strerror or exc}); check the "
            "path and its permissions, or pass the server's debug.capture_dir"
        ) from None
    recs = []
    for p in (directory / name for name in names):
        try:
            data = p.read_bytes()
        except OSError as exc:
            raise CaptureError(
                f"{p}: cannot read this capture file ({_why_unreadable(p, exc)}); remove it or replay another directory"
            ) from None
        try:
            rec = msgpack.unpackb(data, raw=False)
        except (ValueError, msgpack.UnpackException) as exc:  # ExtraData, FormatError, StackError, bad UTF-8
            raise CaptureError(
                f"{p}: not a capture record (msgpack: {exc or type(exc).__name__}); remove it or replay another "
                "directory"
            ) from None
        _check_record(p, rec)
        recs.append({**rec, "file": str(p)})
    recs.sort(key=lambda r: r["n"])
    return recs


def _why_unreadable(path: Path, exc: OSError) -> str:
    if isinstance(exc, IsADirectoryError):
        return "it is a directory"
    if isinstance(exc, FileNotFoundError):
        try:
            return f"a symlink to {os.readlink(path)!r}, which does not exist"
        except OSError:  # not a symlink: it was listed, then removed before it was read
            return "it was removed while replay read the directory"
    return exc.strerror or str(exc)


def _check_record(path: Path, rec) -> None:
    if not (
        isinstance(rec, dict)
        and isinstance(rec.get("n"), int)
        and isinstance(rec.get("checkpoint_hash"), str)
        and isinstance(rec.get("requests"), list)
    ):
        raise CaptureError(
            f"{path}: not a capture record (a map of n, checkpoint_hash and requests, "
            f"got {type(rec).__name__}); remove it or replay another directory"
        )
    for i, r in enumerate(rec["requests"]):
        bad = [k for k, t in REQUEST_FIELDS.items() if not isinstance(r, dict) or not isinstance(r.get(k), t)]
        if bad:
            raise CaptureError(
                f"{path} request {i}: no valid {', '.join(bad)}; not a capture record, remove it or "
                "replay another directory"
            )


def _decode(batch: dict) -> list[tuple]:
    """(request, observation, chunk, header) of each request of a batch, or a CaptureError naming it."""
    out = []
    for i, r in enumerate(batch["requests"]):
        try:
            out.append(
                (
                    r,
                    decode_message(r["observation"], expect=Observation),
                    decode_message(r["chunk"], expect=ActionChunk),
                    unpack_header(r["header"]),
                )
            )
        except WireError as exc:
            raise CaptureError(
                f"{batch['file']} request {i}: {exc}; remove the file or replay another directory"
            ) from None
    return out


def replay(directory: str | os.PathLike, checkpoint: str, device: str = "cpu") -> dict:
    """Re-run every captured request through the same pipeline; report byte-for-byte agreement."""
    from server.policies.checkpoint import load_checkpoint
    from server.runtime import InferItem, ModelRuntime

    batches = read_capture(directory)
    if not batches:
        raise CaptureError(
            f"no capture files (slot-*.msgpack) in {str(directory)!r}; run the server with debug.capture_dir set first"
        )
    decoded = [_decode(b) for b in batches]  # every file checked before the checkpoint loads
    loaded = load_checkpoint(checkpoint, device=device)
    hashes = {b["checkpoint_hash"] for b in batches}
    runtime = ModelRuntime(loaded, None)
    report = {
        "batches": len(batches),
        "requests": sum(len(b["requests"]) for b in batches),
        "matched": 0,
        "mismatched": 0,
        "errors": 0,
        "first_mismatch": None,
        "max_abs_diff": 0.0,
        "checkpoint_hash": loaded.checkpoint_hash,
        "captured_checkpoint_hashes": sorted(hashes),
        "same_checkpoint": hashes == {loaded.checkpoint_hash},
    }
    for b, requests in zip(batches, decoded):
        items, expect = [], []
        for r, obs, chunk, header in requests:
            runtime.execution_horizon = int(r["execution_horizon"])
            items.append(
                InferItem(
                    runtime.new_pipeline(),
                    obs.state,
                    dict(obs.images),
                    obs.inference_delay_steps,
                    obs.prefix_model,
                    obs.prefix_robot,
                    rtc=r["rtc_enabled"],
                )
            )
            expect.append((r, chunk, header))
        results = runtime.infer(items, emulate=False)
        for (r, chunk, header), res in zip(expect, results):
            if res.error:
                report["errors"] += 1
                continue
            same = (
                res.chunk_model.tobytes() == np.ascontiguousarray(chunk.chunk_model, np.float32).tobytes()
                and res.chunk_robot.tobytes() == np.ascontiguousarray(chunk.chunk_robot, np.float32).tobytes()
            )
            diff = (
                float(np.max(np.abs(res.chunk_robot - chunk.chunk_robot)))
                if res.chunk_robot.shape == chunk.chunk_robot.shape
                else float("inf")
            )
            report["max_abs_diff"] = max(report["max_abs_diff"], diff)
            if same:
                report["matched"] += 1
            else:
                report["mismatched"] += 1
                if report["first_mismatch"] is None:
                    report["first_mismatch"] = {
                        "batch": b["n"],
                        "session_id": r.get("session_id"),
                        "seq_id": header.seq_id,
                        "max_abs_diff": diff,
                    }
    return report
