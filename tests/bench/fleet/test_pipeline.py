"""The bench's own pipeline without the network: scenario -> shard loop (real robots, a fake engine)
-> Arrow records -> parquet -> figures -> assertions -> summary.json, junit.xml, report.html."""

from __future__ import annotations

import json
import textwrap
import threading
import time
import xml.etree.ElementTree as ET

import pytest

from bench.fleet.shard import Shard
from bench.run.runner import Run, SiteLink
from bench.run.specs import shard_specs
from bench.run.state import RunState
from bench.run.verdict import judge
from bench.scenario.load import parse_scenario

SCENARIO = textwrap.dedent("""\
    name: pipeline
    description: fake engines, real robots
    duration_s: 2.5
    warmup_s: 0.5
    fleet:
      groups:
        - {name: a, robot: reacher, count: 3, site: lab, episode_s: 1.0, engine: {max_action_age_s: 1.0}}
        - {name: b, robot: arm, count: 2, fps: 20, site: lab, engine: {max_action_age_s: 1.0}}
    sites: {lab: lan}
    servers: {manifest: {allow_resampling: true}, replicas: [{id: r0, checkpoint: reacher}, {id: r1, checkpoint: arm}]}
    assertions:
      - dead_robots == 0
      - staleness_violations == 0
      - p99(rtt_ms) < 100
      - group[a].none_ticks > 0
      - states(group=a) contains [STREAMING, STALLED, STREAMING]
      - group[b].none_ticks > 0
    # the loop runs inside pytest's process, at normal priority: the host's share is not what this tests
    fidelity: {host_late_ratio: 1, loop_overrun_ratio: 1, scheduler_wait_ms: 100000}
""")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    s = parse_scenario(SCENARIO)
    run = Run(s, tmp_path_factory.mktemp("run"), progress=False).state
    for d in (run.logs, run.rec_dir):
        d.mkdir(parents=True, exist_ok=True)
    run.sites = {"lab": SiteLink("lab", "tcp/127.0.0.1:9")}
    specs = shard_specs(run)
    spec = specs[0]
    spec["engine_factory"] = "tests.bench.fake_engine:make"
    for r in spec["robots"]:
        if r["group"] == "a":
            r["engine"]["fake_stall"] = [1.2, 1.8]  # seconds after engine start
    shard = Shard(spec, None)
    shard.build()
    now = time.monotonic()
    shard.start_msg = {"start_mono": now, "t0_mono": now + s.warmup_s, "end_mono": now + s.warmup_s + s.duration_s}
    shard.t0 = now + s.warmup_s
    status = threading.Thread(target=shard.status_loop, daemon=True)
    status.start()
    shard.run_loop()
    shard.stop_event.set()
    final = shard.teardown()
    run.done[0] = {"final_states": final}
    outcome = judge(run, None)
    return run, outcome


def test_all_outputs_are_written(finished_run):
    run, outcome = finished_run
    for name in (
        "summary.json",
        "junit.xml",
        "report.html",
        "ticks.parquet",
        "requests.parquet",
        "transitions.parquet",
        "episodes.parquet",
        "loop.parquet",
        "robots.parquet",
    ):
        assert (run.run_dir / name).is_file(), name


def test_robot_keyed_parquet_files_are_sorted_by_robot_then_t(finished_run):
    import numpy as np
    import pyarrow.parquet as pq

    run, _ = finished_run
    for kind in ("ticks", "requests", "transitions"):
        t = pq.read_table(run.run_dir / f"{kind}.parquet", columns=["robot", "t"])
        robot, ts = t.column("robot").to_numpy(), t.column("t").to_numpy()
        assert len(set(robot.tolist())) == 5, kind
        same_robot = np.diff(robot) == 0
        assert (np.diff(robot) >= 0).all() and (np.diff(ts)[same_robot] >= 0).all(), kind


def test_summary_holds_verdict_assertions_and_figures(finished_run):
    run, outcome = finished_run
    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert summary["verdict"] == "fail"  # group b never went None: that assertion fails by design
    results = {a["expression"]: a for a in summary["assertions"]}
    assert results["group[b].none_ticks > 0"]["result"] == "fail"
    assert results["states(group=a) contains [STREAMING, STALLED, STREAMING]"]["result"] == "pass"
    assert results["staleness_violations == 0"]["result"] == "pass"
    f = summary["figures"]
    assert summary["robots"] == 5 and f["ticks"] > 200
    assert f["none_ticks"] > 0 and f["episodes"] > 0 and f["rtt_ms"]["count"] > 0
    assert f["on_time_ticks"] + f["late_ticks"] + f["too_late_ticks"] + f["host_late_ticks"] == f["ticks"]
    assert set(summary["groups"]) == {"a", "b"}
    stages = [row["stage"] for row in summary["latency_budget"]]
    # the round trip's rows end at its total; the robot's own delays outside it follow
    assert stages[-3:] == [
        "total (rtt)",
        "robot: observation -> send (outside the rtt)",
        "robot: arrival -> merge (outside the rtt)",
    ]


def test_junit_has_one_case_per_assertion(finished_run):
    run, _ = finished_run
    suite = ET.parse(run.run_dir / "junit.xml").getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == 6
    assert suite.get("failures") == "1"
    assert cases[5].find("failure") is not None


def test_report_is_self_contained(finished_run):
    run, _ = finished_run
    html = (run.run_dir / "report.html").read_text()
    assert "<svg" in html and "Latency budget" in html and "Per-robot state timelines" in html
    assert "<script" not in html and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")


def _fake_engine_shard_spec(s, tmp_path) -> tuple[RunState, dict]:
    """A run of scenario `s` in `tmp_path` with no process started, and its first shard's spec on fake engines."""
    run = Run(s, tmp_path, progress=False).state
    for d in (run.logs, run.rec_dir):
        d.mkdir(parents=True, exist_ok=True)
    run.sites = {"lab": SiteLink("lab", "tcp/127.0.0.1:9")}
    spec = shard_specs(run)[0]
    spec["engine_factory"] = "tests.bench.fake_engine:make"
    return run, spec


def test_a_slot_calls_every_engine_before_it_records_any_tick(tmp_path):
    """A robot's host_delay is the engine calls of the robots before it in its slot, not their tick records:
    the loop asks all engines of a slot first. Fails if records are written between engine calls."""
    s = parse_scenario(
        textwrap.dedent("""\
        name: order
        description: call order within a slot
        duration_s: 0.4
        warmup_s: 0.1
        fleet:
          groups: [{name: a, robot: reacher, count: 6, site: lab}]
        sites: {lab: lan}
        servers: {replicas: [{id: r0, checkpoint: reacher}]}
        assertions: [dead_robots == 0]
    """)
    )
    run, spec = _fake_engine_shard_spec(s, tmp_path)
    shard = Shard(spec, None)
    shard.build()
    events: list[tuple[str, int]] = []
    for slot in shard.robots:
        engine, rid = slot.engine, slot.rid
        inner = engine.get_action
        engine.get_action = lambda inner=inner, rid=rid: (events.append(("engine", rid)), inner())[1]
    extend_rows = shard.ticks.extend_rows  # a row's first column is its robot
    shard.ticks.extend_rows = lambda rows: (events.extend(("record", row[0]) for row in rows), extend_rows(rows))[1]
    now = time.monotonic()
    shard.start_msg = {"start_mono": now, "t0_mono": now + s.warmup_s, "end_mono": now + s.warmup_s + s.duration_s}
    shard.t0 = now + s.warmup_s
    shard.run_loop()
    shard.stop_event.set()
    shard.teardown()
    slots = [[shard.robots[j].rid for j in m] for m in shard.schedule.members if m]
    assert sum(map(len, slots)) == 6 and max(map(len, slots)) > 1
    slot_of = {rid: members for members in slots for rid in members}
    # the event stream is a sequence of slot visits: the slot's engine calls, then its records, in one order
    i = visits = 0
    while i < len(events):
        members = slot_of[events[i][1]]
        size = len(members)
        assert events[i : i + size] == [("engine", r) for r in members], f"engine calls of a slot at event {i}"
        assert events[i + size : i + 2 * size] == [("record", r) for r in members], f"records of a slot at event {i}"
        i += 2 * size
        visits += 1
    assert visits > 10


def test_an_engine_that_raises_is_counted_held_and_fails_the_run_unasked(tmp_path):
    """get_action raising into the loop is the system breaking its contract: the tick is recorded as `raised` (the
    robot holds), the shard keeps running its other robots, and `engine_raises == 0` fails the run unasked."""
    s = parse_scenario(
        textwrap.dedent("""\
        name: raises
        description: one engine raises for a while
        duration_s: 1.5
        warmup_s: 0.2
        fleet:
          groups: [{name: a, robot: reacher, count: 2, site: lab, episode_s: 0.5}, {name: b, robot: reacher, count: 1, site: lab}]
        sites: {lab: lan}
        servers: {replicas: [{id: r0, checkpoint: reacher}]}
        assertions: [ticks > 0]
        fidelity: {host_late_ratio: 1, loop_overrun_ratio: 1, scheduler_wait_ms: 100000}
    """)
    )
    run, spec = _fake_engine_shard_spec(s, tmp_path)
    raising = next(r for r in spec["robots"] if r["group"] == "a")
    raising["engine"]["fake_raise"] = [0.4, 1.2]  # seconds after engine start: across an episode's end (reset)
    shard = Shard(spec, None)
    shard.build()
    now = time.monotonic()
    shard.start_msg = {"start_mono": now, "t0_mono": now + s.warmup_s, "end_mono": now + s.warmup_s + s.duration_s}
    shard.t0 = now + s.warmup_s
    shard.run_loop()
    shard.stop_event.set()
    final = shard.teardown()
    rid = raising["robot"]
    (slot,) = [r for r in shard.robots if r.rid == rid]
    assert slot.raises > 0 and "get_action() raised" in slot.first_raise and "ValueError" in slot.first_raise
    assert all(r.raises == 0 for r in shard.robots if r.rid != rid)
    run.done[0] = {
        "final_states": final,
        "engine_raises": {str(rid): {"count": slot.raises, "first": slot.first_raise}},
    }
    outcome = judge(run, None)
    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert summary["verdict"] == "fail" and outcome.exit_code == 1
    results = {a["expression"]: a for a in summary["assertions"]}
    assert results["ticks > 0"]["result"] == "pass"
    assert results["engine_raises == 0"]["result"] == "fail" and results["engine_raises == 0"]["value"] == slot.raises
    assert summary["groups"]["a"]["engine_raises"] == slot.raises and summary["groups"]["b"]["engine_raises"] == 0
    assert summary["engine_raises"] == [{"robot": rid, "count": slot.raises, "first": slot.first_raise}]
    import pyarrow.parquet as pq

    ticks = pq.read_table(run.run_dir / "ticks.parquet", columns=["robot", "source", "is_none"]).to_pydict()
    raised = [i for i, src in enumerate(ticks["source"]) if src == "raised"]
    assert raised and all(ticks["robot"][i] == rid and ticks["is_none"][i] for i in raised)
    # the raising robot's other ticks, before and after the window, came from its engine as usual
    assert any(ticks["robot"][i] == rid and src == "chunk" for i, src in enumerate(ticks["source"]))


def test_a_server_count_beyond_a_records_int32_is_held_at_its_maximum(tmp_path):
    """`superseded_seqs` is a u32 on the wire: a server's count past int32 must not break the shard's records."""
    from bench.fleet.records import collect
    from bench.fleet.shard import INT32_MAX

    s = parse_scenario(
        textwrap.dedent("""\
        name: big
        description: a huge superseded count
        duration_s: 1
        fleet:
          groups: [{name: a, robot: reacher, count: 1, site: lab}]
        sites: {lab: lan}
        servers: {replicas: [{id: r0, checkpoint: reacher}]}
        assertions: [ticks >= 0]
    """)
    )
    run, spec = _fake_engine_shard_spec(s, tmp_path)
    shard = Shard(spec, None)
    shard.build()
    shard.t0 = time.monotonic()
    shard.robots[0].engine._records.append({"seq": 1, "rtt_ms": 5.0, "superseded_seqs": 2**32 - 1, "outcome": "ok"})
    shard.drain()
    shard.teardown()
    table = collect(run.rec_dir, "requests")
    assert table.column("superseded_seqs").to_pylist() == [INT32_MAX]
