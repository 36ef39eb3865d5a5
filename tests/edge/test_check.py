"""check_engine: the built-in engines (sync, rtc, remote with and without a server) keep the engine contract, and
the check fails, naming the promise, on engines that break it (a blocking get_action, file I/O on the control
thread, a stop() that is not idempotent, a raw array for an action, a worker engine that infers inline)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from edge import RemoteEngineConfig, make_engine
from edge.check import ProbePolicy, check_engine
from edge.rtc import RTCEngine, RTCEngineConfig
from edge.sync import SyncEngineConfig
from tests.edge.conftest import ACTION_NAMES, S

REMOTE_OBS = {"state": np.zeros(S, np.float32)}


def rtc(policy):
    return make_engine(RTCEngineConfig(), policy=policy)


def remote(router, **kw):
    cfg = dict(
        connect_endpoints=[router],
        model_id="arm",
        action_names=ACTION_NAMES,
        state_dim=S,
        request_timeout_s=1.0,
        reconnect_initial_backoff_s=0.1,
        reconnect_max_backoff_s=0.3,
        lease_ms=500,
        execution_horizon=5,
        buffer_time_s=0.2,
    )
    return make_engine(RemoteEngineConfig(**{**cfg, **kw}))


def test_the_rtc_engine_keeps_the_engine_contract():
    check_engine(rtc)


def test_the_sync_engine_keeps_the_engine_contract_as_an_inline_engine():
    check_engine(lambda policy: make_engine(SyncEngineConfig(n_action_steps=5), policy=policy), inline_inference=True)


def test_an_engine_instance_is_checked_too():
    check_engine(
        make_engine(RTCEngineConfig(fps=50), policy=ProbePolicy(action_dim=2)), action_dim=2, expect_chunks=True, fps=50
    )


@pytest.mark.parametrize("fallback", ["hold", "zero", "repeat_last"])
def test_the_remote_engine_with_no_server_keeps_the_engine_contract(router, fallback):
    check_engine(lambda: remote(router, fallback=fallback), observation=REMOTE_OBS, action_dim=len(ACTION_NAMES))


def test_the_remote_engine_streaming_from_a_server_keeps_the_engine_contract(router, server_factory, ckpt):
    server_factory(ckpt)
    check_engine(
        lambda: remote(router, fallback="zero"),
        observation=REMOTE_OBS,
        action_dim=len(ACTION_NAMES),
        expect_chunks=True,
        first_chunk_timeout_s=20.0,
    )


def test_a_worker_engine_that_infers_on_the_control_thread_fails():
    with pytest.raises(
        AssertionError,
        match=r"check_engine\(SyncEngine\): the policy ran on the caller's thread 1 "
        r"times; .* passes inline_inference=True",
    ):
        check_engine(lambda policy: make_engine(SyncEngineConfig(), policy=policy))


class _WaitsForTheWorker(RTCEngine):
    """Running, get_action waits (up to 5 s) for the worker when the queue is empty: it blocks while inference hangs."""

    def get_action(self):
        t0 = time.monotonic()
        while (
            self._thread is not None
            and not self.queue.qsize()
            and not self._stop.is_set()
            and time.monotonic() - t0 < 5
        ):
            self._stop.wait(0.001)
        return super().get_action()


class _WritesEveryAction(RTCEngine):
    """Logs each action to a file on the control thread: quick enough on an idle disk, I/O all the same."""

    path = "/dev/null"

    def get_action(self):
        a = super().get_action()
        with open(self.path, "a") as f:
            f.write(f"{a}\n")
        return a


class _StopsOnce(RTCEngine):
    def stop(self):
        if self._stop.is_set():
            raise RuntimeError("already stopped")
        super().stop()


class _ReturnsArrays(RTCEngine):
    def get_action(self):
        a = super().get_action()
        return None if a is None else a.values


def test_a_blocking_get_action_fails_on_its_time_while_the_policy_hangs():
    with pytest.raises(
        AssertionError,
        match=r"check_engine\(_WaitsForTheWorker\): get_action\(\) took 0\.\d+ s while the "
        r"policy hung in the worker \(bound 0.1 s\); the control thread never waits",
    ):
        check_engine(lambda policy: _WaitsForTheWorker(RTCEngineConfig(), policy=policy))


def test_a_get_action_that_writes_a_file_fails_naming_the_call():
    with pytest.raises(
        AssertionError,
        match=r"get_action\(\) called io.open \(called from .*test_check.py:\d+ in "
        r"get_action\) on the caller's thread; the control thread never waits, "
        r"sleeps, logs or does I/O",
    ):
        check_engine(lambda policy: _WritesEveryAction(RTCEngineConfig(), policy=policy))


def test_a_stop_that_is_not_idempotent_fails():
    with pytest.raises(AssertionError, match=r"stop\(\) a second time raised RuntimeError: already stopped"):
        check_engine(lambda policy: _StopsOnce(RTCEngineConfig(), policy=policy))


def test_an_engine_returning_raw_arrays_fails_naming_the_type():
    with pytest.raises(
        AssertionError,
        match=r"get_action\(\) returned ndarray while streaming; it returns an "
        r"edge.engine.Action or None",
    ):
        check_engine(lambda policy: _ReturnsArrays(RTCEngineConfig(), policy=policy))


def test_a_width_other_than_the_declared_one_fails():
    with pytest.raises(AssertionError, match=r"returned 3 values while streaming; the declared action_dim is 2"):
        check_engine(rtc, action_dim=2)


def test_the_probe_stalls_only_off_the_control_thread():
    p = ProbePolicy(action_dim=2, chunk_size=4)
    p.control_thread = threading.get_ident()
    p.stall()
    chunk = p.predict_action_chunk({}, 0, None)  # the control thread: at once (an inline engine is not hung)
    assert chunk.shape == (4, 2) and p.calls_on_control_thread == 1 and chunk[0].tobytes() in p.rows
