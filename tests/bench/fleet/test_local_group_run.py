"""A `kind: local` group in a real run: its robots run the checkpoint in the shard (no network, no session on
the replica) and report their own episodes and task success beside the remote twin's (summary `baselines`)."""

from __future__ import annotations

import pytest

from tests.bench.scenario_runs import bench_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_local_group_runs_and_reports_its_own_task_success():
    run = bench_run("local_baseline")
    assert run.returncode == 0, run.stderr[-3000:]
    s = run.summaries[-1]
    assert s["group_engines"] == {"lan": "remote", "local": "local"}
    local, lan = s["groups"]["local"], s["groups"]["lan"]
    assert local["episodes"] >= 2 and 0.0 <= local["task_success_rate"] <= 1.0
    assert local["rtt_ms"]["count"] == 0 and lan["rtt_ms"]["count"] > 0  # only the remote robot used the network
    assert local["none_tick_ratio"] < 0.5  # the local engine served actions, not just gating Nones
    (b,) = s["baselines"]
    assert (b["local"], b["remote"], b["paired_seeds"], b["profile"]) == ("local", "lan", True, "lan")
    assert b["gap"] == pytest.approx(local["task_success_rate"] - lan["task_success_rate"])
