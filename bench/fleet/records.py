"""Columnar record buffers: hot loops append rows into numpy chunks, a writer thread persists them.

    loop thread ── append(row) ──► current chunk (numpy columns) ──full or flush()──► queue
                                                                                      │
    writer thread ◄───────────────────────────────────────────────────────────────────┘
        └─► pyarrow RecordBatch ──► Arrow IPC stream file (records/<kind>.<shard>.arrow)

Invariant: appending never blocks on I/O and never drops a row: a full chunk is handed off and a
fresh one allocated; `close()` writes every row appended before it. A file cut short by a crash
is still readable up to its last complete batch (`read_stream`).

The report phase reads them back with `collect` (the files joined as written) or, for the robot-keyed kinds,
`collect_sorted` (by robot, then t, without holding the unsorted table beside the sorted one).

The `SCHEMAS` table names every column of every record kind; the same names appear in the run's
parquet files and in docs/bench.md.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import numpy as np

# kind -> column -> numpy dtype ("str" and "bytes" columns are Python objects, "f32list" are float32 vectors)
SCHEMAS: dict[str, dict[str, str]] = {
    "ticks": {
        "robot": "int32",
        "t": "float64",
        "lateness_ms": "float32",
        "host_delay_ms": "float32",
        "engine_ms": "float32",
        "tick_class": "int8",
        "state_digest": "uint32",
        "seq": "int64",
        "session_id": "str",
        "episode_id": "int32",
        "chunk_index": "int32",
        "action_age_s": "float32",
        "source": "str",
        "is_none": "bool",
        "engine_state": "str",
        "robot_episode": "int32",
        "action": "f32list",
    },
    "requests": {
        "robot": "int32",
        "t": "float64",
        "seq": "int64",
        "rtt_ms": "float32",
        "queue_wait_ms": "float32",
        "inference_ms": "float32",
        "network_ms": "float32",
        "encode_ms": "float32",
        "send_lag_ms": "float32",
        "merge_lag_ms": "float32",
        "delay_steps": "int32",
        "execution_steps": "int32",
        "steps_remaining": "int32",
        "superseded_seqs": "int32",
        "outcome": "str",
        "sent_ns": "int64",
        "downlink_from_router_ms": "float32",
    },
    "transitions": {"robot": "int32", "t": "float64", "from_state": "str", "to_state": "str", "reason": "str"},
    "episodes": {"robot": "int32", "t": "float64", "robot_episode": "int32", "success": "bool", "length_s": "float32"},
    "loop": {
        "slot": "int32",
        "t": "float64",
        "robots": "int32",
        "wall_ms": "float32",
        "cpu_ms": "float32",
        "budget_ms": "float32",
        "overrun": "bool",
        "skipped_ticks": "int32",
        "shard": "int32",
    },
    # Recorded only when the run records a dataset (`record.dataset`, bench.run.dataset): one row per tick,
    # the state the robot observed and the command it then executed (its engine's action clipped, or its hold)
    "observations": {
        "robot": "int32",
        "t": "float64",
        "robot_episode": "int32",
        "state": "f32list",
        "command": "f32list",
    },
    # ... and one row per tick and camera (`record.cameras`): the frame the engine was given, raw HxWx3 uint8
    "frames": {
        "robot": "int32",
        "t": "float64",
        "camera": "str",
        "height": "int32",
        "width": "int32",
        "pixels": "bytes",
    },
}
# kinds a run writes only when something recorded them (no empty parquet file in every run)
OPTIONAL_KINDS = ("observations", "frames")


class ColumnBuffer:
    """Rows of one record kind, appended by one thread, persisted by a `RecordWriter`."""

    def __init__(self, kind: str, writer: RecordWriter, chunk_rows: int = 16384):
        self.kind = kind
        self.schema = SCHEMAS[kind]
        self.writer = writer
        self.chunk_rows = chunk_rows
        self._new_chunk()
        self.total = 0

    def _new_chunk(self) -> None:
        self.cols = {
            name: (
                [None] * self.chunk_rows if dt in ("str", "bytes", "f32list") else np.zeros(self.chunk_rows, dtype=dt)
            )
            for name, dt in self.schema.items()
        }
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

    def extend_rows(self, rows: list[tuple]) -> None:
        """Many rows at once, each a tuple of every column's value in `SCHEMAS` order (a slot's ticks): each
        column is filled a slice at a time, a third of `append`'s cost a row. Never blocks, never drops a row:
        a chunk that fills is handed off and the rest goes into a fresh one."""
        start, total = 0, len(rows)
        while start < total:
            i = self.n
            take = min(total - start, self.chunk_rows - i)
            part = rows[start : start + take] if start or take < total else rows
            for col, values in zip(self.cols.values(), zip(*part)):
                col[i : i + take] = values
            self.n = i + take
            self.total += take
            start += take
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

    types = {"str": pa.string(), "bytes": pa.binary(), "f32list": pa.list_(pa.float32()), "bool": pa.bool_()}
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
        elif dt == "bytes":
            arrays.append(pa.array(col[:n], type=pa.binary()))
        elif dt == "f32list":
            arrays.append(
                pa.array(
                    [None if v is None else np.asarray(v, np.float32) for v in col[:n]], type=pa.list_(pa.float32())
                )
            )
        else:
            arrays.append(pa.array(col[:n], type=f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# The order the report phase keeps the robot-keyed kinds in (ticks, requests, transitions): a robot's rows together,
# in time. Arrow's sort is stable, so rows with the same robot and t keep the order `collect` reads them in.
ROBOT_ORDER = [("robot", "ascending"), ("t", "ascending")]


def stream_batches(path: str | Path):
    """An IPC stream file read one batch at a time: first its schema, then each complete batch (a torn tail, a
    crash mid-write, ends them). Nothing at all if the file is no stream."""
    import pyarrow as pa

    try:
        with pa.OSFile(str(path), "rb") as f:
            reader = pa.ipc.open_stream(f)
            yield reader.schema
            while True:
                try:
                    yield reader.read_next_batch()
                except StopIteration:
                    return
                except (pa.ArrowInvalid, OSError):
                    return  # torn write at a crash: keep what is complete
    except (pa.ArrowInvalid, OSError):
        return


def read_stream(path: str | Path):
    """All complete batches of an IPC stream file as a Table (a truncated tail is ignored); None if it is no stream."""
    import pyarrow as pa

    items = stream_batches(path)
    schema = next(items, None)
    return None if schema is None else pa.Table.from_batches(list(items), schema=schema)


def stream_paths(directory: str | Path, kind: str) -> list[Path]:
    """The shards' stream files of one kind, in the order `collect` concatenates them."""
    return sorted(Path(directory).glob(f"{kind}.*.arrow"))


def collect(directory: str | Path, kind: str):
    """Concatenate every `<kind>.*.arrow` in `directory` into one Table (an empty one if none)."""
    import pyarrow as pa

    tables = [t for t in (read_stream(p) for p in stream_paths(directory, kind)) if t is not None]
    if not tables:
        return arrow_schema(kind).empty_table()
    return pa.concat_tables(tables)


def collect_sorted(directory: str | Path, kind: str, parts: int = 16):
    """`collect(directory, kind).sort_by(ROBOT_ORDER)`: the same rows, order and schema (one chunk a column, as the
    global sort leaves it), without the whole table held twice (unsorted and sorted).

    A first read counts each robot's rows and each string or list column's items, cuts the robot ids into about
    `parts` ranges of about equal rows and allocates the sorted table's buffers. Then, a range at a time: its rows
    are read out of the stream files, sorted on their own, and copied into the table at their place. The peak is the
    table plus about two ranges. Each range is read in a pass of its own and copied into buffers allocated once,
    because pieces of many ranges allocated interleaved (one read dealing rows out to all ranges, or ranges joined at
    the end) share the allocator's pages, which then stay resident beside the sorted table.

    Identical to the global sort: a range holds every row of its robots, in the order `collect` reads them (files by
    `stream_paths`, then rows), and Arrow's sort is stable, so rows with the same robot and t keep that order; a
    robot in two files (no shard writes another's robots today; nothing here relies on it) sorts like any other."""
    import numpy as np
    import pyarrow as pa

    paths = stream_paths(directory, kind)
    census = _Census(paths, kind)
    if census.schema is None:
        return arrow_schema(kind).empty_table()
    if census.rows == 0:
        return census.schema.empty_table()
    robot, rows = census.robots()
    part_of = (np.cumsum(rows) - rows) * parts // census.rows  # where a robot's first row falls in the sorted table
    columns = [
        _SortedColumn(field, census.rows, census.nulls[field.name], census.items[field.name]) for field in census.schema
    ]
    pool = pa.default_memory_pool()
    for part in np.unique(part_of):
        lo, hi = robot[part_of == part][[0, -1]]
        ranged = pa.Table.from_batches(list(_rows_of_robots(paths, lo, hi)), schema=census.schema).sort_by(ROBOT_ORDER)
        for column in columns:
            for chunk in ranged.column(column.field.name).chunks:
                column.put(chunk)
        del ranged
        pool.release_unused()  # the range's pages back before the next range's are allocated
    return pa.Table.from_arrays([column.array() for column in columns], schema=census.schema)


def _rows_of_robots(paths: list[Path], lo: int, hi: int):
    """The rows of robots lo..hi (inclusive) in the stream files, in file and row order, batch by batch: a batch all
    theirs as read, else a copy of their rows (a slice would keep the whole batch's memory alive)."""
    import pyarrow as pa

    for path in paths:
        items = stream_batches(path)
        next(items, None)  # the schema
        for batch in items:
            robot = batch.column("robot").to_numpy()
            keep = (robot >= lo) & (robot <= hi)
            if keep.all():
                yield batch
            elif keep.any():
                yield batch.filter(pa.array(keep))


class _Census:
    """What `collect_sorted` must know before it sorts: the stream files' schema, each robot's rows, and per column
    whether it has nulls and how many items its variable-width part holds (a string's bytes, a list's items)."""

    def __init__(self, paths: list[Path], kind: str):
        import numpy as np

        self.schema, self.rows = None, 0
        self.nulls: dict[str, bool] = {}
        self.items: dict[str, int] = {}
        self._ids, self._counts = [np.zeros(0, np.int32)], [np.zeros(0, np.int64)]
        for path in paths:
            batches = stream_batches(path)
            schema = next(batches, None)
            if schema is None:
                continue  # no stream at all: `collect` skips it too
            if self.schema is None:
                self.schema = schema
                self.nulls = dict.fromkeys(schema.names, False)
                self.items = dict.fromkeys(schema.names, 0)
            elif not schema.equals(self.schema):
                raise ValueError(
                    f"{path}: its {kind} columns differ from the other stream files' ({schema} vs {self.schema})"
                )
            for batch in batches:
                self.add(batch)

    def add(self, batch) -> None:
        import numpy as np

        robot, n = np.unique(batch.column("robot").to_numpy(), return_counts=True)
        self._ids.append(robot)
        self._counts.append(n)
        self.rows += batch.num_rows
        for name, col in zip(batch.schema.names, batch.columns):
            self.nulls[name] = self.nulls[name] or col.null_count > 0
            if _layout(col.type) in ("string", "list"):
                offsets = _offsets(col)
                self.items[name] += int(offsets[-1] - offsets[0])

    def robots(self):
        """(robot ids ascending, rows of each)."""
        import numpy as np

        robot, where = np.unique(np.concatenate(self._ids), return_inverse=True)
        return robot, np.bincount(where, weights=np.concatenate(self._counts), minlength=len(robot)).astype(np.int64)


def _view(buffer, dtype):
    """An Arrow buffer as numpy, without a copy (Arrow may leave an empty one out: None)."""
    import numpy as np

    return np.zeros(0, dtype) if buffer is None else np.frombuffer(buffer, dtype)


def _offsets(arr):
    """A string or list array's len + 1 offsets, as numpy (a view of its buffer)."""
    import numpy as np

    if len(arr) == 0:
        return np.zeros(1, np.int32)
    return _view(arr.buffers()[1], np.int32)[arr.offset : arr.offset + len(arr) + 1]


def _layout(type_) -> str | None:
    """How `collect_sorted` copies a column of this type: the layouts `SCHEMAS` uses (None: another)."""
    import pyarrow as pa

    def number(t):
        return pa.types.is_integer(t) or pa.types.is_floating(t)

    if pa.types.is_boolean(type_):
        return "bool"
    if number(type_):
        return "number"
    if pa.types.is_string(type_):
        return "string"
    if pa.types.is_list(type_) and number(type_.value_type):
        return "list"
    return None


class _SortedColumn:
    """One column of `collect_sorted`'s table: its buffers allocated once for all rows, filled range by range, then
    one Arrow array over them. The layouts are those `SCHEMAS` uses: numbers, bools, strings, lists of numbers."""

    def __init__(self, field, rows: int, nulls: bool, items: int):
        import numpy as np
        import pyarrow as pa

        self.field, self.rows, self.at = field, rows, 0
        self.layout = _layout(field.type)
        if self.layout is None:
            raise TypeError(f"collect_sorted: column {field.name!r} is {field.type}, not a layout the records use")
        if self.layout in ("string", "list") and items > np.iinfo(np.int32).max:
            raise ValueError(f"collect_sorted: column {field.name!r} holds {items} items, past 32-bit offsets")
        self.valid = np.ones(rows, bool) if nulls else None
        if self.layout == "bool":
            self.data = np.zeros(rows, bool)
            return
        if self.layout == "number":
            self.buffer = pa.allocate_buffer(rows * field.type.bit_width // 8)
            self.data = np.frombuffer(self.buffer, field.type.to_pandas_dtype())
            return
        self.offsets_buffer = pa.allocate_buffer((rows + 1) * 4)
        self.offsets = np.frombuffer(self.offsets_buffer, np.int32)
        self.offsets[0] = 0
        item = np.dtype(np.uint8 if self.layout == "string" else field.type.value_type.to_pandas_dtype())
        self.buffer = pa.allocate_buffer(items * item.itemsize)
        self.data = np.frombuffer(self.buffer, item)

    def put(self, chunk) -> None:
        """The chunk's rows, after those put before."""
        import numpy as np

        a, n = self.at, len(chunk)
        if n == 0:
            return
        if self.valid is not None and chunk.null_count:
            self.valid[a : a + n] = chunk.is_valid().to_numpy(zero_copy_only=False)
        if self.layout == "bool":
            self.data[a : a + n] = chunk.fill_null(False).to_numpy(zero_copy_only=False)
        elif self.layout == "number":
            self.data[a : a + n] = _view(chunk.buffers()[1], self.data.dtype)[chunk.offset : chunk.offset + n]
        else:
            offsets = _offsets(chunk)
            start = self.offsets[a]
            self.offsets[a + 1 : a + n + 1] = offsets[1:] - offsets[0] + start
            if self.layout == "string":
                values = _view(chunk.buffers()[2], np.uint8)
            else:
                child = chunk.values
                if child.null_count:
                    raise ValueError(f"collect_sorted: column {self.field.name!r} has null list items")
                values = _view(child.buffers()[1], self.data.dtype)[child.offset :]
            self.data[start : start + offsets[-1] - offsets[0]] = values[offsets[0] : offsets[-1]]
        self.at = a + n

    def array(self):
        """The filled column as one Arrow array over these buffers (a copy only of a bool column's bits)."""
        import pyarrow as pa

        if self.at != self.rows:
            raise RuntimeError(f"collect_sorted: column {self.field.name!r} got {self.at} of {self.rows} rows")
        type_, validity, nulls = self.field.type, None, 0
        if self.valid is not None:
            validity, nulls = pa.array(self.valid).buffers()[1], self.rows - int(self.valid.sum())
        if self.layout == "bool":
            return pa.array(self.data, type=type_, mask=None if self.valid is None else ~self.valid)
        if self.layout == "number":
            return pa.Array.from_buffers(type_, self.rows, [validity, self.buffer], null_count=nulls)
        if self.layout == "string":
            return pa.Array.from_buffers(
                type_, self.rows, [validity, self.offsets_buffer, self.buffer], null_count=nulls
            )
        items = pa.Array.from_buffers(type_.value_type, len(self.data), [None, self.buffer])
        return pa.Array.from_buffers(
            type_, self.rows, [validity, self.offsets_buffer], null_count=nulls, children=[items]
        )
