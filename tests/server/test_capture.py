"""Debug capture is bounded, and replaying it offline reproduces every chunk byte for byte."""

from __future__ import annotations

import numpy as np

from server.capture import read_capture, replay
from server.cli import main as cli_main
from server.service import PolicyServer
from tests.server.test_service import S, A, ckpt, keys, manifest  # noqa: F401  (fixture reuse)
from tests.server.zclient import RawClient


def test_capture_replays_byte_for_byte_and_stays_bounded(ckpt, router, tmp_path, capsys):  # noqa: F811
    cap = tmp_path / "capture"
    srv = PolicyServer(manifest(ckpt, router, tmp_path, debug={"capture_dir": str(cap), "capture_max": 2},
                                scheduling={"strategy": "round_robin", "max_batch": 4})).start()
    clients = [RawClient(router, keys(), f"robot-{i}") for i in range(3)]
    try:
        for c in clients:
            c.open()
        rng = np.random.default_rng(0)
        for _ in range(3):
            seqs = [c.send(rng.normal(size=S), inference_delay_steps=int(rng.integers(0, 3)),
                           prefix_robot=rng.normal(size=(4, A)).astype(np.float32)) for c in clients]
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
