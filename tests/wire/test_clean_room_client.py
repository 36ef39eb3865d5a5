"""docs/wire-protocol.md is enough to write a client: the clean-room client against a real `policy-server`.

`tests/wire/clean_room_client.py` was written from the document alone and imports nothing of this
repository; these tests run it against a real Zenoh router and a real `policy-server` process serving two
shipped checkpoints (`reacher`, state only, and `reacher_camera_untrained`, one 64x64 camera fed JPEG):
discovery, a refused open, chunks for several observations, the documented error events, a reset and
a refused reset, and a clean close. They also hold the client to the document's own worked examples
(header bytes, auth tag, checkpoint hash), so a drift of the document fails here too.
"""

from __future__ import annotations

import ast
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.wire import clean_room_client as crc
from wire.procs import ChildProcess, start_router

ROOT = Path(__file__).resolve().parents[2]
CLIENT = Path(crc.__file__)
DOC = ROOT / "docs" / "wire-protocol.md"
CHECKPOINTS = ROOT / "bench" / "checkpoints"
MODELS = {"reacher": CHECKPOINTS / "reacher", "reacher-cam": CHECKPOINTS / "reacher_camera_untrained"}
REPO_PACKAGES = {"wire", "edge", "server", "bench", "chaos", "benchmarks", "tests"}
ALLOWED_THIRD_PARTY = {"zenoh", "msgpack", "numpy", "simplejpeg"}
OBSERVATIONS = 6


def test_the_client_imports_nothing_from_this_repository():
    imported = set()
    for node in ast.walk(ast.parse(CLIENT.read_text())):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"relative import at line {node.lineno}"
            imported.add(node.module.split(".")[0])
    assert not imported & REPO_PACKAGES, imported & REPO_PACKAGES
    assert imported - set(sys.stdlib_module_names) <= ALLOWED_THIRD_PARTY, imported


def doc_example(kind: str) -> tuple[bytes, bytes]:
    """The header and body bytes of section 10's worked example of `kind`."""
    text = DOC.read_text()
    block = re.search(rf"### `{kind}`\n\n```\nheader: ([0-9a-f ]+)\nbody:\n([0-9a-f \n]+)```", text)
    assert block, f"no worked example of {kind} in {DOC.name}"
    return bytes.fromhex(block.group(1)), bytes.fromhex(block.group(2))


def test_the_client_reads_the_documents_worked_examples():
    header, body = doc_example("observation")
    h = crc.Header.unpack(header)
    assert (h.schema_version, h.msg_type, h.seq_id, h.episode_id, h.session_epoch) == (1, crc.OBS, 7, 2, 1)
    assert h.pack() == header
    obs = crc.decode(body)
    assert obs["kind"] == "observation" and crc.from_tensor(obs["state"]).tolist() == [0.5, -1.0, 2.0]
    chunk = crc.decode(doc_example("action_chunk")[1])
    assert chunk["seq_id_echo"] == h.seq_id and chunk["client_mono_ns_echo"] == h.client_mono_ns
    assert crc.from_tensor(chunk["chunk_robot"]).shape == (4, 2)
    reset_header, reset_body = doc_example("reset")
    assert crc.Header.unpack(reset_header).episode_id == crc.decode(reset_body)["episode_id"] == 3
    for kind in ("drain", "error", "status", "session_open", "session_ack", "reset_ack", "status_request"):
        assert crc.decode(doc_example(kind)[1])["kind"] == kind


def test_the_client_slugs_tasks_as_the_document_says():
    section2 = DOC.read_text().split("## 2. Key expressions")[1].split("## 3.")[0]
    examples = re.findall(r'`"([^"`]+)"` -> `([a-z0-9._-]+)`', section2)
    assert len(examples) >= 3, section2
    for task, slug in examples:
        assert crc.task_slug(task) == slug, task
    assert crc.task_slug("") == "default"
    with pytest.raises(ValueError):
        crc.task_slug("...")


def test_the_client_reproduces_the_documents_auth_tag_and_checkpoint_hash(tmp_path):
    key = bytes(range(32)).hex()
    assert crc.tag(key, b"reset", b"s-1", (3).to_bytes(8, "little")) == "f37012ed94f9496af03cfe77536866d9"
    for name, data in (("config.json", b"{}"), ("model.safetensors", b"w"), ("stats.json", b"{}")):
        (tmp_path / name).write_bytes(data)
    assert crc.checkpoint_hash(tmp_path) == "771815121fca462c9b80f841f6ec0287fe7e2322e293661382b44bdc68c5db26"


def test_the_clients_checks_refuse_a_chunk_that_answers_another_request():
    c = crc.CleanRoomClient.__new__(crc.CleanRoomClient)  # the checks only, no Zenoh session
    c.ack = {"schema_version": 1, "session_id": "s-1", "chunk_size": 4, "action_names": ["j0", "j1"]}
    sent = crc.Header(1, crc.OBS, 7, 2, 123, 1)
    good = {
        "kind": "action_chunk",
        "session_id": "s-1",
        "seq_id_echo": 7,
        "client_mono_ns_echo": 123,
        "chunk_model": crc.to_tensor(np.zeros((4, 2))),
        "chunk_robot": crc.to_tensor(np.zeros((4, 2))),
        "queue_wait_ms": 0.1,
        "inference_ms": 2,
    }
    c._check(crc.Header(1, crc.CHUNK, 7, 2, 123, 1), good, sent, crc.Answer(7))
    wrong = [
        (crc.Header(1, crc.CHUNK, 7, 3, 123, 1), good),  # another episode
        (crc.Header(1, crc.CHUNK, 7, 2, 124, 1), good),  # another clock stamp
        (crc.Header(1, crc.EVENT, 7, 2, 123, 1), good),  # not a CHUNK header
        (crc.Header(1, crc.CHUNK, 7, 2, 123, 1), {**good, "chunk_robot": crc.to_tensor(np.zeros((3, 2)))}),
    ]
    for h, body in wrong:
        with pytest.raises(crc.ProtocolViolation):
            c._check(h, body, sent, crc.Answer(7))
    assert not crc.CleanRoomClient._answers(crc.Header(1, crc.CHUNK, 7, 2, 123, 0), good, sent), "an older epoch"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A router, one `policy-server` process serving both checkpoints (replica r0 of each) and a second serving
    `reacher` as replica r1, so that discovery has two replicas to find; yields the router endpoint."""
    tmp = tmp_path_factory.mktemp("cleanroom")
    router, endpoint = start_router(None, tmp / "router.log")
    manifest = {
        "model": {"repo_or_path": str(MODELS["reacher"])},
        "model_id": "reacher",
        "warmup_inferences": 1,
        "health_port": 0,
        "audit_path": str(tmp / "audit.jsonl"),
        "zenoh": {"connect_endpoints": [endpoint]},
        "extra_models": [
            {"model": {"repo_or_path": str(MODELS["reacher-cam"])}, "model_id": "reacher-cam", "warmup_inferences": 1}
        ],
    }
    (tmp / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    procs = [
        ChildProcess(
            [sys.executable, "-m", "server.cli", "--manifest", str(tmp / "manifest.yaml"), *extra],
            tmp / f"server-{i}.log",
            ready_text="policy-server ready",
            name=f"policy-server-{i}",
        )
        for i, extra in enumerate([[], ["--replica-id", "r1", "--set", "extra_models=[]"]])
    ]
    try:
        for proc in procs:
            proc.start(timeout_s=60)
        yield endpoint
    finally:
        for proc in procs:
            proc.stop()
        router.stop()


def frames(cameras: dict, rng: np.random.Generator) -> dict:
    """One JPEG frame per camera the policy consumes, at the size its status gives (section 4.2)."""
    return {
        name: {
            "codec": "jpeg",
            "data": crc.jpeg(rng.integers(0, 256, size=tuple(shape), dtype=np.uint8)),
            "shape": list(shape),
        }
        for name, shape in cameras.items()
    }


def active_sessions(client: crc.CleanRoomClient, replica_id: str) -> int:
    (status,) = [s for s in client.discover() if s["replica_id"] == replica_id]
    return status["active_sessions"]


@pytest.mark.integration
@pytest.mark.parametrize("model_id", sorted(MODELS))
def test_the_clean_room_client_is_served_by_policy_server(server, model_id):
    rng = np.random.default_rng(0)
    c = crc.CleanRoomClient(server, model_id)
    try:
        statuses = c.discover()
        want = {"r0", "r1"} if model_id == "reacher" else {"r0"}
        assert sorted(s["replica_id"] for s in statuses) == sorted(want), statuses
        status = c.pick(statuses)
        assert status["checkpoint_hash"] == crc.checkpoint_hash(MODELS[model_id]), "section 5.6's recipe"
        assert status["schema_min"] <= crc.SCHEMA_VERSION <= status["schema_max"]
        cameras = status.get("cameras", {})
        assert bool(cameras) == (model_id == "reacher-cam")
        robot = {
            "action_names": status["action_names"],
            "state_dim": status["state_dim"],
            "fps": status["trained_fps"],
            "cameras": cameras,
        }
        before = status["active_sessions"]

        refused = c.open(status, **{**robot, "action_names": status["action_names"][::-1]})
        assert refused.body["kind"] == "error" and refused.body["code"] == "ACTION_MISMATCH", refused
        assert refused.header.msg_type == crc.CONTROL and not refused.zenoh_error

        ack = c.open(status, **robot, expected_checkpoint_hash=status["checkpoint_hash"])
        assert ack.body["kind"] == "session_ack", ack.body
        assert ack.body["schema_version"] == crc.SCHEMA_VERSION
        assert re.fullmatch(r"[0-9a-f]{64}", ack.body["session_key"]), "section 5.5: 32 bytes as hex"
        state = lambda: rng.standard_normal(status["state_dim"]).astype(np.float32)  # noqa: E731

        chunks = [c.observe(state(), frames(cameras, rng)) for _ in range(OBSERVATIONS)]
        assert [a.seq_id for a in chunks] == list(range(1, OBSERVATIONS + 1))
        for a in chunks:
            assert a.chunk is not None, f"seq {a.seq_id}: no chunk ({a.error}, others {a.late_or_foreign})"
            assert a.chunk_robot.shape == (status["chunk_size"], len(status["action_names"]))

        wrong_dim = c.observe(np.zeros(status["state_dim"] + 1, np.float32), frames(cameras, rng))
        assert wrong_dim.error is not None and wrong_dim.error["code"] == "STATE_DIM_MISMATCH", wrong_dim
        if cameras:
            corrupt = frames(cameras, rng)
            for frame in corrupt.values():
                frame["data"] = frame["data"][: len(frame["data"]) // 3]
            bad_image = c.observe(state(), corrupt)
            assert bad_image.error is not None and bad_image.error["code"] == "BAD_IMAGE", bad_image

        forged = c.reset(auth="0" * 32)
        assert forged.body["kind"] == "error" and forged.body["code"] == "IDENTITY_MISMATCH", forged
        reset = c.reset()
        assert reset.body == {"kind": "reset_ack", "session_id": ack.body["session_id"], "episode_id": 1}
        after = c.observe(state(), frames(cameras, rng))
        assert after.chunk is not None and c.episode_id == 1, after

        c.close_session()
        # The server forgets a closed session after its grace period (5.1 step 5); no event tells a client
        # when, so its status is asked again until the count is back or the deadline passes.
        deadline = time.monotonic() + 10
        while active_sessions(c, status["replica_id"]) != before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert active_sessions(c, status["replica_id"]) == before, "the closed session is still counted"
    finally:
        c.close()


@pytest.mark.integration
def test_a_task_named_in_free_text_is_served_on_the_keys_the_document_derives(server):
    # Section 2's slug: the client declares its keys from the task; a slug unlike the server's leaves its
    # chunks on keys nobody reads. "--" and runs of spaces are where a naive slug differs.
    c = crc.CleanRoomClient(server, "reacher")
    try:
        status = c.pick(c.discover())
        ack = c.open(
            status,
            action_names=status["action_names"],
            state_dim=status["state_dim"],
            fps=status["trained_fps"],
            task="Pick UP the  --  cube!",
        )
        assert ack.body["kind"] == "session_ack" and ack.body["task"] == "Pick UP the  --  cube!", ack.body
        answer = c.observe(np.zeros(status["state_dim"], np.float32))
        assert answer.chunk is not None, answer
    finally:
        c.close()
