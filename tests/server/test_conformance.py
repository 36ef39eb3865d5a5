"""`python3 -m wire.conformance` against our own server: every clause passes, camera JPEGs included.

The server serves the shipped camera checkpoint (bench/checkpoints/reacher_camera_untrained, front
64x64) so a JPEG is decoded into the policy and a corrupt one is refused BAD_IMAGE, end to end.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from server.service import PolicyServer
from wire import conformance

CAMERA_CKPT = Path(__file__).resolve().parents[2] / "bench" / "checkpoints" / "reacher_camera_untrained"


@pytest.mark.integration
def test_our_server_passes_the_conformance_suite(router, tmp_path, capsys):
    m = {
        "model": {"repo_or_path": str(CAMERA_CKPT)},
        "model_id": "arm-cam",
        "replica_id": "r0",
        "max_sessions": 8,
        "warmup_inferences": 1,
        "zenoh": {"connect_endpoints": [router]},
        "health_port": 0,
        "audit_path": str(tmp_path / "audit.jsonl"),
        "security": {"max_observation_bytes": 65536},
    }
    srv = PolicyServer(m).start()
    try:
        rc = conformance.main(["--router", router, "--model", "arm-cam", "--max-observation-bytes", "65536"])
    finally:
        srv.stop()
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "FAIL" not in out and "PASS  4.2   a corrupt JPEG -> BAD_IMAGE" in out, out
    assert out.count("PASS") >= 25, out
