"""Session open: the validation matrix of design 8.4, one parametrized case per rule."""

from __future__ import annotations

import dataclasses

import pytest

from server.manifest import KnownClient
from server.sessions import ReplicaInfo, Session, SessionRegistry, make_ack, make_status, validate_open
from wire import ErrorCode, SessionOpen
from wire.keys import ReplicaKeys

INFO = ReplicaInfo(
    replica_id="r0",
    model_id="arm",
    revision="main",
    checkpoint_hash="ab" * 32,
    policy_type="flow_matching",
    action_names=["j0", "j1", "grip"],
    state_dim=6,
    cameras={"wrist": [96, 128, 3]},
    chunk_size=20,
    trained_fps=30.0,
    supports_rtc=True,
    serving_mode="shared",
    max_sessions=4,
    execution_horizon=10,
    default_task="reach",
    pin_task=False,
)


KNOWN_9 = KnownClient(id="robot-9", model="arm", latency_budget_ms=20.0, priority=2)


def request(**kw) -> SessionOpen:
    base = dict(
        client_uuid="robot-1",
        schema_version=1,
        fps=30.0,
        action_names=["j0", "j1", "grip"],
        state_dim=6,
        cameras={"wrist": [96, 128, 3]},
        rtc_enabled=True,
    )
    base.update(kw)
    return SessionOpen(**base)


def decide(req: SessionOpen, info: ReplicaInfo = INFO, active: int = 0, ready: bool = True, draining: bool = False):
    return validate_open(req, info, active=active, ready=ready, draining=draining, client_uuid_from_key=req.client_uuid)


REJECTS = [
    ("action order", request(action_names=["j1", "j0", "grip"]), INFO, 0, ErrorCode.ACTION_MISMATCH, "another order"),
    ("action names", request(action_names=["a", "b", "c"]), INFO, 0, ErrorCode.ACTION_MISMATCH, "different names"),
    ("missing camera", request(cameras={"front": [96, 128, 3]}), INFO, 0, ErrorCode.CAMERA_MISMATCH, "wrist"),
    ("state dim", request(state_dim=7), INFO, 0, ErrorCode.STATE_DIM_MISMATCH, "expects 6"),
    ("schema too new", request(schema_version=9), INFO, 0, ErrorCode.SCHEMA_VERSION, "schema 9"),
    (
        "fps",
        request(fps=15.0),
        INFO,
        0,
        ErrorCode.FPS_MISMATCH,
        "client runs at 15 fps but the policy was trained at 30 fps",
    ),
    ("pinned task", request(task="fold"), dataclasses.replace(INFO, pin_task=True), 0, ErrorCode.TASK_PINNED, "pinned"),
    ("capacity", request(), INFO, 4, ErrorCode.CAPACITY, "4/4"),
    (
        "exclusive busy",
        request(),
        dataclasses.replace(INFO, serving_mode="exclusive"),
        1,
        ErrorCode.EXCLUSIVE_BUSY,
        "exactly one session",
    ),
    ("pinned checkpoint", request(expected_checkpoint_hash="cd" * 32), INFO, 0, ErrorCode.WRONG_MODEL, "never run"),
    ("policy type", request(policy_type="mlp_chunk"), INFO, 0, ErrorCode.WRONG_MODEL, "mlp_chunk"),
    (
        "allowlist",
        request(),
        dataclasses.replace(INFO, allowlist=("robot-9",)),
        0,
        ErrorCode.IDENTITY_MISMATCH,
        "allowlist",
    ),
    (
        "unknown client",
        request(),
        dataclasses.replace(INFO, accept_unknown=False, known_clients={"robot-9": KNOWN_9}),
        0,
        ErrorCode.IDENTITY_MISMATCH,
        "clients.known",
    ),
    (
        "known client, other model",
        request(client_uuid="robot-9"),
        dataclasses.replace(INFO, known_clients={"robot-9": dataclasses.replace(KNOWN_9, model="pusher")}),
        0,
        ErrorCode.IDENTITY_MISMATCH,
        "'pusher'",
    ),
]


@pytest.mark.parametrize("name,req,info,active,code,words", REJECTS, ids=[r[0] for r in REJECTS])
def test_hard_rejects_name_the_rule_and_the_fix(name, req, info, active, code, words):
    d = decide(req, info, active)
    assert not d.ok
    assert d.error.code == code
    assert words in d.error.message


def test_capacity_rejection_carries_the_current_load():
    d = decide(request(), INFO, active=4)
    assert d.error.details == {"active_sessions": 4, "max_sessions": 4, "load": 1.0}


@pytest.mark.parametrize("ready,draining,code", [(False, False, ErrorCode.NOT_READY), (True, True, ErrorCode.DRAINING)])
def test_a_warming_or_draining_replica_refuses(ready, draining, code):
    assert decide(request(), ready=ready, draining=draining).error.code == code


def test_a_session_at_another_rate_is_refused_naming_both_rates_and_the_manifest_key():
    d = decide(request(fps=15.0))
    assert not d.ok and d.error.code == ErrorCode.FPS_MISMATCH and d.reason == "fps"
    assert "15 fps" in d.error.message and "30 fps" in d.error.message and "allow_resampling" in d.error.message
    assert d.error.details == {"trained_fps": 30.0, "client_fps": 15.0}
    assert decide(request(fps=30.0)).ok


def test_allow_resampling_and_aspect_ratio_only_warn():
    d = decide(request(fps=15.0, cameras={"wrist": [480, 480, 3]}), dataclasses.replace(INFO, allow_resampling=True))
    assert d.ok
    assert any("15 fps" in w and "30 fps" in w and "allow_resampling" in w for w in d.warnings)
    assert any("aspect ratio" in w for w in d.warnings)


def test_rtc_on_a_policy_without_rtc_downgrades_to_append_with_a_warning():
    d = decide(request(rtc_enabled=True), dataclasses.replace(INFO, supports_rtc=False, policy_type="mlp_chunk"))
    assert d.ok and d.rtc_enabled is False
    assert any("append mode" in w for w in d.warnings)


def test_empty_task_takes_the_default_and_a_pinned_server_accepts_its_own_task():
    assert decide(request(task="")).task == "reach"
    assert decide(request(task="reach"), dataclasses.replace(INFO, pin_task=True)).ok


def test_extra_client_cameras_are_fine():
    assert decide(request(cameras={"wrist": [96, 128, 3], "top": [64, 64, 3]})).ok


def test_registry_binds_a_session_to_its_client_and_replaces_on_rehandshake():
    keys = ReplicaKeys("arm", "main", "r0").client("reach", "robot-1")
    reg = SessionRegistry()
    s1 = Session(reg.new_id(), "robot-1", keys, "reach", True, 10, 30.0)
    assert reg.add(s1) is None
    found, err = reg.lookup(s1.session_id, "robot-2")
    assert found is None and err.code == ErrorCode.IDENTITY_MISMATCH
    found, err = reg.lookup("nope", "robot-1")
    assert err.code == ErrorCode.UNKNOWN_SESSION
    s2 = Session(reg.new_id(), "robot-1", keys, "reach", True, 10, 30.0)
    assert reg.add(s2) is s1
    assert len(reg) == 1 and reg.by_client("robot-1") is s2
    assert s1.session_id != s2.session_id


def test_status_and_ack_report_the_checkpoint_hash_and_load():
    st = make_status(INFO, active=2, ready=True, warmed_up=True, draining=False)
    assert st.checkpoint_hash == INFO.checkpoint_hash and st.load == 0.5 and st.ready
    keys = ReplicaKeys("arm", "main", "r0").client("reach", "robot-1")
    s = Session("sid", "robot-1", keys, "reach", False, 10, 30.0)
    d = decide(request(rtc_enabled=False))
    ack = make_ack(INFO, s, d, active=3, schema_version=1)
    assert ack.checkpoint_hash == INFO.checkpoint_hash and ack.session_id == "sid" and ack.rtc_enabled is False
    draining = make_status(INFO, active=0, ready=True, warmed_up=True, draining=True)
    assert draining.draining and not draining.ready


def test_a_known_client_is_accepted_when_unknown_ones_are_not():
    info = dataclasses.replace(INFO, accept_unknown=False, known_clients={"robot-9": KNOWN_9})
    assert decide(request(client_uuid="robot-9"), info).ok
