"""The runner's per-second samples (CPU/memory per process, replicas' scraped gauges) held as columns.

A run samples its processes once a second for its whole length; as a list of dicts every sample cost
~2.5 KB (nested dicts of a few names each), ~200 MB for a day-long soak. `SampleLog` keeps one
`array('d')` per key path (`("rss_mb", "router")`), 8 bytes a value, and hands the rows back as the
same dicts when iterated, so its readers (figures, report, parquet writers) do not change.

Invariants: rows are flat or one level nested mappings of numbers, bools and strings; a key absent from
a row (or None, or a float NaN) is absent when the row is read back; an int or a str comes back as it
went in (ints are exact up to 2**53; strings are interned per key path). Appends and reads may come
from different threads.
"""

from __future__ import annotations

import math
import threading
from array import array
from collections.abc import Iterator, Mapping
from typing import Any

_NAN = math.nan
Path = tuple[str, ...]


class SampleLog:
    """Append-only rows of (one-level nested) dicts of numbers and strings, stored column by column."""

    def __init__(self) -> None:
        self._n = 0
        self._cols: dict[Path, array] = {}
        self._kinds: dict[Path, type] = {}  # the type a column's values go back as: float, int, bool or str
        self._strings: dict[Path, list[str]] = {}
        self._codes: dict[Path, dict[str, int]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def append(self, row: Mapping[str, Any]) -> None:
        flat = dict(_flatten(row))
        with self._lock:
            for path, value in flat.items():
                col = self._cols.get(path)
                if col is None:
                    col = self._cols[path] = array("d", [_NAN]) * self._n
                    self._kinds[path] = bool if isinstance(value, bool) else type(value)
                col.append(self._encode(path, value))
            for path, col in self._cols.items():
                if path not in flat:
                    col.append(_NAN)
            self._n += 1

    def _encode(self, path: Path, value: Any) -> float:
        if isinstance(value, str):
            codes = self._codes.setdefault(path, {})
            code = codes.get(value)
            if code is None:
                code = codes[value] = len(codes)
                self._strings.setdefault(path, []).append(value)
            return float(code)
        return float(value)

    def _decode(self, path: Path, x: float) -> Any:
        kind = self._kinds[path]
        if kind is str:
            return self._strings[path][int(x)]
        return kind(x) if kind is not float else x

    def __getitem__(self, i: int) -> dict:
        with self._lock:
            n = self._n
            if not -n <= i < n:
                raise IndexError(f"sample {i} of {n}")
            return self._row(i % n, list(self._cols.items()))

    def __iter__(self) -> Iterator[dict]:
        with self._lock:  # the rows present now; a sample appended meanwhile is read next time
            n, cols = self._n, list(self._cols.items())
        for i in range(n):
            yield self._row(i, cols)

    def _row(self, i: int, cols: list[tuple[Path, array]]) -> dict:
        out: dict[str, Any] = {}
        for path, col in cols:
            x = col[i]
            if x != x:  # NaN: absent from this row
                continue
            value = self._decode(path, x)
            if len(path) == 1:
                out[path[0]] = value
            else:
                out.setdefault(path[0], {})[path[1]] = value
        return out

    def column(self, *path: str) -> list:
        """One key path's values over all rows, None where a row lacks it (`column("rss_mb", "router")`)."""
        with self._lock:
            n, col = self._n, self._cols.get(path)
        if col is None:
            return [None] * n
        return [None if x != x else self._decode(path, x) for x in col[:n]]

    def keys(self, key: str) -> list[str]:
        """The names ever seen under a nested key (`keys("rss_mb")`: every process sampled), in first-seen order."""
        with self._lock:
            return [p[1] for p in self._cols if len(p) == 2 and p[0] == key]

    def nbytes(self) -> int:
        """The columns' payload in bytes (the figure a soak's runner memory follows)."""
        return sum(col.itemsize * len(col) for col in self._cols.values())


def _flatten(row: Mapping[str, Any]) -> Iterator[tuple[Path, Any]]:
    for key, value in row.items():
        if isinstance(value, Mapping):
            for sub, v in value.items():
                if _present(v):
                    yield (key, sub), v
        elif _present(value):
            yield (key,), value


def _present(v: Any) -> bool:
    if v is None:
        return False
    if isinstance(v, float) and math.isnan(v):
        return False
    if not isinstance(v, (int, float, str)):
        raise TypeError(f"SampleLog holds numbers and strings, not {type(v).__name__} ({v!r})")
    return True
