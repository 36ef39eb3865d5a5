"""Negative checks: each scenario family's assertions fail when its behaviour is broken on purpose.

A shipped scenario, shortened, with one `--set` that breaks what it tests, must exit 1 with exactly the
assertion that guards that behaviour failing. Without these, an assertion that can never fail would
pass unnoticed. The positive runs are the scenarios themselves (`bench run scenarios/...`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def bench(tmp_path: Path, *args: str) -> tuple[int, str, list[dict], Path]:
    """Run `bench` in a subprocess; (exit code, stderr, assertion results of the last run, reports dir)."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), "MUJOCO_GL": "egl"}
    reports = tmp_path / "reports"
    proc = subprocess.run([sys.executable, "-m", "bench.cli", *args, "--reports", str(reports), "--quiet"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    summaries = sorted(reports.glob("**/summary.json"), key=lambda p: p.stat().st_mtime)
    results = json.loads(summaries[-1].read_text())["assertions"] if summaries else []
    return proc.returncode, proc.stderr, results, reports


def result_of(results: list[dict], expression: str) -> dict:
    return next(r for r in results if r["expression"] == expression)


def test_a_robot_that_gives_up_within_the_outage_fails_the_server_crash_job(tmp_path):
    # robots must stay alive (not DEAD) through a 3 s server crash: with max_offline_s 1 they give up
    rc, err, results, _ = bench(tmp_path, "run", "scenarios/ci/server_crash.yaml", "--set", "duration_s=12",
                                "--set", "fleet.groups.lab.engine.max_offline_s=1")
    assert rc == 1, err[-2000:]
    assert result_of(results, "dead_robots == 0")["result"] == "fail"
    assert result_of(results, "staleness_violations == 0")["result"] == "pass"


def test_a_satellite_link_where_wifi_was_fails_the_wifi_stall_bound(tmp_path):
    rc, err, results, _ = bench(tmp_path, "run", "scenarios/wifi_jitter.yaml", "--set", "duration_s=12",
                                "--set", "sites.floor.profile=satellite")
    assert rc == 1, err[-2000:]
    assert result_of(results, "group[wifi].fallback_tick_ratio < 0.02")["result"] == "fail"
    assert result_of(results, "staleness_violations == 0")["result"] == "pass"


def test_a_shadow_engine_with_another_checkpoint_breaks_parity(tmp_path):
    rc, err, results, _ = bench(tmp_path, "run", "scenarios/rtc_parity.yaml", "--set", "duration_s=8",
                                "--set", "fleet.groups.rtc.shadow.policy=reacher_finetune_b")
    assert rc == 1, err[-2000:]
    mism = result_of(results, "group[rtc].parity_queue_mismatches == 0")
    assert mism["result"] == "fail" and mism["value"] > 0
    assert result_of(results, "group[rtc].parity_request_failures == 0")["result"] == "pass"


def test_rtc_turned_off_fails_the_seam_jerk_comparison(tmp_path):
    rc, err, results, _ = bench(tmp_path, "run", "scenarios/rtc_vs_append.yaml", "--set", "sweep.values=[0]",
                                "--set", "duration_s=10", "--set", "fleet.groups.rtc.engine.rtc_enabled=false")
    assert rc == 1, err[-2000:]
    assert result_of(results, "group[rtc].seam_jerk_p95 < 0.5 * group[append].seam_jerk_p95")["result"] == "fail"


def test_a_replica_too_slow_for_two_sessions_leaves_no_knee(tmp_path):
    rc, err, _results, reports = bench(tmp_path, "run", "scenarios/capacity_pi0.yaml", "--set", "sweep.values=[2]",
                                       "--set", "duration_s=8", "--set", "servers.replicas.r0.emulated_latency=900")
    assert rc == 1, err[-2000:]
    (sweep,) = reports.glob("*/*/sweep.json")
    data = json.loads(sweep.read_text())
    assert data["capacity"]["figures"]["knee"] is None and data["capacity"]["figures"]["first_failure"] == 2
    assert [a["result"] for a in data["assertions"]][0] == "fail"  # knee >= 2


def test_too_few_sessions_on_both_replicas_leaves_robots_without_one(tmp_path):
    # max_sessions: with r1 taking one session, two of six robots find no replica with room
    rc, err, results, _ = bench(tmp_path, "run", "scenarios/max_sessions.yaml", "--set", "duration_s=8",
                                "--set", "servers.replicas.r1.max_sessions=1")
    assert rc == 1, err[-2000:]
    assert result_of(results, "unrecovered_robots == 0")["result"] == "fail"
    assert result_of(results, "server_load_max == 1")["result"] == "pass"
