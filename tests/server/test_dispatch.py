"""The Ray Serve dispatch backend (server.dispatch): the forward pass of a micro-batch runs on a Serve
deployment of the same checkpoint, and the actions are the same bytes as the local backend's, RTC guidance
and per-session processors included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="Ray Serve is the optional `cluster` extra")

from server.dispatch import RayServeForward  # noqa: E402
from server.policies.checkpoint import load_checkpoint  # noqa: E402
from server.runtime import InferItem, LocalForward, ModelRuntime, set_torch_threads  # noqa: E402

pytestmark = [pytest.mark.integration]
CKPT = Path(__file__).resolve().parents[2] / "bench" / "checkpoints" / "reacher"


@pytest.fixture(scope="module")
def serve_forward():
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        logging_level="WARNING",
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(CKPT.parents[2])}},
    )
    fwd = RayServeForward.deploy(
        model_id="reacher",
        replica_id="t0",
        repo_or_path=str(CKPT),
        device="cpu",
        dtype="float32",
        torch_threads=1,
        replicas=1,
        cpus_per_replica=1.0,
        gpus_per_replica=0.0,
        max_inflight=2,
        address=None,
    )
    try:
        yield fwd
    finally:
        fwd.close()
        ray.shutdown()


def _items(runtime: ModelRuntime, n: int, rng: np.random.Generator) -> list[InferItem]:
    cfg = runtime.config
    items = []
    for i in range(n):
        pipe = runtime.new_pipeline()
        state = rng.normal(size=cfg.state_dim).astype(np.float32)
        h = runtime.execution_horizon
        rtc = i % 2 == 0  # guided and plain sessions in one micro-batch
        prefix = rng.normal(scale=0.1, size=(h, cfg.action_dim)).astype(np.float32) if rtc else None
        items.append(
            InferItem(
                pipe, state, {}, inference_delay=2 if rtc else 0, prefix_model=prefix, prefix_robot=prefix, rtc=rtc
            )
        )
    return items


def test_serve_backed_forward_passes_give_the_local_backends_actions_byte_for_byte(serve_forward):
    set_torch_threads(1)
    local = ModelRuntime(load_checkpoint(str(CKPT)))
    remote = ModelRuntime(load_checkpoint(str(CKPT)))
    remote.forward = serve_forward
    assert isinstance(local.forward, LocalForward)
    for batch in (1, 3, 8):
        items_local = _items(local, batch, np.random.default_rng(batch))
        items_remote = _items(remote, batch, np.random.default_rng(batch))
        got_local, got_remote = local.infer(items_local), remote.infer(items_remote)
        for a, b in zip(got_local, got_remote):
            assert a.error is None and b.error is None, (a.error, b.error)
            assert a.rtc_applied == b.rtc_applied
            assert a.chunk_model.tobytes() == b.chunk_model.tobytes()
            assert a.chunk_robot.tobytes() == b.chunk_robot.tobytes()


def test_a_failed_serve_call_fails_the_batch_not_the_server(serve_forward):
    remote = ModelRuntime(load_checkpoint(str(CKPT)))

    def broken(batch, delays, prefixes):
        raise RuntimeError("replica died")

    remote.forward = broken
    results = remote.infer(_items(remote, 2, np.random.default_rng(0)))
    assert all(r.error_code == "INTERNAL" and "replica died" in r.error for r in results)
