"""Negative checks: each scenario family's assertions fail when its behaviour is broken on purpose.

A shipped scenario, shortened, with one `--set` that breaks what it tests (tests/bench/scenario_runs.py
lists them) must exit 1 with the assertion that guards that behaviour failing. Without these, an
assertion that can never fail would pass unnoticed. The positive runs are the scenarios themselves.
"""

from __future__ import annotations

import pytest

from tests.bench.scenario_runs import bench_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_robot_that_gives_up_within_the_outage_fails_the_server_crash_job():
    run = bench_run("server_crash_gives_up")  # max_offline_s 1 through a 3 s crash
    assert run.returncode == 1, run.stderr[-2000:]
    assert run.result_of("dead_robots == 0")["result"] == "fail"
    assert run.result_of("staleness_violations == 0")["result"] == "pass"


def test_a_satellite_link_where_wifi_was_fails_the_wifi_stall_bound():
    run = bench_run("wifi_on_satellite")
    assert run.returncode == 1, run.stderr[-2000:]
    assert run.result_of("group[wifi].fallback_tick_ratio < 0.02")["result"] == "fail"
    assert run.result_of("staleness_violations == 0")["result"] == "pass"


def test_a_shadow_engine_with_another_checkpoint_breaks_parity():
    run = bench_run("parity_other_weights")
    assert run.returncode == 1, run.stderr[-2000:]
    mism = run.result_of("group[rtc].parity_queue_mismatches == 0")
    assert mism["result"] == "fail" and mism["value"] > 0
    assert run.result_of("group[rtc].parity_request_failures == 0")["result"] == "pass"


def test_rtc_turned_off_fails_the_seam_jerk_comparison():
    run = bench_run("rtc_off")
    assert run.returncode == 1, run.stderr[-2000:]
    assert run.result_of("group[rtc].seam_jerk_p95 < 0.5 * group[append].seam_jerk_p95")["result"] == "fail"


def test_a_replica_too_slow_for_two_sessions_leaves_no_knee():
    run = bench_run("capacity_too_slow")  # 900 ms per request, two sessions at 1 Hz
    assert run.returncode == 1, run.stderr[-2000:]
    (sweep,) = run.json_files("sweep.json")
    assert sweep["capacity"]["figures"]["knee"] is None and sweep["capacity"]["figures"]["first_failure"] == 2
    assert sweep["assertions"][0]["expression"] == "knee >= 2" and sweep["assertions"][0]["result"] == "fail"


def test_too_few_sessions_on_both_replicas_leaves_robots_without_one():
    run = bench_run("max_sessions_short")  # r0 takes 3, r1 takes 1: two of six robots find no room
    assert run.returncode == 1, run.stderr[-2000:]
    assert run.result_of("unrecovered_robots == 0")["result"] == "fail"
    assert run.result_of("server_load_max == 1")["result"] == "pass"
