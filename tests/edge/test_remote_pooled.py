"""The remote engine with its worker on a shared WorkerPool (as a bench shard hosts a hundred): the same tests as
with a thread per engine (tests/edge/test_remote.py), run again with every engine they make pooled, and the pool's
own promise: one thread for many engines, none per engine."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import tests.edge.test_remote as remote
from edge import EngineState, RemoteEngineConfig, make_engine
from edge.remote.drive import WorkerPool
from tests.edge.conftest import ACTION_NAMES, S

SAME_TESTS = [
    remote.test_steady_streaming_never_starves_after_the_first_chunk,
    remote.test_a_request_leaves_on_the_tick_whose_action_reaches_the_buffer,
    remote.test_server_killed_mid_episode_degrades_safely_and_recovers,
    remote.test_hung_server_is_caught_by_the_request_timeout,
    remote.test_a_replica_appearing_cuts_the_reconnect_backoff_short,
    remote.test_a_reset_abandons_the_request_in_flight_and_sends_the_new_episode_at_once,
]


@pytest.fixture
def pool():
    p = WorkerPool("test engine pool")
    yield p
    p.close(wait=False)


@pytest.mark.parametrize("test", SAME_TESTS, ids=lambda t: t.__name__.removeprefix("test_"))
def test_pooled(test, pool, monkeypatch, router, server_factory, ckpt):
    monkeypatch.setattr(remote, "make_engine", lambda cfg: make_engine(cfg, pool=pool))
    test(router, server_factory, ckpt)


def test_many_pooled_engines_stream_on_one_thread(pool, router, server_factory, ckpt):
    server_factory(ckpt)
    before = threading.active_count()
    engines = [
        make_engine(
            RemoteEngineConfig(
                connect_endpoints=[router],
                model_id="arm",
                fps=remote.FPS,
                action_names=ACTION_NAMES,
                state_dim=S,
                lease_ms=500,
                execution_horizon=5,
                buffer_time_s=0.2,
                client_uuid=f"pooled-{i}",
            ),
            pool=pool,
        )
        for i in range(6)  # the test server takes 8 sessions
    ]
    for e in engines:
        e.start()
    try:
        names = {t.name for t in threading.enumerate()}
        assert not any(n.startswith("remote-engine pooled-") for n in names), "a pooled engine started a thread"
        k = 0

        def all_streaming(_trace) -> bool:
            nonlocal k
            k += 1
            for j, e in enumerate(engines[1:]):
                e.notify_observation({"state": np.full(S, 0.01 * (k + j), np.float32)})
                e.get_action()
            return all(e.stats["chunks"] >= 2 for e in engines)

        remote.loop(engines[0], 20.0, until=all_streaming)
        assert all(e.stats["chunks"] >= 2 for e in engines), [e.stats["chunks"] for e in engines]
        assert all(e.state == EngineState.STREAMING for e in engines)
        # the pool's thread and its call helpers (up to 16, the handshakes'), Zenoh's: none per engine
        assert threading.active_count() - before <= 17
    finally:
        for e in engines:
            e.stop()
    assert all(e.state == EngineState.STOPPED for e in engines)
