"""The edge log: what a robot writes so an incident can be replayed offline (`bench incident`).

    engine.drain_records()      ──┐  every period_s, on its own thread   ┌─► {"kind": "request", ...}
    engine.drain_transitions()  ──┴──────────────────────────────────────┴─► {"kind": "transition", ...}
    first line: {"kind": "robot", ...} (robot type, fps, policy, engine settings)

One JSON object per line; `t` is seconds on this process's monotonic clock (the clock the engine
stamps with). The format is described in docs/scenarios.md ("Incident replay"). Invariant: the
control thread is never touched: draining and writing happen on the writer's thread, and a record
the engine produced before `stop()` returns is in the file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from pathlib import Path
from typing import Any

REQUEST_FIELDS = (
    "t",
    "seq",
    "rtt_ms",
    "queue_wait_ms",
    "inference_ms",
    "network_ms",
    "encode_ms",
    "send_lag_ms",
    "merge_lag_ms",
    "delay_steps",
    "execution_steps",
    "superseded_seqs",
    "outcome",
)


def _finite(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


class EdgeLogWriter:
    def __init__(self, engine, path: str | Path, robot: dict[str, Any] | None = None, period_s: float = 1.0):
        self.engine, self.path, self.period_s = engine, Path(path), float(period_s)
        header = dict(robot or {})
        cfg = getattr(engine, "cfg", None)
        if dataclasses.is_dataclass(cfg) and "engine" not in header:
            header["engine"] = {
                f.name: getattr(cfg, f.name)
                for f in dataclasses.fields(cfg)
                if f.name not in ("tls_key", "tls_cert", "tls_ca", "connect_endpoints")
                and isinstance(getattr(cfg, f.name), (int, float, str, bool))
            }
            header.setdefault("fps", getattr(cfg, "fps", None))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")
        self._write({"kind": "robot", **header})
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _write(self, rec: dict) -> None:
        self._file.write(json.dumps({k: _finite(v) for k, v in rec.items()}) + "\n")

    def flush(self) -> int:
        """Drain the engine into the file; returns the lines written."""
        with self._lock:
            n = 0
            for r in self.engine.drain_records():
                self._write({"kind": "request", **{k: r.get(k) for k in REQUEST_FIELDS if k in r}})
                n += 1
            for t, frm, to, reason in self.engine.drain_transitions():
                self._write(
                    {"kind": "transition", "t": t, "from": str(frm).upper(), "to": str(to).upper(), "reason": reason}
                )
                n += 1
            self._file.flush()
            return n

    def start(self) -> EdgeLogWriter:
        self._thread = threading.Thread(target=self._run, name="edge-log", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.flush()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.flush()
        self._file.close()
