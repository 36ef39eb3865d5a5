"""Incident replay (bench.evidence.incident): logs -> faults, stutter comparison, and the shipped example
incident replayed end to end (its stutter comes back where it was)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.evidence import incident
from bench.evidence.incident import EdgeLog

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "scenarios" / "incidents" / "stutter_robot1"


def _req(t, net=1.0, outcome="ok", queue=0.3):
    return {
        "t": t,
        "seq": int(t * 10),
        "rtt_ms": net + queue + 5.0,
        "queue_wait_ms": queue,
        "inference_ms": 5.0,
        "network_ms": net,
        "outcome": outcome,
    }


def _tr(t, frm, to, reason=""):
    return {"t": t, "from": frm, "to": to, "reason": reason}


def _log() -> EdgeLog:
    reqs = [_req(t / 2) for t in range(0, 8)]  # 0..4 s: LAN
    reqs += [_req(4 + t / 2, net=600.0) for t in range(0, 8)]  # 4..8 s: +600 ms round trip
    reqs += [_req(8 + t / 2) for t in range(0, 8)]
    reqs += [_req(13.0, outcome="timeout"), _req(14.0, outcome="timeout")]  # silent link
    reqs += [_req(16 + t / 2) for t in range(0, 6)]
    trans = [
        _tr(0.0, "CONNECTING", "STREAMING"),
        _tr(5.0, "STREAMING", "STALLED"),
        _tr(7.5, "STALLED", "STREAMING"),
        _tr(12.5, "STREAMING", "DEGRADED", "no chunk for 0.5 s"),
        _tr(13.0, "DEGRADED", "STALLED"),
        _tr(15.0, "STALLED", "STREAMING"),
    ]
    return EdgeLog({"robot_type": "reacher", "fps": 30, "engine": {"degraded_after_s": 0.5}}, reqs, trans)


def test_reconstruct_turns_slow_seconds_into_latency_and_failed_requests_into_an_outage():
    rec = incident.reconstruct(_log(), 20.0, audit=[])
    lat = [f for f in rec["faults"] if f["action"] == "latency"]
    assert len(lat) == 1, rec["faults"]  # the answers received 4..7.5 s were in flight from 3.4 s
    assert lat[0]["at"] == 3.0 and lat[0]["at"] + lat[0]["duration"] == 8.0
    assert lat[0]["latency"] == pytest.approx(300, abs=2)  # half of the 600 ms excess each way
    out = next(f for f in rec["faults"] if f["action"] == "timeout")
    assert out["at"] == pytest.approx(11.5) and out["duration"] == pytest.approx(3.5)  # silent since the last answer
    assert rec["base_network_ms"] == pytest.approx(1.0)


def test_a_reconnect_in_the_stretch_makes_it_a_partition():
    log = _log()
    log.transitions.insert(5, _tr(13.5, "STALLED", "RECONNECTING", "server liveliness lost"))
    rec = incident.reconstruct(log, 20.0, audit=[])
    assert any(f["action"] == "partition" for f in rec["faults"])


def test_stutter_comparison_scores_a_replay_against_the_original():
    orig = _log()
    same = incident.compare_stutter(orig, orig, 20.0)
    assert same["recall"] == 1.0 and same["precision"] == 1.0 and incident.reproduced(same)
    calm = EdgeLog({}, [], [_tr(0.0, "CONNECTING", "STREAMING")])
    none = incident.compare_stutter(orig, calm, 20.0)
    assert none["recall"] == 0.0 and not incident.reproduced(none)  # the negative check: a calm replay fails
    shifted = EdgeLog(
        {},
        [],
        [_tr(0.0, "CONNECTING", "STREAMING"), _tr(9.0, "STREAMING", "STALLED"), _tr(11.0, "STALLED", "STREAMING")],
    )
    assert not incident.reproduced(incident.compare_stutter(orig, shifted, 20.0))


def test_a_stutter_in_the_warm_up_is_not_scored():
    warm = EdgeLog(
        {},
        [],
        [
            _tr(-4.0, "STREAMING", "DEGRADED"),
            _tr(-3.9, "DEGRADED", "STREAMING"),
            _tr(5.0, "STREAMING", "STALLED"),
            _tr(7.5, "STALLED", "STREAMING"),
        ],
    )
    # a stretch ending before t = 0 once marked every bin but its own last few (a negative slice end)
    assert incident.stutter_bins(warm, 20.0).sum() * incident.BIN_S == pytest.approx(2.5)


def test_the_written_scenario_is_valid_and_names_its_evidence(tmp_path):
    from bench.scenario.load import load_scenario

    src = tmp_path / "edge.jsonl"
    incident.write_edge_log(_log(), src)
    out = tmp_path / "inc.yaml"
    scenario, window = incident.make_incident(str(src), [], 0.0, 20.0, out, name="inc")
    s = load_scenario(out)
    # 0..20 s clipped to the whole seconds of the records (the last at 18.5 s)
    assert s.name == "inc" and s.duration_s == 19.0 and len(s.faults) == len(scenario["faults"]) >= 2
    assert "group[robot].fallback_ticks > 0" in [a.expression for a in s.assertions]


def test_the_example_incident_evidence_is_shipped():
    assert (EXAMPLE / "edge-log.jsonl").is_file() and (EXAMPLE / "audit.jsonl").is_file()
    log = incident.read_edge_log(EXAMPLE / "edge-log.jsonl")
    assert log.robot["robot_type"] == "reacher" and log.requests and log.transitions
    assert incident.stretches(log, 1e9), "the example incident must contain a stutter"


@pytest.mark.slow
@pytest.mark.integration
def test_replaying_the_example_incident_reproduces_its_stutter():
    from tests.bench.scenario_runs import bench_run

    run = bench_run("incident_replay")  # bench incident on the shipped evidence, window 0..26 s
    assert "stutter REPRODUCED" in run.stderr, run.stderr[-3000:]
    assert run.returncode == 0, run.stderr[-3000:]
    (score,) = run.json_files("incident.json")
    assert score["reproduced"] and score["recall"] >= 0.7 and score["precision"] >= 0.5


def test_each_replicas_audit_lines_are_windowed_on_its_own_clock():
    """clock.json offsets (bench.fleet.clock): a replica that ran 3 s behind the runner has its audit lines
    windowed from t = 0 on its clock; one on the runner's clock from the runner's; an audit file that names no
    replica is not windowed at all once any replica ran on another clock (rather than windowed wrongly)."""
    from bench.evidence.incident import audit_origin, audit_window

    log = EdgeLog()
    log.robot = {"t0_mono_ms": 10_000.0}
    assert audit_origin(log, "run/logs/audit-r0.jsonl") == 10_000.0 and audit_origin(log, "any.jsonl") == 10_000.0
    log.robot["replica_t0_mono_ms"] = {"r1": 7_000.0}
    assert audit_origin(log, "run/logs/audit-r1.jsonl") == 7_000.0
    assert audit_origin(log, "run/logs/audit-r0.jsonl") == 10_000.0
    assert audit_origin(log, "copied.jsonl") is None
    rows = [{"mono_ms": 7_000.0 + 1_500.0}, {"mono_ms": 10_000.0 + 1_500.0}]
    assert audit_window(rows, audit_origin(log, "audit-r1.jsonl"), 1.0, 2.0) == rows[:1]


def _incident(tmp_path, edge, *args) -> int:
    from bench.cli import main

    return main(["incident", "--no-run", "--edge", str(edge), "--out", str(tmp_path / "inc.yaml"), *map(str, args)])


def _edge_log(tmp_path) -> Path:
    src = tmp_path / "edge.jsonl"
    incident.write_edge_log(_log(), src)
    return src


@pytest.mark.parametrize(
    "t_from, t_to, says",
    [
        ("5", "0", "--from 5 --to 0: --to must be at least 0.5 s after --from"),
        ("0", "0", "--from 0 --to 0: --to must be at least 0.5 s after --from"),  # was a scenario validate refuses
        ("0", "inf", "--from 0 --to inf: give finite seconds"),
        ("nan", "5", "--from nan --to 5: give finite seconds"),
    ],
)
def test_a_window_not_finite_or_not_after_its_start_is_refused_naming_from_and_to(tmp_path, capsys, t_from, t_to, says):
    assert _incident(tmp_path, _edge_log(tmp_path), "--from", t_from, "--to", t_to) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "inc.yaml").exists()


@pytest.mark.parametrize(
    "content, says",
    [
        (b"[1, 2]\n", "edge.jsonl line 1: a JSON list, not an object"),
        (b'{"kind": "robot"}\ngarbage\n', "edge.jsonl line 2: not JSON (Expecting value)"),
        (b'{"kind": "request", "rtt_ms": 5}\n', "edge.jsonl line 1: a request record needs t"),
        (b'{"kind": "transition", "t": 1.0}\n', "edge.jsonl line 1: a transition record needs to"),
        (b"\xff\xfe\n", "edge.jsonl: not a text file"),
        (b"", "edge.jsonl holds no request or transition records"),  # was a 0-fault scenario, exit 0
    ],
)
def test_an_edge_log_that_is_not_one_is_refused_naming_the_file_and_line(tmp_path, capsys, content, says):
    (tmp_path / "edge.jsonl").write_bytes(content)
    assert _incident(tmp_path, tmp_path / "edge.jsonl", "--from", 0, "--to", 5) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err
    assert not (tmp_path / "inc.yaml").exists()


def test_a_window_that_holds_none_of_the_records_is_refused_with_their_span(tmp_path, capsys):
    (tmp_path / "edge.jsonl").write_text('{"kind": "request", "t": 1.0, "rtt_ms": 5, "outcome": "ok"}\n')
    assert _incident(tmp_path, tmp_path / "edge.jsonl", "--from", 10, "--to", 20) == 2
    assert "none of the 1 records" in capsys.readouterr().err


@pytest.mark.parametrize("content", ["garbage\n", "5\n[1]\n", ""])
def test_an_audit_file_without_an_audit_line_is_refused(tmp_path, capsys, content):
    """All garbage was read as no server load at all (a 0-fault scenario, exit 0); `5` was a traceback."""
    (tmp_path / "audit.jsonl").write_text(content)
    assert _incident(tmp_path, _edge_log(tmp_path), "--audit", tmp_path / "audit.jsonl", "--from", 0, "--to", 20) == 2
    assert f"--audit {tmp_path / 'audit.jsonl'} holds no audit line" in capsys.readouterr().err


def test_audit_lines_that_are_not_objects_are_skipped_as_torn_lines_are(tmp_path):
    (tmp_path / "audit.jsonl").write_text('5\n{"inference_ms": 4.0}\n["x"]\n{"inference_ms": 6.0}\n{"infer')
    assert incident.read_audit_lines([tmp_path / "audit.jsonl"]) == [{"inference_ms": 4.0}, {"inference_ms": 6.0}]


def test_a_directory_that_is_no_bench_run_or_lacks_the_robot_is_refused(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    assert _incident(tmp_path, tmp_path, "--robot", 3, "--from", 0, "--to", 5) == 2
    assert "is a directory without requests.parquet or transitions.parquet" in capsys.readouterr().err
    pq.write_table(
        pa.Table.from_pylist(
            [
                {
                    "robot": 0,
                    "t": 1.0,
                    "seq": 1,
                    "rtt_ms": 5.0,
                    "queue_wait_ms": 0.1,
                    "inference_ms": 3.0,
                    "network_ms": 2.0,
                    "outcome": "ok",
                }
            ]
        ),
        tmp_path / "requests.parquet",
    )
    pq.write_table(
        pa.Table.from_pylist(
            [{"robot": 1, "t": 0.5, "from_state": "CONNECTING", "to_state": "STREAMING", "reason": ""}]
        ),
        tmp_path / "transitions.parquet",
    )
    assert _incident(tmp_path, tmp_path, "--robot", 3, "--from", 0, "--to", 5) == 2
    assert "has no records of robot 3; its robots: 0, 1" in capsys.readouterr().err


def test_the_written_scenario_says_what_was_read(tmp_path, capsys):
    assert _incident(tmp_path, _edge_log(tmp_path), "--from", 0, "--to", 20) == 0
    assert (
        f"from {len(_log().requests)} request(s) and {len(_log().transitions)} transition(s) in the window"
        in capsys.readouterr().err
    )


def test_an_answered_request_without_a_round_trip_is_not_spread_over_the_window():
    """Its send time is unknown: it was `int(nan)`, "cannot convert float NaN to integer"."""
    log = _log()
    log.requests.append({"t": 2.0, "outcome": "ok", "network_ms": 900.0})
    assert incident.reconstruct(log, 20.0, audit=[])["faults"] == incident.reconstruct(_log(), 20.0, audit=[])["faults"]


def _example_scenario(tmp_path: Path, t_from: float, t_to: float) -> dict:
    """The scenario `bench incident --no-run` writes from the shipped example's logs for the window."""
    import yaml

    tmp_path.mkdir(exist_ok=True)
    args = ("--audit", EXAMPLE / "audit.jsonl", "--from", t_from, "--to", t_to)
    assert _incident(tmp_path, EXAMPLE / "edge-log.jsonl", *args) == 0
    return yaml.safe_load((tmp_path / "inc.yaml").read_text())


@pytest.mark.parametrize(
    "t_from, t_to, clipped",
    [
        (0, 1e9, "0..26"),  # was a billion one-second delay cells walked one by one, and a 31-year scenario
        (-1e9, 26, "-6..26"),  # the example's records start at -5.3 s (the warm-up)
        (-1e9, 1e9, "-6..26"),
    ],
)
def test_a_window_past_the_records_is_clipped_to_them_and_said(tmp_path, capsys, t_from, t_to, clipped):
    written = _example_scenario(tmp_path, t_from, t_to)
    err = capsys.readouterr().err
    assert (
        f"--from {t_from:g} --to {t_to:g} runs past the records of {EXAMPLE / 'edge-log.jsonl'} "
        f"(their t runs -5.31123..25.9966 s): window clipped to {clipped} s" in err
    ), err
    header = (tmp_path / "inc.yaml").read_text().splitlines()[0]
    assert f"window {clipped} s (--from {t_from:g} --to {t_to:g} clipped to the records)" in header
    lo, hi = map(float, clipped.split(".."))
    assert written["duration_s"] == hi - lo
    assert written["faults"] == _example_scenario(tmp_path / "inside", lo, hi)["faults"], (
        "the same scenario as the window asked inside the records"
    )


def test_a_clipped_window_is_still_a_stutter_bin_long():
    log = EdgeLog({}, [_req(3.1)], [])
    assert incident.clip_window(log, -100.0, 3.2) == (2.7, 3.2)  # clipped to 3..3.2 s would be shorter than a bin
    assert incident.clip_window(log, 3.05, 100.0) == (3.05, 4.0)
    assert incident.clip_window(log, 0.0, 4.0) == (3.0, 4.0)


def test_a_window_after_the_last_record_is_refused_though_a_state_carries_into_it(tmp_path, capsys):
    """It was a scenario of the robot's last state alone; with clipping it would be half a second of it."""
    assert _incident(tmp_path, _edge_log(tmp_path), "--from", 50, "--to", 60) == 2
    assert "none of the 38 records" in capsys.readouterr().err and not (tmp_path / "inc.yaml").exists()
