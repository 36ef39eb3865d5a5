"""`bench incident --edge DATASET`: a LeRobotDataset with the bench's provenance read as what the robot saw, its
stutter as the ticks it held, and a replay scored the same way. The shipped evidence is robot 1 of
scenarios/incidents/stutter_source.yaml's run, recorded with `--record-dataset`."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from bench import cli
from bench.evidence import incident
from bench.evidence import incident_dataset as idt
from bench.evidence.exitcode import Exit
from bench.scenario.load import SCENARIOS_DIR

EVIDENCE = SCENARIOS_DIR / "incidents" / "stutter_dataset"
HELD_STATES = {"HELD", "RECONNECTING"}


def _states(transitions):
    return [(round(tr["t"], 3), tr["to"]) for tr in transitions]


def test_held_ticks_mid_episode_are_stutter_and_an_episode_start_is_not():
    t = np.arange(12) * 0.1
    seq = np.array([-1, 0, 0, -1, -1, 1, 1, -1, 2, 2, 2, 2])
    session = np.zeros(12, int)
    episode = np.array([0] * 7 + [1] * 5)  # a new episode at t 0.7: one tick before its first chunk
    got = _states(idt.held_transitions(t, seq, session, episode))
    assert got == [(0.0, "CONNECTING"), (0.1, "STREAMING"), (0.3, "HELD"), (0.5, "STREAMING"), (0.7, "CONNECTING"),
                   (0.8, "STREAMING")]  # fmt: skip
    log = incident.EdgeLog(transitions=idt.held_transitions(t, seq, session, episode), stutter="held")
    assert [(round(a, 2), round(b, 2)) for a, b, _ in incident.stretches(log, 2.0)] == [(0.3, 0.5)]


def test_an_episode_start_held_past_the_grace_or_begun_held_is_stutter():
    t = np.arange(20) * 0.05
    seq = np.array([0, 0] + [-1] * 10 + [1] * 8)
    episode = np.array([0, 0] + [1] * 18)  # the episode begins at 0.1 and waits 0.5 s for its first chunk
    got = _states(idt.held_transitions(t, seq, np.zeros(20, int), episode))
    assert (0.1, "HELD") in got and got[-1] == (0.6, "STREAMING")
    # held when the episode began: the stretch carries through its start
    seq = np.array([0, -1, -1, -1, 1])
    got = _states(idt.held_transitions(np.arange(5) * 0.1, seq, np.zeros(5, int), np.array([0, 0, 1, 1, 1])))
    assert got == [(0.0, "STREAMING"), (0.1, "HELD"), (0.4, "STREAMING")]


def test_a_new_session_across_a_held_stretch_is_a_reconnect():
    t = np.arange(6) * 0.1
    got = idt.held_transitions(t, np.array([0, 0, -1, -1, 0, 0]), np.array([0, 0, -1, -1, 1, 1]), np.zeros(6, int))
    log = incident.EdgeLog(transitions=got, stutter="held")
    ((a, b, states),) = incident.stretches(log, 1.0)
    assert (round(a, 2), round(b, 2)) == (0.2, 0.4) and "RECONNECTING" in states


@pytest.fixture(scope="module")
def log():
    return incident.read_edge_log(EVIDENCE / "lab", robot=1)  # LeRobot's loader: seconds, so read once


def test_the_shipped_dataset_reads_as_the_stutter_the_engine_logged(log):
    assert log.stutter == "held" and log.robot["robot_type"] == "reacher" and log.robot["fps"] == 30
    ok = [r for r in log.requests if r["outcome"] == "ok"]
    assert ok and all(r["rtt_ms"] >= 0 and r["network_ms"] >= 0 for r in ok)
    stretches = [(a, b, s) for a, b, s in incident.stretches(log, 1e9) if b - a >= 0.5]
    # the source run's faults: a 350 ms latency spike 4-8 s, a silent link 12-14.5 s, a partition 19-21.5 s
    assert any(4 <= a < 8 for a, _, _ in stretches)
    assert any(12 <= a < 14.5 and "RECONNECTING" in s for a, _, s in stretches)
    assert any(19 <= a < 21.5 and "RECONNECTING" in s for a, _, s in stretches)
    faults = incident.reconstruct(log.window(0, 26), 26, [])["faults"]
    actions = [(f["action"], f["at"]) for f in faults]
    assert ("latency", 4.0) in actions and sum(a == "partition" for a, _ in actions) == 2, faults


def test_the_audit_log_joins_on_session_and_seq_where_no_clock_is_shared(log):
    rows = incident.read_audit_lines([EVIDENCE / "audit-r0.jsonl"])
    joined = idt.audit_origin_by_join(log, rows)
    # the run's own t = 0 on the server clock, which the dataset's meta also holds: one-way network apart
    assert joined is not None and abs(joined - log.robot["t0_mono_ms"]) < 50.0
    assert idt.audit_origin_by_join(log, [{"session_id": "other", "seq_id": 1, "received_mono_ms": 5.0}]) is None


def test_a_dataset_of_many_robots_needs_robot_and_one_without_provenance_is_refused(tmp_path, capsys):
    args = ["incident", "--from", "0", "--to", "26", "--out", str(tmp_path / "x.yaml"), "--no-run"]
    assert cli.main([*args, "--edge", str(EVIDENCE / "lab")]) == Exit.INVALID
    assert "holds robots 0, 1, 2: pass --robot N" in capsys.readouterr().err
    assert cli.main([*args, "--edge", str(EVIDENCE / "lab"), "--robot", "7"]) == Exit.INVALID
    assert "no frames of robot 7; its robots: 0, 1, 2" in capsys.readouterr().err
    bare = tmp_path / "bare"
    shutil.copytree(EVIDENCE / "lab", bare)
    info = json.loads((bare / "meta" / "info.json").read_text())
    info["features"]["provenance.ids"]["names"] = info["features"]["provenance.ids"]["names"][:-1]  # no t_ms
    (bare / "meta" / "info.json").write_text(json.dumps(info))
    assert cli.main([*args, "--edge", str(bare), "--robot", "1"]) == Exit.INVALID
    err = capsys.readouterr().err
    assert "without the provenance entries t_ms" in err and "--record-dataset" in err and "Traceback" not in err


def test_the_scenario_written_from_the_dataset_is_valid(tmp_path):
    from bench.scenario.load import load_scenario

    out = tmp_path / "from_dataset.yaml"
    args = ["--edge", str(EVIDENCE / "lab"), "--robot", "1", "--audit", str(EVIDENCE / "audit-r0.jsonl")]
    assert cli.main(["incident", *args, "--from", "0", "--to", "26", "--out", str(out), "--no-run"]) == Exit.PASS
    s = load_scenario(out)
    assert s.groups[0].robot == "reacher" and len(s.faults) >= 3


@pytest.mark.slow
@pytest.mark.integration
def test_replaying_the_dataset_incident_reproduces_its_held_stutter():
    from tests.bench.scenario_runs import bench_run

    run = bench_run("incident_replay_dataset")
    assert "stutter REPRODUCED" in run.stderr, run.stderr[-3000:]
    assert run.returncode == 0, run.stderr[-3000:]
    (score,) = run.json_files("incident.json")
    assert score["reproduced"] and score["recall"] >= 0.7 and score["precision"] >= 0.5
