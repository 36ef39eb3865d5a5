"""A shard whose monotonic clock reads 5 s ahead of the runner's (BENCH_TEST_MONO_SKEW_S, as a shard on another
host would): the runner measures the offset over the control channel, the shard starts at the barrier and its
robots' records line up with t = 0, and the uplink/downlink split stays right, where the one-clock join of the
same records would put the uplink 5 s in the negative."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]
SKEW_S = 5.0

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCENARIO = """\
name: skew
description: two robots on a shard whose clock is 5 s ahead, a 50 ms WAN site, one replica
duration_s: 6
warmup_s: 3
seed: 3
fleet:
  shards: 1
  groups:
    - name: lab
      robot: reacher
      count: 2
      site: wan
      engine: {{buffer_time_s: 0.5, max_action_age_s: 1.0, fallback: hold}}
sites:
  wan: {{profile: wan_50ms}}
servers:
  replicas:
    - {{id: r0, checkpoint: {checkpoint}, max_sessions: 4}}
assertions:
  - dead_robots == 0
  - requests > 10
"""


def test_a_shard_5_s_ahead_starts_at_the_barrier_and_its_hop_split_stays_right(tmp_path):
    for mod in ("edge", "server.cli", "chaos.launch"):
        pytest.importorskip(mod)
    checkpoint = REPO / "bench" / "checkpoints" / "reacher"
    if not (checkpoint / "model.safetensors").is_file():
        pytest.skip("the shipped reacher checkpoint is not in this checkout")
    scenario = tmp_path / "skew.yaml"
    scenario.write_text(textwrap.dedent(SCENARIO.format(checkpoint=checkpoint)))
    env = dict(os.environ, BENCH_TEST_MONO_SKEW_S=str(SKEW_S), PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "bench.cli", "run", str(scenario), "--reports", str(tmp_path / "r"), "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=150,
        env=env,
    )
    (run,) = list((tmp_path / "r" / "skew").iterdir())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["verdict"] == "pass", (proc.stdout[-3000:], proc.stderr[-3000:])

    shard, replica = summary["clock"]["children"]["shard:0"], summary["clock"]["children"]["server:r0"]
    assert abs(shard["offset_ms"] - SKEW_S * 1e3) <= shard["uncertainty_ms"] + 1e-3 and not shard["same_clock"], shard
    assert replica["same_clock"] and replica["offset_ms"] == 0  # the replica is this runner's child: one clock
    assert json.loads((run / "clock.json").read_text())["offsets"]["shard:0"] == shard

    import pyarrow.parquet as pq

    # the barrier: the shard's loop ran from the start barrier (t = -warmup) to the end, on the runner's timeline
    t = pq.read_table(run / "ticks.parquet", columns=["t"]).column("t").to_numpy()
    assert -3.0 <= t.min() < -2.5 and 5.5 < t.max() < 6.0, (t.min(), t.max())
    req = pq.read_table(run / "requests.parquet")
    ok = np.array(req.column("outcome").to_pylist()) == "ok"
    col = {k: req.column(k).to_numpy()[ok] for k in ("uplink_ms", "downlink_ms", "network_ms", "sent_ns", "t")}
    up, down, net = col["uplink_ms"], col["downlink_ms"], col["network_ms"]
    assert np.isfinite(up).mean() > 0.9 and summary["clock"]["hop_split"] == {
        "valid": True,
        "requests_dropped": 0,
        "dropped_pairs": [],
        "max_clock_error_of_hop": 0.25,
    }
    # 25 ms each way asked of the proxy: each leg at least that, and the two add up to the network time
    assert np.nanmedian(up) >= 24.0 and np.nanmedian(down) >= 24.0, (np.nanmedian(up), np.nanmedian(down))
    assert np.nanmedian(up + down - net) <= 1.0
    # and split again at the router: the robot's side is the proxy's 25 ms too, on the runner's clock, and its
    # bench part (beyond what the proxy asked around that time) is a few ms, not the shard's 5 s
    to_router = req.column("uplink_to_router_ms").to_numpy()[ok]
    part = req.column("uplink_to_router_bench_ms").to_numpy()[ok]
    assert 24.0 <= np.nanmedian(to_router) < 60.0 and np.nanmedian(part) < 20.0, (
        np.nanmedian(to_router),
        np.nanmedian(part),
    )
    print(
        f"shard offset {shard['offset_ms']:.3f} ± {shard['uncertainty_ms']:.3f} ms ({shard['exchanges']} exchanges); "
        f"uplink p50 {np.nanmedian(up):.1f} ms, downlink p50 {np.nanmedian(down):.1f} ms, network p50 {np.nanmedian(net):.1f} ms"
    )

    # the same records joined as if every process shared one clock: the uplink would be 5 s in the negative
    from bench.run.collect import hop_split

    audit = pq.read_table(run / "server_requests.parquet")
    wrong, _, _ = hop_split(col["sent_ns"], col["t"], audit)
    assert np.nanmedian(wrong) < -SKEW_S * 1e3 + 200
    print(f"one-clock join: uplink p50 {np.nanmedian(wrong):.1f} ms")
