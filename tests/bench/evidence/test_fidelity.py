"""The twin's self-measurement (bench.evidence.fidelity): each figure from known inputs, the reasons it
writes, and the verdict it turns (inconclusive only when an assertion failed and fidelity is out)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import numpy as np
import pyarrow as pa
import pytest

from bench.evidence import fidelity as fid
from bench.evidence import report
from bench.evidence.figures import RunData
from bench.fleet.ticks import HOST_LATE, ON_TIME
from bench.scenario.assertions import AssertionResult
from bench.scenario.model import Fidelity
from chaos.toxiproxy.fidelity import EDGES_MS, LegStats, subtract

TOL = Fidelity().model_dump()


def _leg(errors_ms, asked_ms=25.0, nbytes=100):
    leg = LegStats()
    for e in errors_ms:
        leg.record(nbytes, asked_ms / 1e3, (asked_ms + e) / 1e3)
    return leg.to_json()


def test_leg_error_percentiles_and_tolerance():
    g = fid.leg_figures("eu", "upstream", _leg([0.3] * 95 + [40.0] * 5), list(EDGES_MS), TOL)
    assert g["leg"] == "uplink" and g["chunks"] == 100 and g["asked_ms_mean"] == 25.0
    assert 0.3 <= g["error_ms_p50"] <= 0.4  # the bin's upper edge
    assert 40.0 <= g["error_ms_p99"] <= 46.0 and g["error_ms_max"] == 40.0
    assert g["tolerance_ms"] == 5.0  # max(5 ms, 20 % of 25 ms)
    reasons = fid.judge([g], [], [], TOL)
    assert reasons and reasons[0].startswith("site eu uplink:") and "25.0 ms the profile asked" in reasons[0]
    g = fid.leg_figures("eu", "upstream", _leg([0.3] * 100, asked_ms=300.0), list(EDGES_MS), TOL)
    assert g["tolerance_ms"] == 60.0 and not fid.judge([g], [], [], TOL)


def test_leg_window_excludes_the_warmup():
    start = _leg([100.0] * 10)
    leg = LegStats()
    for e in [100.0] * 10 + [0.5] * 50:
        leg.record(100, 0.025, 0.025 + e / 1e3)
    g = fid.leg_figures("eu", "downstream", subtract(leg.to_json(), start), list(EDGES_MS), TOL)
    assert g["chunks"] == 50 and g["error_ms_p99"] <= 0.6


def test_a_leg_keeps_the_range_of_what_its_toxics_asked_through_windows_and_proxies():
    from chaos.toxiproxy.fidelity import add

    leg = LegStats()
    for asked in (23.0, 27.0, 25.5):
        leg.record(100, asked / 1e3, asked / 1e3)
    j = leg.to_json()
    assert (j["asked_ms_min"], j["asked_ms_max"]) == (23.0, 27.0)
    assert LegStats().to_json()["asked_ms_max"] is None  # nothing asked yet: no range
    # a range does not subtract (the window's is within the run's), and a site's proxies on several nodes widen it
    assert subtract(j, _leg([0.0], asked_ms=24.0))["asked_ms_min"] == 23.0
    other = _leg([0.0], asked_ms=31.0)
    both = add([{"upstream": j}, {"upstream": other}, {"upstream": LegStats().to_json()}])["upstream"]
    assert (both["asked_ms_min"], both["asked_ms_max"], both["chunks"]) == (23.0, 31.0, 4)


def test_a_robot_side_hop_beyond_what_its_proxy_asked_is_the_bench_s():
    rng = np.random.default_rng(5)
    asked = rng.uniform(23.0, 27.0, 300)  # wan_50ms: 25 +/- 2 ms each way
    hop = asked + 0.3  # the loopback hops' floor
    hop[:10] += 60.0  # a shard that held its GIL 60 ms before its callback ran
    legs = {
        "eu": {"edges_ms": list(EDGES_MS), "downstream": _leg([0.5] * 300, asked_ms=25.0)},
        "lab": {"edges_ms": list(EDGES_MS), "downstream": LegStats().to_json()},
    }
    legs["eu"]["downstream"].update(asked_ms_min=23.0, asked_ms_max=27.0)
    lab = np.full(50, 0.4)
    lab[0] = 9.4
    site = np.array(["eu"] * 300 + ["lab"] * 50 + ["ap"] * 30 + [""], dtype=object)
    part, info = fid.robot_hop_excess(np.concatenate([hop, lab, np.full(30, 30.0), [5.0]]), site, legs, "downstream")
    eu = info["eu"]
    assert eu["asked_ms_max"] == 27.0 and 0.0 <= eu["floor_ms"] <= 0.4 and eu["error_ms_p50"] == pytest.approx(0.5)
    # at most the true bench share of a stalled request, and within the asked range's width of it
    assert (part[:10] <= 60.0 + 1e-3).all() and (part[:10] >= 60.0 - 4.0 - 0.4).all()
    # a quiet request reads the proxy's p50 error: what the profile explains is the system's
    assert np.allclose(part[10:300], 0.5, atol=1e-4)
    # a leg with no toxic asks nothing: the hop beyond its floor
    assert info["lab"]["asked_ms_max"] == 0.0 and part[300] == pytest.approx(9.0, abs=1e-3)
    # a site whose proxy was not counted (ap), or a robot without a site: not measured
    assert np.isnan(part[350:]).all() and "ap" not in info


def test_a_request_s_hop_is_bounded_by_what_was_asked_around_its_own_time():
    leg = LegStats()
    for now, asked in ((100.02, 0.025), (100.09, 0.027), (100.15, 0.600), (100.31, 0.024)):  # a burst's queue
        leg.record(100, asked, asked, now)
    by_s = leg.asked_json()
    assert by_s["t0_s"] == 100.0 and by_s["bucket_s"] == 0.1
    assert np.allclose(by_s["asked_ms_max"], [27.0, 600.0, 0.0, 24.0])
    start = np.array([100_010.0, 100_090.0, 100_220.0, 100_305.0, 99_000.0, np.nan])
    end = np.array([100_030.0, 100_102.0, 100_230.0, 100_308.0, 99_030.0, 5.0])
    around = fid.asked_around(by_s, start, end)
    assert np.allclose(around[:5], [27.0, 600.0, 0.0, 24.0, 0.0]) and np.isnan(around[5])
    # a proxy that kept whole seconds (no bucket_s) reads as such
    assert (
        fid.asked_around({"t0_s": 100, "asked_ms_max": [5.0, 9.0]}, np.array([100_500.0]), np.array([101_200.0]))[0]
        == 9.0
    )
    # a stalled request outside the burst is bounded by its own second, not by the run's 600 ms
    legs = {"ap": {"edges_ms": list(EDGES_MS), "downstream": leg.to_json()}}
    hop = np.concatenate([np.full(30, 25.5), [95.0]])
    site = np.array(["ap"] * 31, dtype=object)
    t = np.full(31, 100_380.0)
    part, info = fid.robot_hop_excess(hop, site, legs, "downstream", {"ap": by_s}, (t - hop, t))
    assert info["ap"]["asked_by_time"] and info["ap"]["asked_ms_max"] == 600.0
    assert part[-1] == pytest.approx(95.0 - 24.0 - info["ap"]["floor_ms"], abs=1e-3)  # 100.2-100.3 s: 24 asked
    whole, _ = fid.robot_hop_excess(hop, site, legs, "downstream")
    assert whole[-1] == pytest.approx(info["ap"]["error_ms_p50"], abs=1e-3)  # the run's most asked explains it all


def test_a_long_run_keeps_the_last_hour_of_asked_maxima_and_says_what_it_let_go(monkeypatch):
    from chaos.toxiproxy import fidelity as proxy_fidelity

    monkeypatch.setattr(proxy_fidelity, "ASKED_BUCKETS_KEPT", 50)  # 5 s instead of an hour
    leg = LegStats()
    for k in range(150):  # 15 s of chunks, one per 100 ms, each asking k ms
        leg.record(100, k / 1e3, k / 1e3, 1000.0 + k / 10 + 0.01)
    j = leg.asked_json()
    assert j["dropped"] and 50 <= len(j["asked_ms_max"]) < 100 and len(leg.asked_by_s) == len(j["asked_ms_max"])
    first = round((j["t0_s"] - 1000.0) * 10)
    assert np.allclose(j["asked_ms_max"], np.arange(first, 150))  # each kept bucket still holds its own chunk
    # a request from before what was kept is not bounded by it (unknown, not nothing asked)
    around = fid.asked_around(j, np.array([1000_500.0, 1014_500.0]), np.array([1000_550.0, 1014_550.0]))
    assert np.isnan(around[0]) and around[1] == pytest.approx(145.0)


def test_leg_without_toxics_is_not_judged():
    g = fid.leg_figures("lab", "downstream", LegStats().to_json(), list(EDGES_MS), TOL)
    assert g["chunks"] == 0 and "no toxic" in g["note"] and not fid.judge([g], [], [], TOL)


def test_bandwidth_delivered_against_asked():
    leg = LegStats()
    leg.record(1000, 0.004, 0.004)
    leg.shaped(250_000, 1.0, 1.25, 250)  # 250 kB that an ideal 250 kB/s link sends in 1 s took 1.25 s
    g = fid.leg_figures("eu", "upstream", leg.to_json(), list(EDGES_MS), TOL)
    assert g["bandwidth"] == {"asked_kBps": 250.0, "delivered_kBps": 200.0, "ratio": 0.8}
    assert any("delivered 200 kB/s" in r for r in fid.judge([g], [], [], TOL))


def _run_data(late_every: int) -> RunData:
    robots = {"robot": np.array([0, 1]), "shard": np.array([0, 1])}
    t = np.repeat(np.arange(0, 10, 0.1), 2)
    robot = np.tile([0, 1], 100)
    cls = np.full(200, ON_TIME, np.int8)
    cls[(robot == 1) & (np.arange(200) % late_every == 1)] = HOST_LATE
    loop = {
        "t": np.arange(0, 10, 0.5).repeat(2),
        "shard": np.tile([0, 1], 20),
        "overrun": np.zeros(40, bool),
        "wall_ms": np.full(40, 3.0),
        "cpu_ms": np.full(40, 2.0),
    }
    loop["wall_ms"][5] = 400.0  # shard 1 waited ~400 ms for a core once
    loop["overrun"][5] = True
    return RunData(
        robots=robots,
        ticks={"robot": robot, "t": t, "tick_class": cls},
        requests={},
        transitions={},
        episodes={},
        loop=loop,
        duration_s=10.0,
    )


def test_shard_figures_and_reasons_name_the_shard():
    shards = fid.shard_figures(_run_data(late_every=10), 10.0)
    s0, s1 = shards
    assert s0["host_late_ratio"] == 0.0 and s0["scheduler_wait_ms_max"] == 1.0
    assert s1["ticks"] == 100 and s1["host_late_ratio"] == 0.2 and s1["loop_overrun_ratio"] == 0.05
    assert s1["scheduler_wait_ms_max"] == 398.0
    reasons = fid.judge([], shards, [], TOL)
    assert all(r.startswith("shard 1:") for r in reasons) and len(reasons) == 2  # host-late and the 398 ms wait


def _cpu(t_s, host, ours):  # one sample a second: host % of all cores, the run's processes in % of one core
    return [
        {"t": float(t), "host_percent": host(t), "processes": {"router": ours / 2, "shard:0": ours / 2}} for t in t_s
    ]


def test_outside_load_moving_between_the_drift_windows_is_named_only_where_a_drift_is_judged():
    # 1,800 s on 2 cores: the run holds 50 % of one core (25 % of the host); outside it, 38 % of the host in
    # the first 300 s and 2 % in the last (what the second soak saw)
    samples = _cpu(range(-5, 1801), lambda t: 25.0 + (38.0 if t < 300 else 2.0 if t > 1500 else 15.0), 50.0)
    bg = fid.other_load(samples, cores=2, duration_s=1800.0)
    assert bg["first_window_s"] == [0.0, 300.0] and bg["last_window_s"] == [1500.0, 1800.0]
    assert bg["first_percent"] == 38.0 and bg["last_percent"] == 2.0 and bg["shift"] == -0.36
    (reason,) = fid.judge([], [], [], TOL, bg)
    assert "38 % of the cores in the first 300 s, 2 % in the last (tolerance 5 points)" in reason
    assert fid.judge([], [], [], TOL, None) == []  # no drift assertion: not judged
    steady = fid.other_load(_cpu(range(0, 61), lambda t: 40.0 + (5.0 if t > 50 else 0.0), 50.0), 2, 60.0)
    assert steady["first_window_s"] == [0.0, 10.0] and abs(steady["shift"]) <= 0.05  # a sixth of a short run
    assert fid.judge([], [], [], TOL, steady) == []
    assert fid.other_load([], 2, 60.0) is None


def test_replica_forward_ratio_against_its_unloaded_time_at_the_batch_size(tmp_path):
    log = tmp_path / "server-r0.log"
    log.write_text("x\nINFO unloaded forward ms by batch size: {\"1\": 2.0, \"2\": 3.0, \"4\": 5.0}\n")
    ref = fid.unloaded_forward(log)
    assert ref == {1: 2.0, 2: 3.0, 4: 5.0}
    rows = [{"replica": "r0", "outcome": "ok", "forward_ms": 6.0, "batch": 2, "mono_ms": 1000.0 + i} for i in range(9)]
    rows.append({"replica": "r0", "outcome": "ok", "forward_ms": 14.0, "batch": 8, "mono_ms": 1009.0})  # 14 / 9 ms
    out = fid.replica_figures(pa.Table.from_pylist(rows), {"r0": ref, "r1": None}, (0.0, 5000.0))
    r0, r1 = out
    assert r0["requests"] == 10 and r0["forward_ratio_p50"] == 2.0 and "not judged" in r1["note"]
    reasons = fid.judge([], [], out, TOL)
    assert reasons == [] or reasons[0].startswith("replica r0")
    assert fid.judge([], [], out, {**TOL, "forward_ratio": 1.5})[0].startswith(
        "replica r0: its forward pass took 2.00x"
    )


def test_a_cheap_forward_pass_is_starved_only_when_it_also_loses_milliseconds():
    """2x of a 1.5 ms pass is one context switch on a busy host: judged only past `forward_excess_ms` too."""
    rows = [{"replica": "r1", "outcome": "ok", "forward_ms": 3.2, "batch": 1, "mono_ms": 1000.0 + i} for i in range(5)]
    out = fid.replica_figures(pa.Table.from_pylist(rows), {"r1": {1: 1.5}}, (0.0, 5000.0))
    assert out[0]["forward_ratio_p50"] > TOL["forward_ratio"] and out[0]["forward_excess_ms_p50"] == 1.7
    assert fid.judge([], [], out, TOL) == []
    assert "starved of CPU" in fid.judge([], [], out, {**TOL, "forward_excess_ms": 1.0})[0]


def _outcome(tmp_path, passed: bool, valid: bool) -> report.RunOutcome:
    f = {
        "valid": valid,
        "reasons": [] if valid else ["shard 0: 5.00 % of its ticks were late because of the bench host"],
        "legs": [],
        "shards": [],
        "replicas": [],
        "tolerances": TOL,
    }
    results = [AssertionResult("ticks > 1", passed, 5)]
    return report.RunOutcome(
        "t", "", tmp_path, report.verdict_of(results, None, f), "now", 1.0, 1.0, 1, results, meta={"fidelity": f}
    )


def test_verdict_inconclusive_only_for_a_failure_with_bad_fidelity(tmp_path):
    assert _outcome(tmp_path, False, False).verdict == "inconclusive"
    assert _outcome(tmp_path, False, True).verdict == "fail"
    assert _outcome(tmp_path, True, False).verdict == "pass"  # a pass stays a pass, with the warning
    o = _outcome(tmp_path, False, False)
    assert o.exit_code == 3
    report.write_all(o)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["verdict"] == "inconclusive" and summary["exit_code"] == 3 and not summary["fidelity"]["valid"]
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite.get("failures") == "0" and suite.get("skipped") == "1"
    assert "shard 0" in suite.find("testcase/skipped").get("message")
    page = (tmp_path / "report.html").read_text()
    assert "INCONCLUSIVE" in page and "<h2>Fidelity</h2>" in page
    o = _outcome(tmp_path, True, False)
    report.write_all(o)
    assert "Warning: the bench host was out of its fidelity tolerances" in (tmp_path / "report.html").read_text()


def test_the_report_tells_the_bench_share_away_from_faults_from_the_one_around_them(tmp_path):
    o = _outcome(tmp_path, True, True)
    o.meta["fidelity"]["bench_share"] = {
        "rtt_ms": {
            "p50": 4.2,
            "p99": 50.3,
            "steady": {"p50": 3.9, "p99": 6.1, "requests": 900},
            "around_faults": {"p50": 5.0, "p99": 61.0, "requests": 300},
            "by_fault": [
                {"fault": "partition site:eu", "t_start": 40.0, "p50": 4.0, "p99": 12.0, "requests": 200},
                {"fault": "restart server:r1", "t_start": 80.0, "p50": 6.0, "p99": 97.0, "requests": 100},
            ],
        }
    }
    report.write_all(o)
    page = (tmp_path / "report.html").read_text()
    assert "6.1 for the 900 requests away from the faults" in page and "61 for the 300 sent in a fault window" in page
    assert "restart server:r1 at t 80 s: 6 / 97 (100 requests)" in page
    lines = "\n".join(fid.table_lines({**o.meta["fidelity"], "legs": [{"error_ms_p99": None}]}))  # a judged run
    assert "restart server:r1 at t 80 s (100 requests): ~6.0 / ~97.0 ms" in lines


def test_report_figures_render_with_fault_windows(tmp_path):
    d = _run_data(late_every=10)
    windows = [(2.0, 4.0, "partition site:eu")]
    assert "Host-late ticks per shard" in report._shard_fidelity_chart(d, windows)
    assert "Worst scheduler wait per shard" in report._sched_wait_chart(d, windows)

    def snap(n, err):
        return {"eu": {"upstream": {"chunks": n, "error_ms_sum": err}, "downstream": {"chunks": 0}}}

    series = fid.LegErrorSeries()
    for t, n, err in ((0.0, 0, 0.0), (1.0, 10, 30.0), (2.0, 10, 30.0), (3.0, 14, 50.0)):
        series.add(t, snap(n, err))
    # one point per second that moved chunks: its mean error over that second's chunks only
    assert series.to_json() == {"eu uplink": {"t": [1.0, 3.0], "error_ms": [3.0, 5.0]}}
    chart = report._leg_error_chart(series.to_json(), 10.0, windows)
    assert "eu uplink" in chart and "<polyline" in chart
    chart = report._forward_ratio_chart({"r0": ([0.0, 1.0], [1.0, 2.5])}, 10.0, windows)
    assert "replica r0" in chart and "rgba(214,39,40" in chart  # the fault window is shaded


def test_a_run_in_which_no_robot_ticked_is_not_judged():
    """A run that failed to start has no legs or shards to judge: the table says so instead of VALID."""
    from bench.evidence.fidelity import table_lines

    unstarted = {
        "valid": True,
        "reasons": [],
        "legs": [],
        "shards": [],
        "replicas": [{"replica": "r0", "forward_ms_p50": None, "forward_ratio_p50": None, "forward_ratio_p99": None}],
    }
    assert table_lines(unstarted) == ["  fidelity: not judged (no robot ticked)"]
    ran = {
        **unstarted,
        "shards": [{"shard": 0, "host_late_ratio": 0.0, "loop_overrun_ratio": 0.0, "scheduler_wait_ms_max": 1.0}],
    }
    lines = table_lines(ran)
    assert lines[0] == "  fidelity: VALID" and not any("replica r0" in line for line in lines)  # it answered nothing


def test_the_vm_slowing_between_the_drift_windows_is_named_where_a_drift_is_judged():
    # the 2026-11-26 09:11 soak: outside load steady at ~1 %, the speed probe's median 34.8 -> 45.7 ms
    samples = _cpu(range(0, 1801), lambda t: 26.0, 50.0)
    for x in samples:
        x["speed_probe_ms"] = 34.8 if x["t"] < 300 else 45.7 if x["t"] > 1500 else 40.0
    bg = fid.other_load(samples, cores=2, duration_s=1800.0)
    assert bg["probe_first_ms"] == 34.8 and bg["probe_last_ms"] == 45.7 and bg["probe_shift"] == 0.313
    (reason,) = fid.judge([], [], [], TOL, bg)
    assert "34.8 ms in the first, 45.7 in the last (+31 %, tolerance 15 %)" in reason
    for x in samples:  # a steady VM: nothing to say
        x["speed_probe_ms"] = 35.0 + (2.0 if x["t"] > 1500 else 0.0)
    assert fid.judge([], [], [], TOL, fid.other_load(samples, 2, 1800.0)) == []


def test_a_window_s_speed_is_the_mean_of_a_vm_flipping_between_two_phases():
    # the 2-core VM flips between a ~30 ms and a ~47 ms phase within seconds: a window slow 40 % of the time has
    # the median 30, one slow 60 % the median 47 (+57 %, a shift fidelity would call); their speeds differ by +9 %
    samples = _cpu(range(0, 1801), lambda t: 26.0, 50.0)
    for x in samples:
        t = int(x["t"])
        slow_share = 0.4 if t < 900 else 0.6
        x["speed_probe_ms"] = 47.0 if (t % 10) < slow_share * 10 else 30.0
    bg = fid.other_load(samples, cores=2, duration_s=1800.0)
    assert bg["probe_first_ms"] == pytest.approx(30 + 0.4 * 17, abs=0.2)
    assert bg["probe_last_ms"] == pytest.approx(30 + 0.6 * 17, abs=0.2)
    assert bg["probe_shift"] == pytest.approx(3.4 / 36.8, abs=0.01)  # +9 %: within the 15 % tolerance
    assert fid.judge([], [], [], TOL, bg) == []


def test_the_bench_share_adds_every_site_of_a_direction_and_leaves_an_unstamped_leg_unmeasured():
    edges = list(EDGES_MS)
    legs = {
        "eu": {"edges_ms": edges, "upstream": _leg([0.5] * 90), "downstream": _leg([1.5] * 100)},
        "us": {"edges_ms": edges, "upstream": _leg([8.0] * 10), "downstream": _leg([1.5] * 100)},
        "lab": {"edges_ms": edges, "upstream": LegStats().to_json(), "downstream": LegStats().to_json()},
    }
    replicas = [
        {"replica": "r0", "requests": 300, "forward_excess_ms_p50": 4.0},
        {"replica": "r1", "requests": 100, "forward_excess_ms_p50": -1.0},  # faster than unloaded: no share
        {"replica": "r2", "requests": 0, "forward_excess_ms_p50": None},
    ]
    share = fid.bench_share(legs, replicas)
    up = share["uplink_ms"]
    # chunk-weighted: 90 of eu's at 0.5 ms and 10 of us's at 8 ms, so p50 is eu's and p99 is us's
    assert 0.5 <= up["p50"] <= 0.6 and 8.0 <= up["p99"] <= 9.2
    assert (up["sites_measured"], up["sites"]) == (2, 3)  # lab's leg forwards untouched: unmeasured
    assert 1.5 <= share["downlink_ms"]["p50"] <= 1.6
    assert share["inference_ms"] == {"p50": 3.0, "replicas": 2}  # (4 x 300 + 0 x 100) / 400
    assert share["rtt_ms"]["p50"] == pytest.approx(up["p50"] + share["downlink_ms"]["p50"] + 3.0)
    assert fid.bench_share({}, []) == {}  # nothing measured: no share, not a zero one


def test_the_latency_budget_says_what_of_each_row_the_bench_added(tmp_path):
    edges = list(EDGES_MS)
    legs = {"eu": {"edges_ms": edges, "upstream": _leg([1.0] * 100), "downstream": _leg([2.0] * 100)}}
    f = {"bench_share": fid.bench_share(legs, [{"replica": "r0", "requests": 5, "forward_excess_ms_p50": 3.0}])}
    rows = {r["figure"]: r for r in report.latency_budget({"rtt_ms": {"p50": 80.0}}, f)}
    assert 1.0 <= rows["uplink_ms"]["bench_p50_ms"] <= 1.1 and 2.0 <= rows["downlink_ms"]["bench_p50_ms"] <= 2.1
    assert rows["network_ms"]["bench_p50_ms"] == pytest.approx(
        rows["uplink_ms"]["bench_p50_ms"] + rows["downlink_ms"]["bench_p50_ms"]
    )
    assert rows["inference_ms"]["bench_p50_ms"] == 3.0 and rows["inference_ms"]["bench_p99_ms"] is None
    assert rows["encode_ms"]["bench_p50_ms"] is None and rows["queue_wait_ms"]["bench_p50_ms"] is None
    assert rows["rtt_ms"]["p50_ms"] == 80.0 and rows["rtt_ms"]["bench_p50_ms"] == f["bench_share"]["rtt_ms"]["p50"]
    assert all(r["bench_p50_ms"] is None for r in report.latency_budget({}, None))
    lines = fid.table_lines(
        {
            "valid": True,
            "legs": [],
            "shards": [{"shard": 0, "host_late_ratio": 0.0, "loop_overrun_ratio": 0.0, "scheduler_wait_ms_max": 1}],
            "replicas": [],
            "bench_share": f["bench_share"],
        }
    )
    assert any(x.startswith("    the bench's share of the round trip: ~") and "inference 3.0" in x for x in lines)


def test_the_shards_own_delays_outside_the_round_trip_are_in_the_bench_share_and_the_budget():
    requests = {"send_lag_ms": np.array([0.2] * 90 + [30.0] * 9 + [np.nan]), "merge_lag_ms": np.array([1.0] * 100)}
    share = fid.bench_share({}, [], requests)
    assert share["send_lag_ms"] == {"p50": 0.2, "p99": 30.0}  # the NaN (a timeout) left out
    assert share["merge_lag_ms"] == {"p50": 1.0, "p99": 1.0}
    assert "rtt_ms" not in share  # outside the round trip: not added to its share
    rows = {r["figure"]: r for r in report.latency_budget({"send_lag_ms": {"p50": 0.2}}, {"bench_share": share})}
    assert rows["send_lag_ms"]["p50_ms"] == 0.2 and rows["send_lag_ms"]["bench_p50_ms"] == 0.2
    assert "outside the rtt" in rows["merge_lag_ms"]["stage"]
    lines = fid.table_lines(
        {
            "valid": True,
            "legs": [],
            "shards": [{"shard": 0, "host_late_ratio": 0.0, "loop_overrun_ratio": 0.0, "scheduler_wait_ms_max": 1}],
            "replicas": [],
            "bench_share": share,
        }
    )
    assert any("observation -> send p50 0.2" in x for x in lines)


def test_the_client_s_encode_beyond_its_group_s_floor_is_the_bench_s_and_stays_outside_the_round_trip():
    # group a encodes ~0.4 ms quiet, b (bigger cameras) ~2.0 ms; each has a tail that waited for the shard's GIL
    encode = np.array([0.4] * 45 + [6.4] * 5 + [2.0] * 45 + [12.0] * 5 + [3.0] * 5)
    group = np.array(["a"] * 50 + ["b"] * 50 + ["c"] * 5)  # c: too few requests to read a floor
    part, floors = fid.encode_excess(encode, group)
    assert floors == {"a": 0.4, "b": 2.0}
    np.testing.assert_allclose(part[:100], np.concatenate([[0.0] * 45, [6.0] * 5, [0.0] * 45, [10.0] * 5]), atol=1e-6)
    assert np.isnan(part[100:]).all()
    requests = {"encode_ms": encode, "encode_bench_ms": part, "outcome": np.array(["ok"] * 105)}
    share = fid.bench_share({}, [], requests, encode_floors=floors)
    assert share["encode_ms"]["floor_ms"] == {"a": 0.4, "b": 2.0} and share["encode_ms"]["requests_measured"] < 1
    # p99: 12.0 with its bench part, 3.0 (c's, unmeasured) or 2.0 without: the share is their difference
    assert share["encode_ms"]["p99"] == pytest.approx(
        np.percentile(encode, 99) - np.percentile(encode - np.nan_to_num(part), 99), abs=1e-3
    )
    assert "rtt_ms" not in share  # outside the round trip: never taken off it
    rows = {r["figure"]: r for r in report.latency_budget({"encode_ms": {"p99": 12.0}}, {"bench_share": share})}
    assert rows["encode_ms"]["bench_p99_ms"] == share["encode_ms"]["p99"]
    lines = fid.table_lines(
        {
            "valid": True,
            "legs": [],
            "replicas": [],
            "bench_share": share,
            "shards": [{"shard": 0, "host_late_ratio": 0.0, "loop_overrun_ratio": 0.0, "scheduler_wait_ms_max": 1}],
        }
    )
    assert any("client encode beyond its floor p50 0.0 / p99" in x for x in lines), lines


def test_a_replica_faster_than_its_unloaded_reference_is_said_to_have_a_suspect_reference():
    """An H100 replica's loaded passes ran at 0.65x its unloaded time (the two timed different paths): the
    table says the reference is suspect instead of leaving a negative bench share unexplained."""
    shard = {"shard": 0, "host_late_ratio": 0.0, "loop_overrun_ratio": 0.0, "scheduler_wait_ms_max": 1.0}

    def replica_line(ratio):
        row = {
            "replica": "r0",
            "forward_ms_p50": 19.8,
            "forward_ratio_p50": ratio,
            "forward_ratio_p99": 1.06,
            "unloaded_ms": {1: 15.2, 64: 96.9},
        }
        lines = fid.table_lines({"valid": True, "legs": [], "shards": [shard], "replicas": [row]})
        (line,) = [x for x in lines if "replica r0" in x]
        return line

    assert "reference {1: 15.2, 64: 96.9}" in replica_line(0.647) and "suspect" in replica_line(0.647)
    assert "suspect" not in replica_line(0.94) and "suspect" not in replica_line(1.3)


def test_a_failed_assertion_on_figures_no_host_can_move_is_never_excused():
    from bench.run.verdict import never_excused

    assert never_excused(AssertionResult("attacks_breached == 0", False, 2))
    assert never_excused(AssertionResult("unplanned_exits == 0 and engine_raises == 0", False, 1))
    assert not never_excused(AssertionResult("attacks_breached == 0", True, 0))  # it held
    # a figure a slow host can move (rtt) beside it: the host may have caused the failure
    assert not never_excused(AssertionResult("attacks_breached == 0 and p99(rtt_ms) < 400", False, 0))
    assert not never_excused(AssertionResult("dead_robots == 0", False, 1))
    assert not never_excused(AssertionResult("not an (expression", False, None))
