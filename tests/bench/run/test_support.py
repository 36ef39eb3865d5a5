"""Small parts of the runner: columnar records, /metrics parsing, CPU split, progress, control channel."""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.fleet import records
from bench.fleet.control import ControlClient, ControlServer
from bench.run.progress import format_status
from bench.run.prom import parse_prometheus
from bench.run.usage import CpuSampler


def test_records_roundtrip_and_torn_tail(tmp_path):
    w = records.RecordWriter(tmp_path, "s0")
    buf = w.buffer("requests", chunk_rows=4)
    for i in range(10):
        buf.append(
            robot=i,
            t=i * 0.1,
            seq=i,
            rtt_ms=10.0 + i,
            queue_wait_ms=1.0,
            inference_ms=5.0,
            network_ms=4.0,
            encode_ms=0.5,
            delay_steps=1,
            superseded_seqs=0,
            outcome="ok",
        )
    buf.flush()
    w.close()
    t = records.collect(tmp_path, "requests")
    assert t.num_rows == 10 and t.column("rtt_ms").to_pylist()[-1] == 19.0
    path = w.path("requests")
    path.write_bytes(path.read_bytes()[:-37])  # a crash mid-write
    assert records.collect(tmp_path, "requests").num_rows in (4, 8)


def test_records_keep_float_vectors_and_strings(tmp_path):
    w = records.RecordWriter(tmp_path, "s1")
    buf = w.buffer("ticks", chunk_rows=8)
    buf.append(
        robot=1, t=0.5, is_none=False, source="chunk", engine_state="STREAMING", action=np.array([0.1, 0.2], np.float32)
    )
    buf.append(robot=1, t=0.6, is_none=True, source="none", engine_state="STALLED", action=None)
    buf.flush()
    w.close()
    t = records.collect(tmp_path, "ticks")
    assert t.column("action").to_pylist()[0] == [np.float32(0.1), np.float32(0.2)]
    assert t.column("action").to_pylist()[1] is None
    assert t.column("engine_state").to_pylist() == ["STREAMING", "STALLED"]


@settings(max_examples=40, deadline=None)
@given(
    chunk_rows=st.integers(1, 9),
    slots=st.lists(st.integers(0, 12), min_size=1, max_size=6),
)
def test_extend_rows_writes_what_appending_each_row_writes(tmp_path_factory, chunk_rows, slots):
    """A slot's ticks at once (the shard's loop) against the same rows one by one: the same table, in order,
    across every chunk boundary, with null actions and strings kept."""
    names = list(records.SCHEMAS["ticks"])
    rows, k = [], 0
    for n in slots:
        slot = []
        for _ in range(n):
            action = None if k % 3 == 0 else np.array([k, -k], np.float32)
            values = {
                **dict.fromkeys(names, 0), "robot": k, "t": k * 0.5, "seq": k, "session_id": f"s{k % 4}",
                "source": "none" if action is None else "chunk", "is_none": action is None,
                "engine_state": "STALLED" if k % 2 else "STREAMING", "action": action, "action_age_s": np.nan,
            }  # fmt: skip
            slot.append(tuple(values[name] for name in names))
            k += 1
        rows.append(slot)
    tables = []
    for how in ("append", "extend_rows"):
        d = tmp_path_factory.mktemp(how)
        w = records.RecordWriter(d, "s0")
        buf = w.buffer("ticks", chunk_rows=chunk_rows)
        for slot in rows:
            if how == "append":
                for row in slot:
                    buf.append(**dict(zip(names, row)))
            else:
                buf.extend_rows(slot)
        buf.flush()
        w.close()
        assert buf.total == k
        tables.append(records.collect(d, "ticks") if k else None)
    if k:
        assert tables[0].num_rows == k
        assert tables[0].to_pylist() == tables[1].to_pylist() or all(
            _same_row(a, b) for a, b in zip(tables[0].to_pylist(), tables[1].to_pylist())
        )


def _same_row(a: dict, b: dict) -> bool:
    """Rows equal, NaN equal to NaN."""
    return all(a[c] == b[c] or (a[c] != a[c] and b[c] != b[c]) for c in a)


def _shard_ticks(directory, tag, rows, chunk_rows=3):
    """Tick records as one shard writes them: (robot, t, seq) rows, each with a digest, a string that is at times
    null, and an action that is null on a None tick."""
    w = records.RecordWriter(directory, tag)
    buf = w.buffer("ticks", chunk_rows=chunk_rows)
    for robot, t, seq in rows:
        none = seq % 4 == 0
        buf.append(
            robot=robot,
            t=t,
            seq=seq,
            state_digest=seq * 2654435761 % 2**32,
            tick_class=seq % 3,
            lateness_ms=seq / 7,
            is_none=none,
            source="none" if none else "chunk",
            session_id=None if seq % 5 == 0 else f"s{seq:0{seq % 9}d}",
            action=None if none else np.arange(seq % 3, dtype=np.float32) + seq,
        )
    buf.flush()
    w.close()
    return w.path("ticks")


def _rows(table):
    """Every column as a list, NaN as a string (NaN != NaN would fail an equal table)."""

    def plain(v):
        if isinstance(v, list):
            return [plain(x) for x in v]
        return "nan" if isinstance(v, float) and v != v else v

    return {name: [plain(v) for v in table.column(name).to_pylist()] for name in table.column_names}


def test_collect_sorted_is_the_global_sort_of_every_shards_ticks(tmp_path):
    import io

    import pyarrow.parquet as pq

    # robots dealt round-robin over three shards (0 3 6 | 1 4 7 | 2 5 8), each shard's rows in time order of its
    # slots, robots interleaved, ties in t; robot 4 also in shard 2's file (a shard never writes another's robots
    # today: collect_sorted must not need that); a torn tail, and a file that is no stream at all
    rng = np.random.default_rng(5)
    seq = itertools.count(1)
    for k in range(3):
        rows = [
            (r, float(slot // 2) * 0.5, next(seq)) for slot in range(40) for r in range(k, 9, 3) if rng.random() < 0.8
        ]
        if k == 2:
            rows = [(4, 1.0, next(seq)), (4, 0.0, next(seq)), (4, float("nan"), next(seq)), (4, 1.0, next(seq))] + rows
        late = rows[len(rows) // 2 :]
        rng.shuffle(late)  # late rows out of time order (an engine's records drained late)
        rows[len(rows) // 2 :] = late
        path = _shard_ticks(tmp_path, f"shard{k}", rows)
    path.write_bytes(path.read_bytes()[:-50])  # shard2 cut mid-batch by a crash
    (tmp_path / "ticks.shard9.arrow").write_bytes(b"")
    whole = records.collect(tmp_path, "ticks")
    assert whole.column("robot").to_pylist() != sorted(whole.column("robot").to_pylist())
    expected = whole.sort_by(records.ROBOT_ORDER)
    robot4 = [(t, s) for r, t, s in zip(*(whole.column(c).to_pylist() for c in ("robot", "t", "seq"))) if r == 4]
    assert sum(t != t for t, _ in robot4) == 1 and len({s for _, s in robot4}) == len(robot4) > 40
    for parts in (1, 2, 3, 16, 100):
        got = records.collect_sorted(tmp_path, "ticks", parts=parts)
        assert got.schema.equals(expected.schema) and _rows(got) == _rows(expected), parts
        assert {c.num_chunks for c in got.columns} == {1}  # as the global sort leaves it: figures read it in place
        a, b = io.BytesIO(), io.BytesIO()
        pq.write_table(expected, a)
        pq.write_table(got, b)
        assert a.getvalue() == b.getvalue(), parts
    # robot 4's ties keep the order collect reads them in: shard 1's file before shard 2's, then row order
    got4 = [(t, s) for r, t, s in zip(*(got.column(c).to_pylist() for c in ("robot", "t", "seq"))) if r == 4]
    by_t = sorted((t, i) for i, (t, _) in enumerate(robot4) if t == t)
    assert [s for t, s in got4 if t == t] == [robot4[i][1] for _, i in by_t]
    assert got4[-1][0] != got4[-1][0]  # NaN last, as Arrow sorts it


def test_collect_sorted_of_no_files_and_of_files_without_rows(tmp_path):
    assert records.collect_sorted(tmp_path, "requests").schema.equals(records.arrow_schema("requests"))
    records.RecordWriter(tmp_path, "s0").close()  # a shard that wrote nothing: no file
    _shard_ticks(tmp_path, "s1", [])
    got = records.collect_sorted(tmp_path, "ticks")
    assert got.num_rows == 0 and got.schema.equals(records.arrow_schema("ticks"))


def test_collect_sorted_refuses_stream_files_that_disagree_on_columns(tmp_path):
    _shard_ticks(tmp_path, "s0", [(0, 0.0, 1)])
    other = pa.table({"robot": pa.array([1], pa.int32()), "t": [0.5]})
    with pa.OSFile(str(tmp_path / "ticks.s1.arrow"), "wb") as f, pa.ipc.new_stream(f, other.schema) as w:
        w.write_table(other)
    with pytest.raises(ValueError, match="ticks.s1.arrow: its ticks columns differ"):
        records.collect_sorted(tmp_path, "ticks")


def test_prometheus_parser_reads_samples_and_skips_garbage():
    text = (
        '# HELP x\npolicy_server_load 0.5\npolicy_server_queue_depth{model="m"} 3\nbroken line\nx_bucket{le="+Inf"} 7\n'
    )
    got = parse_prometheus(text)
    assert ("policy_server_load", {}, 0.5) in got
    assert ("policy_server_queue_depth", {"model": "m"}, 3.0) in got
    assert ("x_bucket", {"le": "+Inf"}, 7.0) in got
    assert parse_prometheus('m{error="a}b \\"q\\""} 2\n') == [("m", {"error": 'a}b "q"'}, 2.0)]  # escapes, } inside


def test_cpu_sampler_attributes_a_busy_process():
    import subprocess
    import sys

    import psutil

    # a child of its own (no children of its own): this test process's tree may hold other tests' bench runs,
    # started in the background (tests/bench/scenario_runs.py), whose CPU the sampler rightly counts as ours
    busy = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nsys.stdin.readline()\n"
            # 0.4 s of CPU time, not of wall time: a loaded host stretches the window but not the
            # ticks to count, so the sampler's 10 ms tick quantisation stays a few per cent of it
            "end = time.thread_time() + 0.4\nwhile time.thread_time() < end: pass\n"
            "print('done', flush=True)\nsys.stdin.readline()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        me = psutil.Process(busy.pid)
        s = CpuSampler(period_s=10)
        s.track("busy", busy.pid)
        c0, w0 = sum(me.cpu_times()[:2]), time.monotonic()
        s.sample()
        busy.stdin.write("go\n")
        busy.stdin.flush()
        assert busy.stdout.readline().strip() == "done"  # its 0.4 s of CPU are spent; it waits, idle
        out = s.sample()
        # what the child really got of a core over the sampler's window (a loaded host gives it less than 100 %)
        got = 100 * (sum(me.cpu_times()[:2]) - c0) / (time.monotonic() - w0)
    finally:
        busy.kill()
        busy.wait()
    assert out["processes"]["busy"] == pytest.approx(got, rel=0.2, abs=3) and got > 1
    assert 0 <= out["host_percent"] <= 100
    assert s.split(-1e9, 1e9)["split"]["busy"] == out["processes"]["busy"]


def test_cpu_sampler_follows_a_restarted_process_and_keeps_reaped_children_out_of_the_runner():
    import subprocess
    import sys

    busy = [sys.executable, "-c", "import time\nend = time.monotonic() + 0.4\nwhile time.monotonic() < end: pass"]
    current = {"pid": None}
    s = CpuSampler(period_s=10)
    s.track("server:r1", lambda: current["pid"])
    first = subprocess.Popen(busy)
    current["pid"] = first.pid
    s.sample()
    first.wait()  # reaped by this process, the "runner": its CPU must not show up as the runner's
    # 0.2 s of its own CPU time (not wall time: a loaded host would give it little of a wall-clock stretch), then idle
    spin = (
        "import sys, time\nend = time.thread_time() + 0.2\nwhile time.thread_time() < end: pass\n"
        "print('spun', flush=True); sys.stdin.read()"
    )
    second = subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    current["pid"] = second.pid  # the replica came back under a new pid
    try:
        assert second.stdout.readline() == "spun\n"
        out = s.sample()
    finally:
        second.kill()
        second.wait()
    assert out["processes"]["runner"] < 40, out  # the first child burnt ~0.4 s of the window
    assert out["processes"]["server:r1"] > 0.5, out  # followed from its start (from its first sample it reads 0)


def test_cpu_table_keeps_every_process_ever_sampled():
    from bench.run.collect import cpu_table
    from bench.run.samplelog import SampleLog

    samples = SampleLog()
    for row in [
        {"t": -1.0, "host_percent": 10.0, "processes": {"router": 1.0}, "speed_probe_ms": 25.0},
        {"t": 0.0, "host_percent": 90.0, "processes": {"router": 2.0, "server-r0": 40.0, "shard-0": 30.0}},
        {"t": 1.0, "host_percent": 80.0, "processes": {"server-r0": 35.0, "shard-0": 31.0}},
    ]:
        samples.append(row)
    t = cpu_table(samples).to_pydict()
    assert t["t"] == [-1.0, 0.0, 1.0] and t["host_percent"] == [10.0, 90.0, 80.0]
    assert t["cpu:server-r0"] == [None, 40.0, 35.0]  # started after the first sample: still a column
    assert t["cpu:shard-0"] == [None, 30.0, 31.0]
    assert t["cpu:router"] == [1.0, 2.0, None]
    assert t["speed_probe_ms"] == [25.0, None, None]


def test_the_in_run_speed_probe_compares_with_the_probe_and_is_summarised():
    from bench.run.usage import PROBE_ITERATIONS, _probe_loop, speed_probe_cpu_ms

    c0 = time.thread_time()  # the whole loop in CPU time too: a loaded host stretches wall time, not this
    _probe_loop(PROBE_ITERATIONS)
    whole, part = (time.thread_time() - c0) * 1e3, speed_probe_cpu_ms()
    assert 0.5 < part / whole < 2.0  # a quarter of the loop, scaled to a whole one (the VM may shift meanwhile)
    s = CpuSampler(probe_every=2)
    s.track("me", os.getpid())
    for _ in range(5):
        s.sample()
    probed = [x for x in s.samples if "speed_probe_ms" in x]
    assert len(s.samples) == 4 and len(probed) == 2  # the first call only sets the baseline
    summary = s.probes()
    assert summary["count"] == 2 and 0 < summary["min_ms"] <= summary["median_ms"] <= summary["max_ms"]
    assert summary["min_ms"] <= summary["mean_ms"] <= summary["max_ms"]  # the window's speed (bench.run.usage)
    assert CpuSampler().probe_every == 1  # every sample probes by default: the VM's phases last seconds
    assert CpuSampler(probe_every=0).probes() == {}


def test_hop_split_joins_audit_lines_on_the_client_stamp():
    from bench.run.collect import hop_split

    rows = [
        {"outcome": "ok", "client_mono_ns": 1_000_000_000, "received_mono_ms": 1030.0, "sent_mono_ms": 1055.0},
        {"outcome": "ok", "client_mono_ns": 2_000_000_000, "received_mono_ms": 2010.5, "sent_mono_ms": 2020.0},
        {"outcome": "expired", "client_mono_ns": 3_000_000_000, "received_mono_ms": 3001.0, "sent_mono_ms": None},
        {"outcome": "ok", "client_mono_ns": 4_000_000_000},
    ]  # an older server: no timings
    sent = np.array([2_000_000_000, 1_000_000_000, 3_000_000_000, 4_000_000_000, 5_000_000_000, 0], np.int64)
    t_recv = np.array([2.05, 1.08, 3.5, 4.1, 5.1, 6.0])
    audit = pa.Table.from_pylist(rows)  # the first row names every column: the others are null where missing
    up, down, dropped = hop_split(sent, t_recv, audit)
    assert up[:2] == pytest.approx([10.5, 30.0]) and down[:2] == pytest.approx([30.0, 25.0], abs=1e-6)
    assert np.isnan(up[2:]).all() and np.isnan(down[2:]).all()  # not answered, no timings, no audit line, no stamp
    assert dropped == []  # one clock: nothing is dropped for its clocks
    up0, down0, _ = hop_split(sent, t_recv, audit, np.zeros(6), np.zeros(6))  # offsets of 0: the same numbers
    assert np.array_equal(up0, up, equal_nan=True) and np.array_equal(down0, down, equal_nan=True)
    assert [len(x) for x in hop_split(sent, t_recv, pa.table({}))[:2]] == [6, 6]


def test_server_overhead_is_the_replica_s_time_outside_queue_and_forward_pass_on_hop_split_s_line():
    """sent - received - queue wait - inference of the audit line hop_split joins (of two with one stamp, the
    same one), NaN where none matches, and kept where the split is dropped for its clocks: one replica's clock."""
    from bench.run.collect import audit_lines, hop_split, server_overhead

    rows = [
        {
            "outcome": "ok",
            "client_mono_ns": 1_000_000_000,
            "received_mono_ms": 1030.0,
            "sent_mono_ms": 1055.0,
            "queue_wait_ms": 4.0,
            "inference_ms": 12.0,
            "replica": "r0",
            "clock_uncertainty_ms": 0.0,
        },
        {
            "outcome": "ok",
            "client_mono_ns": 2_000_000_000,
            "received_mono_ms": 2011.0,
            "sent_mono_ms": 2030.0,
            "queue_wait_ms": 0.0,
            "inference_ms": 0.0,
            "replica": "r1",
            "clock_uncertainty_ms": 0.0,
        },
        {
            "outcome": "ok",
            "client_mono_ns": 2_000_000_000,
            "received_mono_ms": 2010.5,
            "sent_mono_ms": 2020.0,
            "queue_wait_ms": 1.5,
            "inference_ms": 6.0,
            "replica": "r0",
            "clock_uncertainty_ms": 0.0,
        },
        {
            "outcome": "expired",
            "client_mono_ns": 3_000_000_000,
            "received_mono_ms": 3001.0,
            "sent_mono_ms": None,
            "queue_wait_ms": 400.0,
            "inference_ms": None,
            "replica": "r0",
            "clock_uncertainty_ms": 0.0,
        },
        # a replica on another host whose clock is unsure by far more than its 2 ms hops: no split
        {
            "outcome": "ok",
            "client_mono_ns": 6_000_000_000,
            "received_mono_ms": 6002.0,
            "sent_mono_ms": 6010.0,
            "queue_wait_ms": 3.0,
            "inference_ms": 4.0,
            "replica": "r9",
            "clock_uncertainty_ms": 50.0,
        },
    ]
    sent = np.array([1_000_000_000, 2_000_000_000, 3_000_000_000, 5_000_000_000, 6_000_000_000, 0], np.int64)
    t_recv = np.array([1.08, 2.05, 3.5, 5.1, 6.012, 7.0])
    audit = pa.Table.from_pylist(rows)
    lines = audit_lines(sent, audit)
    overhead = server_overhead(lines)
    up, down, dropped = hop_split(sent, t_recv, audit, lines=lines)
    assert overhead.dtype == np.float32 and len(overhead) == 6
    assert overhead[:2] == pytest.approx([9.0, 2.0])  # 1055 - 1030 - 4 - 12; r0's line, not r1's 19 ms
    assert up[1] == pytest.approx(10.5)  # the same line as the split's: the first by receipt
    # network_ms (rtt - queue wait - inference) = uplink + downlink + server_overhead
    network = t_recv[:2] * 1e3 - sent[:2] / 1e6 - np.array([4.0, 1.5]) - np.array([12.0, 6.0])
    assert up[:2] + down[:2] + overhead[:2] == pytest.approx(network)
    assert np.isnan(overhead[[2, 3, 5]]).all()  # not answered, no audit line, no stamp
    assert [d["replica"] for d in dropped] == ["r9"] and np.isnan(up[4]) and np.isnan(down[4])
    assert overhead[4] == pytest.approx(1.0)  # 6010 - 6002 - 3 - 4: the split dropped, the overhead kept
    assert np.array_equal(hop_split(sent, t_recv, audit)[0], up, equal_nan=True)  # joined by hop_split itself
    assert np.isnan(server_overhead(audit_lines(sent, pa.table({})))).all()


def test_progress_line_shows_states_and_figures():
    line = format_status(
        12.0,
        60,
        "run",
        {
            "states": {"STREAMING": 290, "STALLED": 10},
            "ticks": 1000,
            "none_ticks": 10,
            "late_ticks": 1,
            "host_late_ticks": 2,
            "rtt_ms_p50": 60.0,
            "rtt_ms_p99": 140.0,
        },
        {"host_percent": 150.0},
    )
    assert "12.0/60s" in line and "STRE:290" in line and "none 1.0%" in line and "rtt p50 60 p99 140" in line
    assert "EXITED" not in line
    exited = format_status(12.0, 60, "run", {"states": {}, "unplanned_exits": ["server:r0", "router"]}, None)
    assert exited.endswith("EXITED server:r0 router"), exited


@pytest.mark.parametrize("tcp_host", [None, "127.0.0.1"], ids=["unix", "tcp"])
def test_control_channel_round_trip(tcp_host):
    server = ControlServer(tcp_host)
    assert server.path.startswith("tcp:127.0.0.1:") if tcp_host else server.path.endswith("control.sock")
    try:
        got = queue.Queue()
        client = ControlClient(server.path, got.put)
        client.send({"type": "hello", "shard": 3, "pid": 1})
        link, msg = server.messages.get(timeout=5)
        assert msg == {"type": "hello", "shard": 3, "pid": 1}
        deadline = time.monotonic() + 5
        while server.link(3) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        server.broadcast({"type": "start", "t0_mono": 1.5})
        assert got.get(timeout=5) == {"type": "start", "t0_mono": 1.5}
        client.close()
    finally:
        server.close()
    assert tcp_host or not os.path.exists(server.path)


class _Tty(__import__("io").StringIO):
    def isatty(self) -> bool:
        return True


def _results():
    from types import SimpleNamespace as NS

    return [
        NS(passed=True, error="", expression="dead_robots == 0", value=0),
        NS(passed=False, error="", expression="rtt_ms_p99 < 50", value=72.5),
    ]


def test_verdict_is_plain_lines_off_a_terminal_and_a_table_on_one():
    import io

    from bench.run.progress import print_verdict

    plain = io.StringIO()
    # every line of the error (a replica that did not start names its own error below), none of the runner's traceback
    print_verdict(
        "bench: t: FAIL -> r/summary.json",
        _results(),
        "boom\nserver-r0: cannot load\nTraceback (most recent call last):\n  File x",
        stream=plain,
    )
    assert plain.getvalue().splitlines() == [
        "bench: t: FAIL -> r/summary.json",
        "  PASS  dead_robots == 0  (value: 0)",
        "  FAIL  rtt_ms_p99 < 50  (value: 72.5)",
        "  ERROR boom",
        "        server-r0: cannot load",
    ]
    tty = _Tty()
    print_verdict("bench: t: FAIL -> r/summary.json", _results(), stream=tty)
    out = tty.getvalue()
    assert "\x1b[" in out and "assertion" in out and "rtt_ms_p99 < 50" in out and "72.5" in out  # rich, coloured


def test_progress_on_a_terminal_is_one_bar_per_phase():
    from bench.run.progress import Progress

    phase = ["warmup", 2.0]
    tty = _Tty()
    p = Progress(lambda: (phase[1], 5.0, phase[0], {"states": {"STREAMING": 3}, "ticks": 10}, None), stream=tty)
    p.start()
    p.emit()
    phase[:] = ["run", 1.0]
    p.emit()
    p.stop()
    out = tty.getvalue()
    assert "warmup" in out and "run" in out and "STRE:3" in out and len(p._tasks) == 2
    quiet = _Tty()
    q = Progress(lambda: (0.0, 1.0, "run", {}, None), stream=quiet, enabled=False).start()
    q.stop()
    assert quiet.getvalue() == ""


def test_sampler_records_memory_and_descriptors_and_follows_a_restart():
    import subprocess
    import sys

    from bench.evidence.figures import rss_growth_ratio

    grow = (
        "import sys, time\nblocks = []\nfor _ in range(30):\n    blocks.append(bytearray(2**20)); "
        "[b.__setitem__(slice(None), b'x' * len(b)) for b in blocks[-1:]]; time.sleep(0.02)\n"
        "print('done', flush=True); sys.stdin.read()"
    )
    child = subprocess.Popen([sys.executable, "-c", grow], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        s = CpuSampler(period_s=10)
        s.track("server:r0", child.pid)
        s.sample()
        assert child.stdout.readline() == "done\n"  # the child has touched 30 MB
        out = s.sample()
        assert (
            out["rss_mb"]["server:r0"] > 30 and out["fds"]["server:r0"] >= 3 and out["pids"]["server:r0"] == child.pid
        )
        assert out["rss_mb"]["runner"] > 0 and out["fds"]["runner"] > 0
        mem = s.memory(-1e9, 1e9)
        assert mem["server:r0"]["rss_mb_max"] > 30 and mem["server:r0"]["restarts"] == 0
        child.kill()  # not reaped yet: a zombie, as a shard that ended a moment before the run's last sample
        import time

        while open(f"/proc/{child.pid}/stat").read().split(")")[-1].split()[0] != "Z":
            time.sleep(0.01)  # no event says "the kernel made it a zombie"
        s.sample()
        end = s.memory(-1e9, 1e9)["server:r0"]
        assert end["rss_mb_end"] > 30 and end["fds_end"] >= 3  # its last sample alive, not the zombie's zeros
    finally:
        child.kill()
        child.wait()
    assert rss_growth_ratio([100.0] * 20 + [110.0] * 10) == 0.1 and rss_growth_ratio([1.0] * 5) != rss_growth_ratio(
        [1.0] * 5
    )


def test_leftovers_name_a_live_child_and_a_new_shm_entry(tmp_path):
    import subprocess
    import sys
    import uuid

    from bench.run.usage import SHM, Leftovers

    before = Leftovers.begin()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    shm = SHM / f"soak-test-{uuid.uuid4().hex[:8]}"
    shm.write_bytes(b"x")
    try:
        left = before.end()
        assert left["leftover_processes"] >= 1 and shm.name in left["leftover_shm_entries"]
    finally:
        child.kill()
        child.wait()
        shm.unlink()
    left = before.end()
    assert shm.name not in left["leftover_shm_entries"]


def test_list_rows_reads_an_arrow_list_column_as_to_pylist_does_for_seams():
    import pyarrow as pa

    from bench.evidence.figures import seam_inputs
    from bench.run.collect import ListRows

    acts = [None if i % 7 == 0 else [float(i), float(-i)] for i in range(1000)]
    col = pa.chunked_array([pa.array(acts[:500]), pa.array(acts[500:])]).filter(
        pa.array([i % 3 != 0 for i in range(1000)])
    )
    rows = col.to_pylist()
    m = len(rows)
    robots, seqs, eps = np.repeat(np.arange(5), m // 5 + 1)[:m], np.arange(m) // 4, np.arange(m) // 50
    none = np.array([x is None for x in rows])
    a = seam_inputs(robots, seqs, eps, none, rows, {})
    b = seam_inputs(robots, seqs, eps, none, ListRows(col), {})
    assert a.keys() == b.keys() and all(np.array_equal(x, y) for k in a for x, y in zip(a[k], b[k]))


def test_a_cluster_childs_actor_reads_its_cpu_on_its_node_and_the_sampler_merges_it_with_the_node_named(tmp_path):
    """The remote path without Ray: a ChildActor (the class Ray wraps) owns a busy child and answers `usage()` as it
    would on another host; the driver's sampler pulls it, and the split names the process, its node and the node's
    own CPU."""
    import sys

    from bench.run.cluster import ChildActorImpl

    spin = (
        "import sys, time\nprint('up', flush=True)\nend = time.thread_time() + 0.3\n"
        "while time.thread_time() < end: pass\nprint('spun', flush=True)\ntime.sleep(60)"
    )
    actor = ChildActorImpl("shard:0", [sys.executable, "-c", spin], str(tmp_path / "shard.log"), "spun", {}, 30.0)
    first = actor.usage()  # before the start: the node's figures, no process
    assert "cpu_s" not in first and first["cores"] >= 1 and first["host_total_s"] > first["host_busy_s"] > 0
    pid = actor.start()  # returns once the child printed "spun": 0.3 s of its own CPU time
    try:
        readings = [actor.usage()]
        for _ in range(2):  # the sampler's pulls; between them the child sleeps
            readings.append(actor.usage())
        assert readings[0]["pid"] == pid and readings[0]["cpu_s"] >= 0.3 and readings[0]["rss_mb"] > 1
        pulls = iter(
            [
                {},
                {"shard:0": {**first, "pid": pid, "cpu_s": 0.0, "rss_mb": 1.0, "fds": 1}},
                {"shard:0": readings[0]},
                {"shard:0": readings[1]},
            ]
        )
        asked = []
        s = CpuSampler(period_s=10, clock=itertools.count(100.0).__next__)  # a sample a second; pulls carry their own
        s.track_remote("shard:0", "node 5d2dca76ab12 (nodeB, 10.0.0.2)")
        s.remote_usage = lambda names: asked.append(list(names)) or next(pulls)
        for _ in range(4):
            s.sample()
    finally:
        actor.fault("stop")
    assert asked == [["shard:0"]] * 4
    rows = list(s.samples)
    dt = readings[0]["mono"] - first["mono"]
    assert rows[1]["processes"]["shard:0"] == pytest.approx(100 * readings[0]["cpu_s"] / dt)  # its node's interval
    assert rows[1]["pids"]["shard:0"] == pid and "nodes" in rows[1]
    split = s.split(-1e9, 1e9)
    assert split["node_of"] == {"shard:0": "node 5d2dca76ab12 (nodeB, 10.0.0.2)"}
    node = split["nodes"]["node 5d2dca76ab12 (nodeB, 10.0.0.2)"]
    assert node["processes"] == ["shard:0"] and node["cores"] == first["cores"] and 0 <= node["host_percent"] <= 100
    assert split["split"]["shard:0"] > 0 and "runner" in split["split"]  # local and remote side by side


def test_a_node_that_does_not_answer_leaves_the_sample_without_it():
    s = CpuSampler(period_s=10, clock=itertools.count(100.0).__next__)
    s.track_remote("server:r0", "aa (nodeC)")

    def silent(names):
        raise TimeoutError("no answer")

    s.remote_usage = silent
    s.sample()
    out = s.sample()
    assert "server:r0" not in out["processes"] and "nodes" not in out and "runner" in out["processes"]


def test_a_process_read_through_its_node_matches_the_same_process_read_here():
    """One busy child sampled both ways in the same samples: from this host's /proc and as a remote child whose
    node answers with `node_usage` (what its ChildActor returns): the two readings agree."""
    import subprocess
    import sys

    from bench.run.usage import node_usage

    spin = (
        "import sys, time\nsys.stdin.readline()\nend = time.thread_time() + 0.3\n"
        "while time.thread_time() < end: pass\nprint('spun', flush=True)\nsys.stdin.readline()"
    )
    child = subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        s = CpuSampler(period_s=10)
        s.track("busy", child.pid)
        s.track_remote("busy@node", "n1 (here)")
        s.remote_usage = lambda names: {"busy@node": node_usage(child.pid)}
        s.sample()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "spun\n"
        out = s.sample()
    finally:
        child.kill()
        child.wait()
    assert out["processes"]["busy"] > 1, out
    # the same CPU seconds over two intervals that differ by the sample's own local reads (longer on a loaded host)
    assert out["processes"]["busy@node"] == pytest.approx(out["processes"]["busy"], rel=0.25), out
    assert out["rss_mb"]["busy@node"] == pytest.approx(out["rss_mb"]["busy"], rel=0.1)
    assert out["nodes"]["n1 (here)"] == pytest.approx(out["host_percent"], abs=5)
