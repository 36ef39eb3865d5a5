"""Several models in one policy-server process (manifest `extra_models`): one Zenoh session, one health
endpoint, per-model sessions, mailboxes and dispatch loops started by each model's first request."""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch

from server.manifest import Manifest
from server.policies import PolicyConfig, make_policy, save_checkpoint
from server.process import ServerProcess
from tests.server.scrape import scraped
from tests.server.test_service import STATS, A, S, manifest
from tests.server.zclient import RawClient
from wire import ActionChunk, ReplicaKeys, SessionAck


def _ckpt(root, name, seed, kind="flow_matching"):
    torch.manual_seed(seed)
    cfg = PolicyConfig(
        type=kind,
        state_dim=S,
        action_dim=A,
        chunk_size=8,
        fps=30,
        execution_horizon=4,
        action_names=["x", "y", "grip"],
        hyper_params={"hidden_dim": 32, "obs_embed_dim": 16, "num_steps": 4}
        if kind == "flow_matching"
        else {"hidden_dim": 32},
    )
    return save_checkpoint(make_policy(cfg), STATS, root / name)


@pytest.fixture(scope="module")
def two_ckpts(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("ckpts")
    return _ckpt(root, "arm", 0), _ckpt(root, "gripper", 1, kind="mlp_chunk")


@pytest.fixture
def process(two_ckpts, router, tmp_path):
    arm, gripper = two_ckpts
    m = manifest(
        arm,
        router,
        tmp_path,
        extra_models=[{"model": {"repo_or_path": str(gripper)}, "max_sessions": 2, "warmup_inferences": 1}],
        models={"known": {"gripper": {"max_inflight": 2}}},
    )
    proc = ServerProcess(Manifest.from_dict(m))
    proc.load()
    proc.start()
    yield proc
    proc.stop()


def _dispatch_threads(model) -> list[str]:
    """The live dispatch loops of this model's server: its own threads, not every thread of the pytest process
    by name (an earlier test's server of the same model id, still stopping, must not count here)."""
    return [t.name for t in model._threads if t.name.startswith(f"dispatch-{model.info.model_id}-") and t.is_alive()]


def test_two_models_share_one_process_and_each_answers_its_own_sessions(process, router):
    arm, gripper = process.models["arm"], process.models["gripper"]
    assert arm.info.checkpoint_hash != gripper.info.checkpoint_hash
    assert not _dispatch_threads(arm) and not _dispatch_threads(gripper), "no dispatch loop before a request"
    a = RawClient(router, ReplicaKeys("arm", "main", "r0"), "robot-a")
    g = RawClient(router, ReplicaKeys("gripper", "main", "r0"), "robot-a", session=a.z)  # one robot, two models
    try:
        assert a.status().checkpoint_hash == arm.info.checkpoint_hash
        assert g.status().checkpoint_hash == gripper.info.checkpoint_hash and g.status().max_sessions == 2
        ack_a, ack_g = a.open(), g.open(rtc_enabled=False)
        assert isinstance(ack_a, SessionAck) and isinstance(ack_g, SessionAck)
        assert (
            ack_a.checkpoint_hash == arm.info.checkpoint_hash and ack_g.checkpoint_hash == gripper.info.checkpoint_hash
        )
        assert ack_g.policy_type == "mlp_chunk" and ack_a.session_id != ack_g.session_id
        seq = a.send(np.ones(S))
        got = a.chunk_for(seq, timeout=10)
        assert got is not None and isinstance(got[1], ActionChunk) and got[1].session_id == ack_a.session_id
        assert len(_dispatch_threads(arm)) == 1 and not _dispatch_threads(gripper), (
            "the gripper's dispatch starts with its own first request"
        )
        seq = g.send(np.ones(S))
        got = g.chunk_for(seq, timeout=10)
        assert got is not None and got[1].session_id == ack_g.session_id
        assert len(_dispatch_threads(gripper)) == 2  # models.known.gripper.max_inflight
        assert len(arm.sessions) == 1 and len(gripper.sessions) == 1
        assert scraped(process.metrics, "policy_server_active_sessions", model="gripper") == 1
    finally:
        g.close()
        a.close()


def test_capacity_is_per_model(process, router):
    clients = [RawClient(router, ReplicaKeys("gripper", "main", "r0"), f"robot-{i}") for i in range(3)]
    other = RawClient(router, ReplicaKeys("arm", "main", "r0"), "robot-9")
    try:
        replies = [c.open(rtc_enabled=False) for c in clients]
        assert [type(r).__name__ for r in replies] == ["SessionAck", "SessionAck", "Error"]
        assert replies[2].code == "CAPACITY" and replies[2].details["max_sessions"] == 2
        assert isinstance(other.open(), SessionAck), "the arm's capacity is its own"
    finally:
        for c in clients + [other]:
            c.close()


def test_one_health_endpoint_reports_every_model(process):
    port = process.health.port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
        assert r.status == 200
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
        text = r.read().decode()
    assert 'policy_server_load{model="arm"}' in text and 'policy_server_load{model="gripper"}' in text


def test_drain_tells_the_clients_of_every_model(process, router):
    from wire import DrainNotice

    a = RawClient(router, ReplicaKeys("arm", "main", "r0"), "robot-a")
    g = RawClient(router, ReplicaKeys("gripper", "main", "r0"), "robot-g")
    try:
        a.open()
        g.open(rtc_enabled=False)
        process.drain("test")
        for c in (a, g):
            assert c.wait_for(lambda h, m: isinstance(m, DrainNotice), timeout=5) is not None
        assert process.stopped.is_set() and all(s.stopped.is_set() for s in process.models.values())
    finally:
        g.close()
        a.close()


def test_duplicate_model_ids_fail_the_manifest(two_ckpts, tmp_path):
    from server.manifest import ManifestError

    arm, _ = two_ckpts
    with pytest.raises(ManifestError, match=r"extra_models\[0\] has model_id 'arm', already served by model"):
        Manifest.from_dict(
            manifest(arm, "tcp/127.0.0.1:7447", tmp_path, extra_models=[{"model": {"repo_or_path": str(arm)}}])
        )


class _LogEvents(logging.Handler):
    """An Event per awaited log text, set when a record of the policy_server logger carries it."""

    def __init__(self, *texts: str):
        super().__init__()
        self.seen = {t: threading.Event() for t in texts}

    def emit(self, record) -> None:
        for text, event in self.seen.items():
            if text in record.getMessage():
                event.set()


def test_readyz_says_no_router_while_the_router_is_gone_and_the_log_says_when(two_ckpts, router_proc, tmp_path):
    from wire.procs import start_router

    child, endpoint = router_proc
    arm, _ = two_ckpts
    proc = ServerProcess(Manifest.from_dict(manifest(arm, endpoint, tmp_path)))
    events = _LogEvents("lost: not ready (no router)", "connected")
    logger = logging.getLogger("policy_server")
    level = logger.level
    logger.addHandler(events)
    logger.setLevel(logging.INFO)
    restarted = None
    try:
        proc.load()
        proc.start()
        url = f"http://127.0.0.1:{proc.health.port}/readyz"
        assert _readyz(url) == (200, {"ready": True, "reason": "ready"})
        child.stop()
        assert events.seen["lost: not ready (no router)"].wait(10), "losing the router is logged"
        assert _readyz(url) == (503, {"ready": False, "reason": "no router"})
        restarted, _ = start_router(int(endpoint.rsplit(":", 1)[1]), tmp_path / "router2.log")
        assert events.seen["connected"].wait(30), "regaining it is logged (Zenoh reconnects by itself)"
        assert _readyz(url) == (200, {"ready": True, "reason": "ready"})
    finally:
        logger.removeHandler(events)
        logger.setLevel(level)
        proc.stop()
        if restarted is not None:
            restarted.stop()


def _readyz(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
