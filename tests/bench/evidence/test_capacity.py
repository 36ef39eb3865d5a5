"""Sweeps as load tests (bench.evidence.capacity): knee, goodput, the P10 formula and the sweep's own verdict."""

from __future__ import annotations

import math

import pytest

from bench.evidence import capacity
from bench.evidence.exitcode import Exit
from bench.scenario import sweeps
from bench.scenario.load import ScenarioError, parse_scenario


def _row(value, verdict, thr=10.0, inf=20.0, net=1.0, rate=1.0):
    return {
        "value": value,
        "verdict": verdict,
        "requests_per_robot_s": rate,
        "inference_ms_p50": inf,
        "network_ms_p50": net,
        "throughput_rps": thr,
        "goodput_rps": thr,
        "goodput_ratio": 1.0,
        "queue_wait_ms_p50": 0.1,
        "queue_wait_ms_p95": 0.5,
        "rtt_ms_p50": 22.0,
        "rtt_ms_p99": 30.0,
        "none_tick_ratio": 0.0,
        "groups": {},
    }


def test_p10_formula_takes_the_smaller_bound():
    # Pi0-class: 150 ms, 1 Hz, H=10 at 15 Hz, 1 ms RTT
    f = capacity.n_max(1.0, 0.150, 10, 1 / 15, 0.001)
    assert f["utilization_bound"] == pytest.approx(0.8 / 0.15)
    assert f["latency_bound"] == pytest.approx((10 / 15 / 2 - 0.001) / 0.15)
    assert f["n_max"] == min(f["utilization_bound"], f["latency_bound"])
    assert math.isnan(capacity.n_max(0, 0.1, 10, 0.1, 0)["n_max"])


def test_knee_is_the_last_value_before_the_first_failure():
    rows = [_row(8, "pass"), _row(16, "pass"), _row(24, "fail"), _row(32, "pass")]
    assert capacity.knee_of(rows) == (16, 24)
    assert capacity.knee_of([_row(1, "fail")]) == (None, 1)
    assert capacity.knee_of([_row(1, "pass")]) == (1, None)


def test_the_knee_is_read_again_without_the_bench_s_share():
    """A step that failed only on figures the bench host inflated (every failed assertion passes again less the
    bench's measured share) counts as passing in `knee_without_bench`; the knee itself is the run's."""

    def summary(verdict, *assertions):
        return {"verdict": verdict, "figures": {}, "assertions": list(assertions)}

    fail_bench = {
        "expression": "goodput_ratio >= 0.95",
        "result": "fail",
        "value": 0.94,
        "without_bench": {"value": 0.97, "result": "pass"},
    }
    fail_system = {
        "expression": "goodput_ratio >= 0.95",
        "result": "fail",
        "value": 0.5,
        "without_bench": {"value": 0.6, "result": "fail"},
    }
    unchanged = {"expression": "staleness_violations == 0", "result": "fail", "value": 3}
    ok = {"expression": "none_tick_ratio < 0.05", "result": "pass", "value": 0.0}
    assert capacity.verdict_without_bench(summary("pass", ok)) == "pass"
    assert capacity.verdict_without_bench(summary("fail", ok, fail_bench)) == "pass"
    assert capacity.verdict_without_bench(summary("inconclusive", fail_bench, unchanged)) == "fail"
    assert capacity.verdict_without_bench(summary("fail", fail_system)) == "fail"
    assert capacity.verdict_without_bench(summary("error")) is None
    rows = [
        capacity.step_row(v, summary(*spec))
        for v, spec in ((1, ("pass", ok)), (4, ("fail", fail_bench)), (16, ("fail", fail_system)))
    ]
    cap = capacity.capacity_report(rows, horizon=10, dt_s=1 / 15, formula=None)
    assert (cap["figures"]["knee"], cap["figures"]["first_failure"]) == (1, 4)
    assert (cap["figures"]["knee_without_bench"], cap["figures"]["first_failure_without_bench"]) == (4, 16)
    assert "without the bench's measured share: knee 4, first failing 16" in capacity.format_capacity(cap)


def test_capacity_report_measures_from_the_lightest_step_and_gives_the_ratio():
    rows = [_row(4, "pass", inf=25.0), _row(8, "pass", inf=60.0), _row(12, "fail")]
    cap = capacity.capacity_report(rows, horizon=10, dt_s=1 / 15, formula={"r_hz": 1, "t_ms": 20})
    m = cap["formula_measured"]
    assert m["t_ms"] == 25.0  # the lightest step: no queueing in it
    assert cap["figures"]["knee"] == 8
    assert cap["figures"]["knee_ratio"] == pytest.approx(8 / m["n_max"])
    assert cap["formula_nominal"]["t_ms"] == 20
    assert "knee (last step holding every assertion): 8" in capacity.format_capacity(cap)


def test_each_step_shows_the_server_s_overhead_beside_the_network_time():
    """network_ms holds the replica's own time outside its queue and forward pass: the table splits it out."""
    figures = {
        "rtt_ms": {"count": 100, "p50": 30.0, "p99": 40.0},
        "network_ms": {"p50": 10.4},
        "server_overhead_ms": {"p50": 7.2},
        "inference_ms": {"p50": 12.0},
    }
    row = capacity.step_row(64, {"verdict": "pass", "duration_s": 10, "robots": 64, "figures": figures})
    assert row["server_overhead_ms_p50"] == 7.2 and row["network_ms_p50"] == 10.4
    head, line = capacity.format_table([row]).splitlines()
    assert "compute p50 net p50 srv p50  rtt p99" in head
    assert line.split()[6:10] == ["12.0", "10.4", "7.2", "40.0"]  # compute, net, srv, rtt p99
    assert capacity.format_table([_row(8, "pass")]).splitlines()[1].split()[8] == "-"  # a summary without it


def test_sweep_assertions_fail_when_no_step_held_the_target():
    cap = capacity.capacity_report([_row(2, "fail")], horizon=10, dt_s=1 / 15, formula=None)
    (res,) = sweeps.evaluate_sweep_assertions(["knee >= 2"], cap["figures"])
    assert res["result"] == "fail"  # no knee is no data, and no data never passes
    ok = sweeps.evaluate_sweep_assertions(
        ["knee_ratio > 0.5 and steps == 1"], {"knee": 4, "knee_ratio": 0.8, "steps": 1}
    )
    assert ok[0]["result"] == "pass"
    bad = sweeps.evaluate_sweep_assertions(["rtt_ms < 3"], {"knee": 1})
    assert bad[0]["result"] == "error" and "sweep figures" in bad[0]["error"]


BASE = """
name: cap
duration_s: 5
fleet: {groups: [{name: fleet, robot: reacher, count: 2, site: lab}]}
sites: {lab: lan}
servers: {replicas: [{id: r0, checkpoint: reacher}]}
"""


def test_capacity_sweep_section_is_validated():
    s = parse_scenario(
        BASE + "sweep: {key: fleet.groups.fleet.count, values: [1, 2], mode: capacity, assertions: ['knee >= 1']}\n"
    )
    assert s.sweep["mode"] == "capacity" and s.sweep["stop_after_failure"] is True
    with pytest.raises(ScenarioError, match=r"sweep.assertions\[0\]: unknown sweep figure 'kneee'"):
        parse_scenario(BASE + "sweep: {key: fleet.groups.fleet.count, values: [1], assertions: ['kneee >= 1']}\n")
    with pytest.raises(ScenarioError, match="sweep.mode"):
        parse_scenario(BASE + "sweep: {key: fleet.groups.fleet.count, values: [1], mode: knee}\n")


def test_assertions_take_arithmetic_for_relative_bounds():
    from bench.scenario.assertions import Figures, evaluate

    f = Figures(groups={"a": Figures(scalars={"seam_jerk_p95": 0.1}), "b": Figures(scalars={"seam_jerk_p95": 0.12})})
    assert evaluate("group[b].seam_jerk_p95 < 1.5 * group[a].seam_jerk_p95", f).passed
    assert not evaluate("group[b].seam_jerk_p95 < group[a].seam_jerk_p95 + 0.01", f).passed
    assert not evaluate("group[b].seam_jerk_p95 / 0 < 1", f).passed  # inf


def test_bench_sweep_builds_the_sweep_section_and_rejects_a_bad_key(tmp_path, capsys):
    from bench import cli

    path = tmp_path / "cap.yaml"
    path.write_text(BASE)
    rc = cli.main(
        [
            "sweep",
            str(path),
            "--key",
            "fleet.groups.fleet.cuont",
            "--values",
            "1,2",
            "--capacity",
            "--reports",
            str(tmp_path),
        ]
    )
    assert rc == Exit.INVALID
    assert "sweep.key" in capsys.readouterr().err
    rc = cli.main(
        [
            "sweep",
            str(path),
            "--key",
            "fleet.groups.fleet.count",
            "--values",
            "1",
            "--assert",
            "knee >",
            "--reports",
            str(tmp_path),
        ]
    )
    assert rc == Exit.INVALID  # the sweep assertion is checked before anything runs
