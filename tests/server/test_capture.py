"""Debug capture is bounded, and replaying it offline reproduces every chunk byte for byte."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from server.capture import read_capture, replay
from server.cli import main as cli_main
from server.service import PolicyServer
from tests.server.test_service import A, S, ckpt, keys, manifest  # noqa: F401  (fixture reuse)
from tests.server.zclient import RawClient


def test_capture_replays_byte_for_byte_and_stays_bounded(ckpt, router, tmp_path, capsys):  # noqa: F811
    cap = tmp_path / "capture"
    srv = PolicyServer(
        manifest(
            ckpt,
            router,
            tmp_path,
            debug={"capture_dir": str(cap), "capture_max": 2},
            scheduling={"strategy": "round_robin", "max_batch": 4},
        )
    ).start()
    clients = [RawClient(router, keys(), f"robot-{i}") for i in range(3)]
    try:
        for c in clients:
            c.open()
        rng = np.random.default_rng(0)
        for _ in range(3):
            seqs = [
                c.send(
                    rng.normal(size=S),
                    inference_delay_steps=int(rng.integers(0, 3)),
                    prefix_robot=rng.normal(size=(4, A)).astype(np.float32),
                )
                for c in clients
            ]
            for c, seq in zip(clients, seqs):
                assert c.chunk_for(seq, timeout=10) is not None
    finally:
        for c in clients:
            c.close()
        srv.stop()
    batches = read_capture(cap)
    assert len(batches) == srv.capture.max == 2, "capture_max bounds the files (a ring of the newest batches)"
    assert batches[-1]["n"] == srv.capture._n - 1 and batches[0]["n"] == batches[-1]["n"] - 1
    report = replay(cap, str(ckpt))
    n = report["requests"]
    assert n >= 2 and report["same_checkpoint"]
    assert report["matched"] == n and report["mismatched"] == 0, report
    assert cli_main(["replay", str(cap), "--checkpoint", str(ckpt)]) == 0
    assert f"{n} byte-identical" in capsys.readouterr().out


def test_replay_without_capture_files_is_a_user_error(tmp_path, capsys):
    assert cli_main(["replay", str(tmp_path), "--checkpoint", str(tmp_path)]) == 2
    assert "no capture files" in capsys.readouterr().err


def _capture(tmp_path, content) -> str:
    """A capture directory holding one slot file: `content` packed, or raw bytes as is."""
    cap = tmp_path / "capture"
    cap.mkdir()
    (cap / "slot-000000.msgpack").write_bytes(content if isinstance(content, bytes) else msgpack.packb(content))
    return str(cap)


def _record(**request) -> dict:
    r = {
        "header": b"\0" * 8,
        "observation": b"not an observation",
        "chunk": b"not a chunk",
        "session_id": "s0",
        "client_uuid": "robot-0",
        "rtc_enabled": False,
        "execution_horizon": 4,
        **request,
    }
    return {"n": 0, "checkpoint_hash": "x", "model_id": "arm", "requests": [r]}


@pytest.mark.parametrize(
    "content, says",
    [
        (b"garbage\n", "slot-000000.msgpack: not a capture record (msgpack"),
        ([1, 2, 3], "slot-000000.msgpack: not a capture record (a map of n, checkpoint_hash and requests, got list)"),
        (
            {"n": 0, "checkpoint_hash": "x", "requests": [{"observation": b"xx"}]},
            "slot-000000.msgpack request 0: no valid header",
        ),
        (_record(), "slot-000000.msgpack request 0: [MALFORMED]"),
    ],
)
def test_replay_refuses_a_file_that_is_no_capture_record_naming_it(ckpt, tmp_path, capsys, content, says):  # noqa: F811
    """Not a replay mismatch (exit 1) nor a traceback: exit 2, one line naming the file and request."""
    assert cli_main(["replay", _capture(tmp_path, content), "--checkpoint", str(ckpt)]) == 2
    err = capsys.readouterr().err
    assert says in err and "replay another directory" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_replay_of_a_missing_directory_says_it_does_not_exist(tmp_path, capsys):
    assert cli_main(["replay", str(tmp_path / "nope"), "--checkpoint", str(tmp_path)]) == 2
    assert f"capture directory {str(tmp_path / 'nope')!r} does not exist" in capsys.readouterr().err


def _slot_as_directory(cap):
    (cap / "slot-000001.msgpack").mkdir()
    return "slot-000001.msgpack: cannot read this capture file (it is a directory)"


def _slot_as_dangling_symlink(cap):
    (cap / "slot-000001.msgpack").symlink_to(cap / "gone.msgpack")
    return f"slot-000001.msgpack: cannot read this capture file (a symlink to {str(cap / 'gone.msgpack')!r}, which does not exist)"


def _slot_as_symlink_loop(cap):
    (cap / "slot-000001.msgpack").symlink_to(cap / "slot-000001.msgpack")
    return "slot-000001.msgpack: cannot read this capture file (Too many levels of symbolic links)"


@pytest.mark.parametrize("unreadable", [_slot_as_directory, _slot_as_dangling_symlink, _slot_as_symlink_loop])
def test_replay_of_a_capture_file_it_cannot_read_names_it_without_a_traceback(tmp_path, capsys, unreadable):
    """Real unreadable files (tests run as root, so no chmod): exit 2 and one line, before the checkpoint loads."""
    cap = _capture(tmp_path, _record())  # slot-000000 is fine: the bad one is found beside good ones
    says = unreadable(tmp_path / "capture")
    assert cli_main(["replay", cap, "--checkpoint", str(tmp_path / "no-checkpoint")]) == 2
    err = capsys.readouterr().err
    assert says in err and err.strip().endswith("remove it or replay another directory"), err
    assert len(err.strip().splitlines()) == 1, err


def test_replay_of_a_directory_it_cannot_list_names_it_without_a_traceback(tmp_path, capsys):
    cap = tmp_path / ("c" * 300)  # a name longer than the file system takes: stat and listing fail with ENAMETOOLONG
    assert cli_main(["replay", str(cap), "--checkpoint", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"capture directory {str(cap)!r}: cannot list it (File name too long); check the path" in err, err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    "device, cuda_devices, says",
    [
        ("bogus", 0, "--device 'bogus' is not a device; use cpu, cuda or cuda:N"),
        ("cuda", 0, "--device 'cuda' but this torch has no CUDA device"),
        ("cuda:1", 1, "--device 'cuda:1' but torch sees 1 CUDA device(s)"),
    ],
)
def test_replay_refuses_a_device_this_host_has_not(ckpt, tmp_path, capsys, monkeypatch, device, cuda_devices, says):  # noqa: F811
    monkeypatch.setattr("server.manifest.checks._cuda_device_count", lambda: cuda_devices)
    cap = _capture(tmp_path, _record())
    assert cli_main(["replay", cap, "--checkpoint", str(ckpt), "--device", device]) == 2
    assert says in capsys.readouterr().err
