"""SampleLog: the runner's per-second samples as columns must read back exactly as they were appended."""

import math
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.run.samplelog import SampleLog

names = st.sampled_from(["router", "proxy", "server:r0", "shard:0", "runner"])
number = st.one_of(st.integers(-(2**40), 2**40), st.floats(allow_nan=False, allow_infinity=False, width=64))
leaf = st.one_of(number, st.sampled_from(["queue_depth", "load", "r0", "r1"]))
row = st.fixed_dictionaries(
    {"t": st.floats(-10, 1e6, allow_nan=False)},
    optional={
        "host_percent": st.floats(0, 100),
        "speed_probe_ms": st.floats(0, 100),
        "processes": st.dictionaries(names, st.floats(0, 400), max_size=5),
        "fds": st.dictionaries(names, st.integers(0, 10_000), max_size=5),
        "replica": st.sampled_from(["r0", "r1"]),
        "value": leaf,
    },
)


def _typed_pairs(row):
    return {
        k: ({kk: (type(vv), vv) for kk, vv in v.items()} if isinstance(v, dict) else (type(v), v))
        for k, v in row.items()
        if v != {}
    }


@settings(max_examples=200, deadline=None)
@given(st.lists(row, max_size=30))
def test_rows_read_back_as_appended_with_their_types(rows):
    # a key is typed by the first value it saw: keep each key's type fixed across rows, as the runner's are
    seen: dict = {}
    kept = []
    for r in rows:
        flat = {(k, kk): v for k, d in r.items() if isinstance(d, dict) for kk, v in d.items()}
        flat.update({(k,): v for k, v in r.items() if not isinstance(v, dict)})
        if all(seen.setdefault(p, type(v)) is type(v) for p, v in flat.items()):
            kept.append(r)
    log = SampleLog()
    for r in kept:
        log.append(r)
    assert len(log) == len(kept) and bool(log) == bool(kept)
    back = list(log)
    assert [_typed_pairs(b) for b in back] == [_typed_pairs(r) for r in kept]
    if kept:
        assert _typed_pairs(log[-1]) == _typed_pairs(kept[-1]) and _typed_pairs(log[0]) == _typed_pairs(kept[0])


def test_absent_none_and_nan_values_are_left_out_and_columns_fill_with_none():
    log = SampleLog()
    log.append({"t": 0.0, "rss_mb": {"router": 40.0}, "speed_probe_ms": 25.0})
    log.append({"t": 1.0, "rss_mb": {"router": None, "server:r0": 250.5}, "speed_probe_ms": math.nan})
    log.append({"t": 2.0, "rss_mb": {}, "fds": {"router": 12}})
    assert list(log) == [
        {"t": 0.0, "rss_mb": {"router": 40.0}, "speed_probe_ms": 25.0},
        {"t": 1.0, "rss_mb": {"server:r0": 250.5}},
        {"t": 2.0, "fds": {"router": 12}},
    ]
    assert log.keys("rss_mb") == ["router", "server:r0"]
    assert log.column("rss_mb", "server:r0") == [None, 250.5, None]
    assert log.column("fds", "router") == [None, None, 12] and isinstance(log.column("fds", "router")[2], int)
    assert log.column("nothing") == [None, None, None]
    with pytest.raises(IndexError):
        log[3]


def test_a_value_that_is_not_a_number_or_string_is_refused_by_name():
    with pytest.raises(TypeError, match="list"):
        SampleLog().append({"t": 0.0, "processes": [1, 2]})


def test_reading_while_another_thread_appends_sees_whole_rows():
    log = SampleLog()
    done = threading.Event()

    def writer():
        for i in range(3000):  # a new process name every 500 rows: new columns appear while rows are read
            log.append({"t": float(i), "rss_mb": {f"p{i // 500}": float(i)}, "pids": {f"p{i // 500}": i}})
        done.set()

    th = threading.Thread(target=writer)
    th.start()
    reads = 0
    try:
        while not done.is_set() or reads == 0:
            for r in log:
                ((name, rss),) = r["rss_mb"].items()
                assert r["pids"][name] == int(rss) == int(r["t"])
            reads += 1
    finally:
        th.join()
    assert len(log) == 3000 and log[-1]["pids"] == {"p5": 2999}
