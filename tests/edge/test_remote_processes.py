"""The remote engine against policy-server processes killed with SIGKILL: no graceful goodbye, the
kernel closes the socket. The robot never raises, holds within the staleness bound, stays not-failed,
and streams again on the restarted replica, or on another replica when one is left."""

from __future__ import annotations

import signal
import sys
import time

import yaml

from edge import EngineState
from tests.edge.conftest import make_checkpoint
from tests.edge.test_remote import engine, loop
from wire.procs import ChildProcess

CLI = [sys.executable, "-m", "server.cli"]


def start_server(tmp_path, router, ckpt, replica_id: str, wait: bool = True) -> ChildProcess:
    """A policy-server process; ready when returned, or (`wait=False`) started only: `wait_ready` it later."""
    manifest = {
        "model": {"repo_or_path": str(ckpt)},
        "model_id": "arm",
        "replica_id": replica_id,
        "max_sessions": 8,
        "warmup_inferences": 1,
        "health_port": -1,
        "zenoh": {"connect_endpoints": [router]},
        "session": {"gc_grace_s": 0.3},
    }
    path = tmp_path / f"{replica_id}.yaml"
    path.write_text(yaml.safe_dump(manifest))
    child = ChildProcess(CLI + ["--manifest", str(path)], tmp_path / f"{replica_id}.log", name=replica_id).start()
    child.ready_text = "policy-server ready"
    if wait:
        child.wait_ready(timeout_s=60)
    return child


def test_sigkill_mid_episode_holds_safely_and_recovers_on_restart(router, tmp_path):
    ckpt = make_checkpoint(tmp_path / "arm")
    srv = start_server(tmp_path, router, ckpt, "r0")
    eng = engine(router, max_action_age_s=0.5, fallback="hold", max_offline_s=30.0)
    eng.start()
    try:
        loop(eng, 10.0, until=lambda tr: eng.stats["chunks"] >= 3)
        assert eng.stats["chunks"] >= 3
        srv.signal(signal.SIGKILL)
        srv.proc.wait(5)
        trace = loop(eng, 2.0)  # get_action never raises: the loop would stop here
        assert trace[-1][1] is None, "past the staleness bound the robot holds"
        assert all(a is None or a.age_s <= 0.5 for _, a, _ in trace)
        assert not eng.failed and {s for _, _, s in trace} & {"RECONNECTING", "STALLED"}
        srv = start_server(tmp_path, router, ckpt, "r0")
        trace = loop(eng, 15.0, until=lambda tr: tr[-1][1] is not None)
        assert trace[-1][1] is not None and trace[-1][1].source == "chunk", "streams again after the restart"
        assert eng.stats["reconnects"] >= 1 and not eng.failed
    finally:
        eng.stop()
        srv.stop()


def test_sigkill_of_one_replica_moves_the_session_to_another(router, tmp_path):
    ckpt = make_checkpoint(tmp_path / "arm")
    servers = {rid: start_server(tmp_path, router, ckpt, rid, wait=False) for rid in ("r0", "r1")}  # side by side
    for s in servers.values():
        s.wait_ready(timeout_s=60)
    eng = engine(router, max_offline_s=30.0)
    eng.start()
    try:
        loop(eng, 10.0, until=lambda tr: eng.stats["chunks"] >= 2)
        first = eng.stats["replica_id"]
        assert first in servers
        servers[first].signal(signal.SIGKILL)
        servers[first].proc.wait(5)
        trace = loop(eng, 15.0, until=lambda tr: tr[-1][1] is not None and eng.stats["replica_id"] not in ("", first))
        other = eng.stats["replica_id"]
        assert other != first and other in servers, "the session moved to the surviving replica"
        assert trace[-1][1] is not None and eng.state in (EngineState.STREAMING, EngineState.DEGRADED)
        assert not eng.failed
    finally:
        eng.stop()
        for s in servers.values():
            s.stop()
