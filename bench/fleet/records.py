"""Columnar record buffers: hot loops append rows into numpy chunks, a writer thread persists them.

    loop thread ── append(row) ──► current chunk (numpy columns) ──full or flush()──► queue
                                                                                      │
    writer thread ◄───────────────────────────────────────────────────────────────────┘
        └─► pyarrow RecordBatch ──► Arrow IPC stream file (records/<kind>.<shard>.arrow)

Invariant: appending never blocks on I/O and never drops a row: a full chunk is handed off and a
fresh one allocated; `close()` writes every row appended before it. A file cut short by a crash
is still readable up to its last complete batch (`read_stream`).

The `SCHEMAS` table names every column of every record kind; the same names appear in the run's
parquet files and in docs/bench.md.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import numpy as np

# kind -> column -> numpy dtype ("str" columns are Python objects, "f32list" are float32 vectors)
SCHEMAS: dict[str, dict[str, str]] = {
    "ticks": {
        "robot": "int32", "t": "float64", "lateness_ms": "float32", "host_delay_ms": "float32",
        "engine_ms": "float32", "tick_class": "int8", "state_digest": "uint32", "seq": "int64",
        "session_id": "str", "episode_id": "int32", "chunk_index": "int32", "action_age_s": "float32",
        "source": "str", "is_none": "bool", "engine_state": "str", "robot_episode": "int32",
        "action": "f32list",
    },
    "requests": {
        "robot": "int32", "t": "float64", "seq": "int64", "rtt_ms": "float32", "queue_wait_ms": "float32",
        "inference_ms": "float32", "network_ms": "float32", "encode_ms": "float32", "send_lag_ms": "float32",
        "merge_lag_ms": "float32", "delay_steps": "int32",
        "execution_steps": "int32", "steps_remaining": "int32", "superseded": "int32", "outcome": "str",
        "sent_ns": "int64", "downlink_from_router_ms": "float32",
    },
    "transitions": {"robot": "int32", "t": "float64", "from_state": "str", "to_state": "str", "reason": "str"},
    "episodes": {"robot": "int32", "t": "float64", "robot_episode": "int32", "success": "bool", "length_s": "float32"},
    "loop": {"slot": "int32", "t": "float64", "robots": "int32", "wall_ms": "float32", "cpu_ms": "float32",
             "budget_ms": "float32", "overrun": "bool", "skipped_ticks": "int32", "shard": "int32"},
}


class ColumnBuffer:
    """Rows of one record kind, appended by one thread, persisted by a `RecordWriter`."""

    def __init__(self, kind: str, writer: "RecordWriter", chunk_rows: int = 16384):
        self.kind = kind
        self.schema = SCHEMAS[kind]
        self.writer = writer
        self.chunk_rows = chunk_rows
        self._new_chunk()
        self.total = 0

    def _new_chunk(self) -> None:
        self.cols = {name: ([None] * self.chunk_rows if dt in ("str", "f32list") else np.zeros(self.chunk_rows, dtype=dt))
                     for name, dt in self.schema.items()}
        self.n = 0

    def append(self, **row) -> None:
        i = self.n
        cols = self.cols
        for name, value in row.items():
            cols[name][i] = value
        self.n = i + 1
        self.total += 1
        if self.n >= self.chunk_rows:
            self.flush()

    def flush(self) -> None:
        if self.n:
            cols, n = self.cols, self.n
            self._new_chunk()
            self.writer.put(self.kind, cols, n)


class RecordWriter:
    """One writer thread per process; one Arrow IPC stream file per record kind."""

    def __init__(self, directory: str | Path, tag: str):
        import pyarrow  # noqa: F401 - imported here, not on first write: a first import holds the GIL
        import pyarrow.ipc  # noqa: F401   for ~100 ms and would stall the control loop mid-run

        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.tag = tag
        self._q: queue.Queue = queue.Queue()
        self._writers: dict[str, object] = {}
        self._sinks: dict[str, object] = {}
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name=f"records-{tag}", daemon=True)
        self._thread.start()

    def buffer(self, kind: str, chunk_rows: int = 16384) -> ColumnBuffer:
        return ColumnBuffer(kind, self, chunk_rows)

    def put(self, kind: str, cols: dict, n: int) -> None:
        self._q.put((kind, cols, n))

    def path(self, kind: str) -> Path:
        return self.directory / f"{kind}.{self.tag}.arrow"

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                break
            try:
                self._write(*item)
            except Exception as exc:  # a bad batch must not kill the writer: later ones still count
                self.errors.append(f"{item[0]}: {exc!r}")
        for w in self._writers.values():
            w.close()
        for s in self._sinks.values():
            s.close()

    def _write(self, kind: str, cols: dict, n: int) -> None:
        import pyarrow as pa

        batch = to_record_batch(kind, cols, n)
        if kind not in self._writers:
            sink = pa.OSFile(str(self.path(kind)), "wb")
            self._sinks[kind] = sink
            self._writers[kind] = pa.ipc.new_stream(sink, batch.schema)
        self._writers[kind].write_batch(batch)
        self._sinks[kind].flush()

    def close(self, timeout_s: float = 30.0) -> None:
        self._q.put(None)
        self._thread.join(timeout_s)


def arrow_schema(kind: str):
    import pyarrow as pa

    types = {"str": pa.string(), "f32list": pa.list_(pa.float32()), "bool": pa.bool_()}
    return pa.schema([(name, types.get(dt) or pa.from_numpy_dtype(np.dtype(dt))) for name, dt in SCHEMAS[kind].items()])


def to_record_batch(kind: str, cols: dict, n: int):
    import pyarrow as pa

    schema = arrow_schema(kind)
    arrays = []
    for f in schema:
        dt = SCHEMAS[kind][f.name]
        col = cols[f.name]
        if dt == "str":
            arrays.append(pa.array(col[:n], type=pa.string()))
        elif dt == "f32list":
            arrays.append(pa.array([None if v is None else np.asarray(v, np.float32) for v in col[:n]],
                                   type=pa.list_(pa.float32())))
        else:
            arrays.append(pa.array(col[:n], type=f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def read_stream(path: str | Path):
    """All complete batches of an IPC stream file as a Table (a truncated tail is ignored)."""
    import pyarrow as pa

    batches = []
    try:
        with pa.OSFile(str(path), "rb") as f:
            reader = pa.ipc.open_stream(f)
            while True:
                try:
                    batches.append(reader.read_next_batch())
                except StopIteration:
                    break
                except (pa.ArrowInvalid, OSError):
                    break  # torn write at a crash: keep what is complete
            schema = reader.schema
    except (pa.ArrowInvalid, OSError):
        return None
    return pa.Table.from_batches(batches, schema=schema)


def collect(directory: str | Path, kind: str):
    """Concatenate every `<kind>.*.arrow` in `directory` into one Table (an empty one if none)."""
    import pyarrow as pa

    tables = [t for t in (read_stream(p) for p in sorted(Path(directory).glob(f"{kind}.*.arrow"))) if t is not None]
    if not tables:
        return arrow_schema(kind).empty_table()
    return pa.concat_tables(tables)
