"""The servers' audit logs (server/audit.py: one JSON line per request) as one Arrow table: what the report
reads for the hop split, fidelity, checkpoints, attacks and denials, and writes as server_requests.parquet.

    audit-r0.jsonl ─┐ line by line, BATCH_ROWS lines to Python lists,   ┌─> Run.collect: hop_split, fidelity,
    audit-r1.jsonl ─┼─> each batch to Arrow arrays at once (+ replica, ─┼─> checkpoints, attacks, denials
    ...             ┘   its clock moved onto the runner's)               └─> server_requests.parquet

Only one batch of lines is ever Python objects: a dict per line, held for the whole report, cost the runner
3.2 KB a request, these columns 0.5 KB (benchmarks/report_memory.py; numpy arrays would hold every string as a
Python object again, and the parquet file is written from this table as it is). What the list of dicts this
replaced gave, it still gives:
- a line that is not a JSON object (torn by a crash) is skipped; a key a line lacks is null in its row;
- a list or dict value is its JSON text (`json.dumps`), as in the log;
- every row has `replica` (its replica's id); a replica on another clock has `mono_ms`, `received_mono_ms`,
  `routed_mono_ms`, `picked_mono_ms` and `sent_mono_ms` moved onto the runner's clock (minus its offset) and
  `clock_uncertainty_ms` (null on the rows of replicas on the runner's clock), so every reader compares like
  with like;
- columns: the first row's keys in its order, then every other key sorted; a column's type is the one Arrow
  infers from all its values (ints and floats: float). Values no one Arrow type holds (a string beside a
  number) become their JSON text; the list of dicts could not be written at all then.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

BATCH_ROWS = 8192  # lines held as Python objects at once
SHIFTED = (
    "mono_ms",
    "received_mono_ms",
    "routed_mono_ms",
    "picked_mono_ms",
    "sent_mono_ms",
)  # a replica's monotonic stamps (server/audit.py)


class AuditTable:
    """Audit logs of any number of replicas, added one by one; `table()` is all their lines, in the order added."""

    def __init__(self):
        self.parts: list[tuple[int, dict[str, pa.Array]]] = []  # (rows, column -> array) per batch
        self.first_keys: list[str] | None = None  # the first row's keys, in order: the table's first columns

    def add(self, lines: Iterable[str], replica: str, clock=None) -> int:
        """Parse one replica's lines. `clock`: its bench.fleet.clock.ClockOffset (None or same_clock: the
        runner's). Returns the rows added."""
        shift = clock is not None and not clock.same_clock
        added = 0
        cols: dict[str, list] = {}
        n = 0
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:  # a torn line
                continue
            if not isinstance(rec, dict):
                continue
            if self.first_keys is None:
                self.first_keys = [
                    *rec,
                    *(k for k in ("replica",) if k not in rec),
                    *(k for k in ("clock_uncertainty_ms",) if shift and k not in rec),
                ]
            for k, v in rec.items():
                col = cols.get(k)
                if col is None:
                    col = cols[k] = [None] * n
                col.append(json.dumps(v) if isinstance(v, (list, dict)) else v)
            n += 1
            if len(rec) != len(cols):  # this line lacks a key an earlier one had
                for col in cols.values():
                    if len(col) < n:
                        col.append(None)
            if n == BATCH_ROWS:
                self._flush(cols, n, replica, clock if shift else None)
                added, cols, n = added + n, {}, 0
        if n:
            self._flush(cols, n, replica, clock if shift else None)
            added += n
        return added

    def _flush(self, cols: dict[str, list], n: int, replica: str, clock) -> None:
        arrays = {k: _array(v) for k, v in cols.items()}
        cols.clear()  # the batch's Python objects go now
        if clock is not None:
            for k in SHIFTED:
                a = arrays.get(k)
                if a is not None and _numeric(a.type):
                    arrays[k] = pc.subtract(
                        a.cast(pa.float64(), safe=False), pa.scalar(clock.offset_s * 1e3, pa.float64())
                    )
            arrays["clock_uncertainty_ms"] = pa.array(np.full(n, clock.uncertainty_s * 1e3))
        arrays["replica"] = pa.array([replica], pa.string()).take(pa.array(np.zeros(n, np.int32)))
        self.parts.append((n, arrays))

    def table(self) -> pa.Table:
        if not self.parts:
            return pa.table({})
        first = self.first_keys or []
        seen = set(first)
        rest = sorted({k for _, arrays in self.parts for k in arrays} - seen)
        columns = {}
        for k in [*first, *rest]:
            chunks = [arrays.get(k) for _, arrays in self.parts]
            typ = _common_type([c.type for c in chunks if c is not None])
            if typ is None:  # no one type: every value as its JSON text
                chunks = [None if c is None else _text(c) for c in chunks]
                typ = pa.string()
            columns[k] = pa.chunked_array(
                [pa.nulls(n, typ) if c is None else c.cast(typ, safe=False) for (n, _), c in zip(self.parts, chunks)],
                typ,
            )
        return pa.table(columns)


def read(logs: Iterable[tuple[str, str, object]]) -> pa.Table:
    """The table of (replica, path, clock) logs, each read line by line (the whole file as one string doubled the
    report's peak); undecodable bytes are replaced."""
    out = AuditTable()
    for replica, path, clock in logs:
        with open(path, errors="replace") as lines:
            out.add(lines, replica, clock)
    return out.table()


def read_lines(lines: Iterable[str], replica: str, clock=None) -> pa.Table:
    """The table of one replica's lines (AuditTable.add)."""
    out = AuditTable()
    out.add(lines, replica, clock)
    return out.table()


# --- reading columns: a column no line had reads as all null ------------------------------------------------


def column(audit: pa.Table, name: str) -> pa.ChunkedArray:
    if name in audit.column_names:
        return audit.column(name)
    return pa.chunked_array([pa.nulls(audit.num_rows)])


def floats(audit: pa.Table, name: str) -> np.ndarray:
    """`name` as float64, NaN where null or not a number."""
    col = column(audit, name)
    if not _numeric(col.type) and not pa.types.is_null(col.type):
        return np.full(audit.num_rows, np.nan)
    return col.cast(pa.float64()).fill_null(np.nan).to_numpy()


def equals(audit: pa.Table, name: str, value: str) -> np.ndarray:
    """Rows whose `name` is the string `value` (null: False)."""
    col = column(audit, name)
    if not (pa.types.is_string(col.type) or pa.types.is_null(col.type)):
        return np.zeros(audit.num_rows, bool)
    return pc.equal(col.cast(pa.string()), value).fill_null(False).to_numpy()


def integers(audit: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """`name` as int64 (a float truncated; 0 where null or not a number), and where it has a number."""
    col = column(audit, name)
    if not _numeric(col.type):
        return np.zeros(audit.num_rows, np.int64), np.zeros(audit.num_rows, bool)
    return col.cast(pa.int64(), safe=False).fill_null(0).to_numpy(), pc.is_valid(col).to_numpy()


def by_stamp(audit: pa.Table, rows: np.ndarray, stamps: np.ndarray, values: list[np.ndarray]) -> list[np.ndarray]:
    """`values` (arrays over the audit's rows) moved onto the requests whose stamp (`stamps`: their header's
    client_mono_ns) an audit row of `rows` (a mask) carries; NaN where none does (of two rows with one stamp, the
    first)."""
    key, has_key = integers(audit, "client_mono_ns")
    idx = np.nonzero(rows & has_key & (key != 0))[0]
    idx = idx[np.argsort(key[idx], kind="stable")]
    keys = key[idx]
    stamps = np.asarray(stamps, dtype=np.int64)
    out = [np.full(stamps.size, np.nan) for _ in values]
    if not keys.size or not stamps.size:
        return out
    at = np.clip(np.searchsorted(keys, stamps), 0, keys.size - 1)
    hit = (keys[at] == stamps) & (stamps > 0)
    for o, v in zip(out, values):
        o[hit] = np.asarray(v)[idx[at[hit]]]
    return out


def at_least(audit: pa.Table, name: str, value: float) -> np.ndarray:
    """Rows whose `name` is a number >= `value` (null or not a number: False)."""
    col = column(audit, name)
    if not _numeric(col.type):
        return np.zeros(audit.num_rows, bool)
    return pc.greater_equal(col, value).fill_null(False).to_numpy()


def rows_with_prefix(audit: pa.Table, name: str, prefix: str) -> list[dict]:
    """The rows whose string `name` starts with `prefix`, as dicts (every column): for the few, such as denials."""
    col = column(audit, name)
    if not pa.types.is_string(col.type):
        return []
    return audit.filter(pc.starts_with(col, prefix).fill_null(False)).to_pylist()


def checkpoints_by_session(audit: pa.Table) -> dict[str, str]:
    """session_id -> checkpoint_hash over the rows that have both (a later row wins), read a batch at a time."""
    sid, ckpt = column(audit, "session_id"), column(audit, "checkpoint_hash")
    if not (pa.types.is_string(sid.type) and pa.types.is_string(ckpt.type)):
        return {}
    both = pc.and_(pc.greater(pc.utf8_length(sid), 0), pc.greater(pc.utf8_length(ckpt), 0)).fill_null(False)
    out: dict[str, str] = {}
    for b in pa.table({"s": sid, "c": ckpt}).filter(both).to_batches(max_chunksize=65536):
        out.update(zip(b.column(0).to_pylist(), b.column(1).to_pylist()))
    return out


def strings(audit: pa.Table, name: str, null: str = "") -> np.ndarray:
    """`name` as a numpy array of str (`null` where null)."""
    return np.asarray(column(audit, name).cast(pa.string()).fill_null(null).to_numpy(zero_copy_only=False), dtype=str)


# --- helpers -------------------------------------------------------------------------------------------------


def _numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _array(values: list) -> pa.Array:
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # mixed kinds, or an int past int64
        return pa.array([v if v is None or isinstance(v, str) else json.dumps(v) for v in values], pa.string())


def _common_type(types: list[pa.DataType]) -> pa.DataType | None:
    """The type Arrow infers for these arrays' values together (null: none given, or all null); None: no one."""
    kinds = set(t for t in types if not pa.types.is_null(t))
    if not kinds:
        return pa.null()
    if len(kinds) == 1:
        return kinds.pop()
    if all(_numeric(t) for t in kinds):
        return pa.float64()
    return None


def _text(a: pa.Array) -> pa.Array:
    if pa.types.is_string(a.type):
        return a
    return pa.array([v if v is None else json.dumps(v) for v in a.to_pylist()], pa.string())
