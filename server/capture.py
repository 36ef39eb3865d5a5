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
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import msgpack
import numpy as np

from wire import ActionChunk, Observation, decode_message, unpack_header


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
        rec = {"n": n, "checkpoint_hash": getattr(info, "checkpoint_hash", ""), "model_id": getattr(info, "model_id", ""),
               "requests": [{"header": header.pack(), "observation": observation, "chunk": chunk,
                             "session_id": session.session_id, "client_uuid": session.client_uuid,
                             "rtc_enabled": bool(session.rtc_enabled),
                             "execution_horizon": int(session.execution_horizon)}
                            for session, header, observation, chunk in entries]}
        path = self.dir / f"slot-{n % self.max:06d}.msgpack"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(msgpack.packb(rec, use_bin_type=True))
        os.replace(tmp, path)  # a reader never sees a half-written record


def read_capture(directory: str | os.PathLike) -> list[dict]:
    """The captured batches, oldest first: {"n", "checkpoint_hash", "model_id", "requests": [...]}."""
    recs = []
    for p in sorted(Path(directory).glob("slot-*.msgpack")):
        recs.append(msgpack.unpackb(p.read_bytes(), raw=False))
    recs.sort(key=lambda r: r["n"])
    return recs


def replay(directory: str | os.PathLike, checkpoint: str, device: str = "cpu") -> dict:
    """Re-run every captured request through the same pipeline; report byte-for-byte agreement."""
    from server.policies.checkpoint import load_checkpoint
    from server.runtime import InferItem, ModelRuntime

    batches = read_capture(directory)
    if not batches:
        raise FileNotFoundError(f"no capture files (slot-*.msgpack) in {str(directory)!r}; run the server with "
                                "debug.capture_dir set first")
    loaded = load_checkpoint(checkpoint, device=device)
    hashes = {b["checkpoint_hash"] for b in batches}
    runtime = ModelRuntime(loaded, None)
    report = {"batches": len(batches), "requests": sum(len(b["requests"]) for b in batches), "matched": 0,
              "mismatched": 0, "errors": 0, "first_mismatch": None, "max_abs_diff": 0.0,
              "checkpoint_hash": loaded.checkpoint_hash, "captured_checkpoint_hashes": sorted(hashes),
              "same_checkpoint": hashes == {loaded.checkpoint_hash}}
    for b in batches:
        items, expect = [], []
        for r in b["requests"]:
            obs = decode_message(r["observation"], expect=Observation)
            runtime.execution_horizon = int(r["execution_horizon"])
            items.append(InferItem(runtime.new_pipeline(), obs.state, dict(obs.images), obs.inference_delay_steps,
                                   obs.prefix_model, obs.prefix_robot, rtc=r["rtc_enabled"]))
            expect.append((r, decode_message(r["chunk"], expect=ActionChunk), unpack_header(r["header"])))
        results = runtime.infer(items, emulate=False)
        for (r, chunk, header), res in zip(expect, results):
            if res.error:
                report["errors"] += 1
                continue
            same = (res.chunk_model.tobytes() == np.ascontiguousarray(chunk.chunk_model, np.float32).tobytes()
                    and res.chunk_robot.tobytes() == np.ascontiguousarray(chunk.chunk_robot, np.float32).tobytes())
            diff = (float(np.max(np.abs(res.chunk_robot - chunk.chunk_robot)))
                    if res.chunk_robot.shape == chunk.chunk_robot.shape else float("inf"))
            report["max_abs_diff"] = max(report["max_abs_diff"], diff)
            if same:
                report["matched"] += 1
            else:
                report["mismatched"] += 1
                if report["first_mismatch"] is None:
                    report["first_mismatch"] = {"batch": b["n"], "session_id": r["session_id"], "seq_id": header.seq_id,
                                                "max_abs_diff": diff}
    return report
