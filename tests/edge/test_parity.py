"""Golden parity (design 13.6): the local `rtc` engine and the `remote` engine, fed the same observations,
the same deterministic policy and the same injected delays, hold byte-identical merged queues.

The remote side is the real thing: a policy server (flow matching with RTC guidance) behind a real
router; the local side runs the server's own inference path in-process (`LocalPredictor`). Only the
delays are injected (`latency_override`), so the comparison does not depend on this machine's timing.
"""

from __future__ import annotations

import numpy as np

from edge.remote import RemoteEngine, RemoteEngineConfig
from edge.rtc import RTCEngine, RTCEngineConfig
from server.runtime import LocalPredictor
from tests.edge.conftest import ACTION_NAMES, S

FPS = 30.0
DELAYS_S = [0.0, 0.05, 0.12, 0.02, 0.2, 0.09, 0.0, 0.15, 0.04, 0.11]  # injected per request
CONSUME = [3, 0, 5, 2, 7, 1, 4, 0, 6, 2]  # actions the robot executes between requests


def test_rtc_and_remote_engines_merge_byte_identical_queues(router, server_factory, ckpt):
    server_factory(ckpt)
    remote = RemoteEngine(
        RemoteEngineConfig(
            connect_endpoints=[router],
            model_id="arm",
            fps=FPS,
            action_names=ACTION_NAMES,
            state_dim=S,
            execution_horizon=5,
            request_timeout_s=10.0,
            rtc_enabled=True,
            trim="real_delay",
        ),  # lockstep executes nothing in flight: only real_delay trims
        latency_override=lambda n: DELAYS_S[n - 1],
    )
    local = RTCEngine(
        RTCEngineConfig(fps=FPS, execution_horizon=5, rtc_enabled=True, trim="real_delay"),
        policy=LocalPredictor.from_checkpoint(str(ckpt)),
        latency_override=lambda n: DELAYS_S[n - 1],
    )
    rng = np.random.default_rng(7)
    try:
        for k in range(len(DELAYS_S)):
            obs = {"state": rng.normal(size=S).astype(np.float32)}
            remote.notify_observation(obs)
            local.notify_observation(obs)
            if k % 2:  # the observation's own tick executes its action before the request is built (a worker
                # thread's order): both engines must still plan from that tick (prefix and trim include it)
                x, y = remote.get_action(), local.get_action()
                assert (x is None) == (y is None) and (x is None or x.values.tobytes() == y.values.tobytes())
            assert remote.step_once() == "ok", remote.stats["last_error"]
            assert local.step_once()
            for name in ("get_left_over", "get_processed_left_over"):
                a, b = getattr(remote.queue, name)(), getattr(local.queue, name)()
                assert a.shape == b.shape, f"request {k}: {name} shapes differ"
                assert a.tobytes() == b.tobytes(), f"request {k}: {name} differs by {np.abs(a - b).max()}"
            for _ in range(CONSUME[k]):
                x, y = remote.get_action(), local.get_action()
                assert (x is None) == (y is None)
                if x is not None:
                    assert x.values.tobytes() == y.values.tobytes()
        assert any(m["trimmed"] > 0 for m in local.merges), "the injected delays must trim some merges"
        assert remote.stats["chunks"] == len(DELAYS_S)
    finally:
        remote.stop()
        local.stop()
