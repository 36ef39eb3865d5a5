"""`bench run --cluster ray` on a real multi-node Ray cluster on this machine (ray.cluster_utils.Cluster:
a head and two more raylets, each its own node with its own resources): a fleet spread over the nodes
passes, a kill -9 of a replica on another node is survived, and a node that dies mid-run ends the run
with exit 2 naming the node instead of hanging."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is the optional `cluster` extra")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]

SCENARIO = """\
name: cluster_probe
duration_s: {duration}
warmup_s: 3
seed: 3
fleet:
  groups:
    - name: lab
      robot: reacher
      count: 4
      fps: 30
      site: lab
      engine: {{buffer_time_s: 0.4, max_action_age_s: 1.0, fallback: hold, trim: consumed, max_offline_s: 30,
                reconnect_max_backoff_s: 1.0}}
sites:
  lab: {{profile: lan}}
servers:
  replicas:
    - {{id: r0, checkpoint: reacher, max_sessions: 8}}
cluster: {{placement: spread, shard_cpus: 1, replica_cpus: 1}}
faults: {faults}
assertions:
  - dead_robots == 0
  - staleness_violations == 0
{extra}
"""


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    workers = [c.add_node(num_cpus=1), c.add_node(num_cpus=1)]
    c.wait_for_nodes()
    try:
        yield c, workers
    finally:
        c.shutdown()


def _run(cluster_address: str, tmp_path: Path, *, duration=8, faults="[]", extra="", timeout=240,
         while_running=None) -> tuple[int, str, dict | None]:
    path = tmp_path / "cluster_probe.yaml"
    path.write_text(SCENARIO.format(duration=duration, faults=faults, extra=extra))
    env = dict(os.environ, RAY_ADDRESS=cluster_address, PYTHONPATH=str(ROOT), MUJOCO_GL="egl")
    proc = subprocess.Popen([sys.executable, "-m", "bench.cli", "run", str(path), "--cluster", "ray", "--quiet",
                             "--reports", str(tmp_path / "reports")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, cwd=ROOT)
    if while_running is not None:
        while_running(tmp_path / "reports")
    out, _ = proc.communicate(timeout=timeout)
    summaries = sorted((tmp_path / "reports").glob("cluster_probe/*/summary.json"))
    return proc.returncode, out, json.loads(summaries[-1].read_text()) if summaries else None


def test_a_fleet_spread_over_three_nodes_passes_and_the_summary_names_them(cluster, tmp_path):
    c, _ = cluster
    rc, out, summary = _run(c.address, tmp_path)
    assert rc == 0, out
    facts = summary["cluster"]
    assert facts["kind"] == "ray" and facts["node_count"] == 3 and facts["placement"] == "spread"
    placed = {child: n["node_id"] for n in facts["nodes"] for child in n["children"]}
    assert set(placed) == {"shard:0", "server:r0"}
    assert placed["shard:0"] != placed["server:r0"], "spread put the shard and the replica on one node"
    assert summary["figures"]["ticks"] > 0 and any((tmp_path / "reports").rglob("robots.parquet"))


def test_a_replica_killed_on_another_node_is_restarted_there_and_the_fleet_recovers(cluster, tmp_path):
    c, _ = cluster
    rc, out, summary = _run(c.address, tmp_path, duration=14,
                            faults="[{at: 3, target: 'server:r0', action: kill, duration: 3}]",
                            extra="  - reconnects >= 1\n  - unrecovered_robots == 0")
    assert rc == 0, out
    (kill,) = [f for f in summary["faults"] if f.get("action") == "kill"]
    assert kill["t_end"] is not None, kill


def test_a_node_that_dies_mid_run_ends_the_run_with_exit_2_naming_the_node(cluster, tmp_path):
    c, workers = cluster

    def remove_workers_once_running(reports: Path):
        deadline = time.monotonic() + 120
        while not any(reports.rglob("shard-0.log")) and time.monotonic() < deadline:
            time.sleep(0.2)  # no event tells another process's log file appeared
        time.sleep(4)  # the run is past its start barrier
        for node in workers:  # spread put at least one of shard and replica on a worker
            c.remove_node(node, allow_graceful=False)

    t0 = time.monotonic()
    rc, out, summary = _run(c.address, tmp_path, duration=30, while_running=remove_workers_once_running)
    assert rc == 2, out
    assert "node" in out and "is gone or not answering" in (out + json.dumps(summary or {}))
    assert time.monotonic() - t0 < 120, "the run did not notice the dead node promptly"
