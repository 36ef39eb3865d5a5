"""The sync and rtc engines with a small deterministic numpy policy (no network, no torch)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from edge import ConfigError, EngineState, make_engine
from edge.rtc import RTCEngine, RTCEngineConfig
from edge.sync import SyncEngineConfig

T, A = 20, 2


class RampPolicy:
    """Chunk row k = state[:A] + 0.01 * k (+ delay marker); optional artificial latency and failures."""

    def __init__(self, latency_s=0.0, fail=False):
        self.latency_s, self.fail, self.calls = latency_s, fail, []

    def predict_action_chunk(self, obs, inference_delay, prefix):
        self.calls.append((inference_delay, None if prefix is None else prefix.shape))
        if self.fail:
            raise RuntimeError("boom")
        if self.latency_s:
            time.sleep(self.latency_s)  # stands in for a forward pass
        base = np.asarray(obs["state"], np.float32)[:A]
        return base[None, :] + 0.01 * np.arange(T, dtype=np.float32)[:, None]


def run(eng, seconds, fps=100.0):
    out, period, t0 = [], 1.0 / fps, time.monotonic()
    k = 0
    while time.monotonic() - t0 < seconds:
        eng.notify_observation({"state": np.full(4, k, np.float32)})
        out.append(eng.get_action())
        k += 1
        time.sleep(max(0.0, t0 + k * period - time.monotonic()))  # the control loop's own rate
    return out


def test_make_engine_builds_each_backend_by_its_type_word():
    pol = RampPolicy()
    assert type(make_engine(RTCEngineConfig(), policy=pol)).__name__ == "RTCEngine"
    assert type(make_engine(SyncEngineConfig(), policy=pol)).__name__ == "SyncEngine"
    with pytest.raises(ConfigError, match="unknown keys"):
        RTCEngineConfig.from_dict({"fpss": 3})
    with pytest.raises(ConfigError, match="needs a policy"):
        make_engine(RTCEngineConfig())


def test_sync_engine_infers_inline_when_the_queue_runs_dry():
    pol = RampPolicy()
    eng = make_engine(SyncEngineConfig(n_action_steps=5), policy=pol)
    eng.start()
    eng.notify_observation({"state": np.zeros(4)})
    vals = [eng.get_action().values[0] for _ in range(7)]
    assert len(pol.calls) == 2 and vals[:5] == pytest.approx([0, 0.01, 0.02, 0.03, 0.04])


def test_rtc_engine_streams_without_starving_after_the_first_chunk():
    pol = RampPolicy(latency_s=0.03)
    eng = make_engine(RTCEngineConfig(fps=100, buffer_time_s=0.1, execution_horizon=5), policy=pol)
    eng.start()
    try:
        acts = run(eng, 1.0)
    finally:
        eng.stop()
    first = next(i for i, a in enumerate(acts) if a is not None)
    assert sum(a is None for a in acts[first:]) <= 2
    assert any(c[1] == (5, A) for c in pol.calls), "later inferences get a prefix of execution_horizon rows"
    assert max(c[0] for c in pol.calls) >= 3, "the estimated delay ceil(latency/dt) reaches the policy"


def test_measured_delay_trims_the_merge():
    pol = RampPolicy()
    eng = RTCEngine(
        RTCEngineConfig(fps=10, trim="real_delay"), policy=pol, latency_override=lambda n: 0.35
    )  # 4 steps at 10 Hz
    eng.notify_observation({"state": np.zeros(4)})
    eng.step_once()
    assert eng.queue.qsize() == T - 4 and eng.merges[-1]["real_delay"] == 4
    eng.step_once()
    assert pol.calls[-1][0] == 4  # the next request assumes the delay measured so far


def test_the_default_trim_keeps_a_first_chunk_from_standstill_whole():
    # trim: consumed is the default (what shipped scenarios run): no action was executed while the first chunk
    # was computed, so none of it is dropped (LeRobot's real_delay drops 4 here)
    eng = RTCEngine(RTCEngineConfig(fps=10), policy=RampPolicy(), latency_override=lambda n: 0.35)
    eng.notify_observation({"state": np.zeros(4)})
    eng.step_once()
    assert eng.queue.qsize() == T and eng.merges[-1]["real_delay"] == 4


def test_reset_during_inference_discards_the_stale_chunk():
    started, release = threading.Event(), threading.Event()

    class Slow(RampPolicy):
        def predict_action_chunk(self, obs, inference_delay, prefix):
            started.set()
            release.wait(5)
            return super().predict_action_chunk(obs, inference_delay, prefix)

    eng = RTCEngine(RTCEngineConfig(), policy=Slow())
    eng.notify_observation({"state": np.zeros(4)})
    t = threading.Thread(target=eng.step_once)
    t.start()
    started.wait(5)
    eng.reset()
    release.set()
    t.join(5)
    assert eng.queue.qsize() == 0 and eng.stats["discarded_chunks"] == 1


def test_pause_keeps_the_queue():
    pol = RampPolicy()
    eng = make_engine(RTCEngineConfig(fps=100, buffer_time_s=0.05), policy=pol)
    eng.start()
    try:
        run(eng, 0.3)
        eng.pause()
        deadline = time.monotonic() + 5  # a step already past the pause check still calls, then merges
        while len(eng.merges) != len(pol.calls) and time.monotonic() < deadline:
            time.sleep(0.01)
        n, q = len(pol.calls), eng.queue.qsize()
        for _ in range(5):
            eng.notify_observation({"state": np.zeros(4)})
        time.sleep(0.3)  # proving that nothing happens while paused
        assert len(pol.calls) == n and eng.queue.qsize() == q and eng.state == EngineState.PAUSED
    finally:
        eng.stop()


def test_a_failing_policy_makes_the_engine_failed_and_sets_the_shutdown_event():
    done = threading.Event()
    eng = RTCEngine(
        RTCEngineConfig(error_retry_s=0.01, max_consecutive_errors=3), policy=RampPolicy(fail=True), shutdown_event=done
    )
    eng.start()
    try:
        for _ in range(3):
            eng.notify_observation({"state": np.zeros(4)})
            if done.wait(1.0):
                break
        assert done.wait(5) and eng.failed and eng.state == EngineState.DEAD
        assert eng.get_action() is None
    finally:
        eng.stop()


def test_a_chunks_row_0_is_the_observations_tick_and_the_prefix_starts_with_its_action():
    """The observation is taken before its tick's get_action: the prefix the policy gets starts with the action
    executed on that tick, and the merge counts that action as consumed, so the new chunk's row j is tick k + j
    (the policy's and the RTC paper's time base; reading the queue after the pop shifted both by one row)."""

    class Recording(RampPolicy):
        def predict_action_chunk(self, obs, inference_delay, prefix):
            self.prefixes = getattr(self, "prefixes", []) + [None if prefix is None else np.array(prefix)]
            return super().predict_action_chunk(obs, inference_delay, prefix)

    pol = Recording()
    eng = RTCEngine(
        RTCEngineConfig(fps=10, execution_horizon=5), policy=pol, latency_override=lambda n: 0.15
    )  # 2 steps at 10 Hz
    eng.notify_observation({"state": np.zeros(4)})
    eng.step_once()  # the first chunk: rows 0.00, 0.01, ...
    eng.notify_observation({"state": np.ones(4)})  # tick k: observation, then its action
    executed = eng.get_action().values
    eng.step_once()  # the request built after that tick's get_action, as the worker thread does
    np.testing.assert_allclose(pol.prefixes[-1][0], executed)  # row 0 of the prefix: tick k's action (0.00)
    assert eng.merges[-1]["idx_before"] == 0
    # one action consumed during inference (tick k's): the new chunk continues at its row 1 = tick k + 1
    np.testing.assert_allclose(eng.get_action().values, [1.01, 1.01], atol=1e-6)


@pytest.mark.parametrize("kind", ["sync", "rtc"])
def test_start_after_stop_raises_and_names_the_fix(kind):
    """An engine runs once, as a session does: start() after stop() used to return silently with the engine
    STOPPED (rtc: no thread) or STREAMING again over the finished run's queue and episode (sync)."""
    cfg = SyncEngineConfig() if kind == "sync" else RTCEngineConfig()
    eng = make_engine(cfg, policy=RampPolicy())
    eng.start()
    eng.start()  # again while it runs: nothing
    eng.stop()
    with pytest.raises(RuntimeError, match=r"runs once; build a new one with make_engine\(config\)"):
        eng.start()
    assert eng.state == EngineState.STOPPED and not eng.ready


def test_a_stopped_engine_executes_nothing_of_its_queue_and_infers_nothing():
    sync = make_engine(SyncEngineConfig(), policy=RampPolicy())
    sync.start()
    sync.notify_observation({"state": np.zeros(4)})
    assert sync.get_action().source == "chunk"  # a chunk of T inferred, T - 1 left
    rtc = RTCEngine(RTCEngineConfig(), policy=RampPolicy())
    rtc.notify_observation({"state": np.zeros(4)})
    rtc.step_once()  # a chunk of T queued
    rtc.start()
    for eng in (sync, rtc):
        eng.stop()
        eng.notify_observation({"state": np.zeros(4)})
        calls = len(eng.policy.calls)
        assert [eng.get_action() for _ in range(3)] == [None] * 3
        assert len(eng.policy.calls) == calls  # sync: no inline inference on a stopped engine either


def test_a_dead_rtc_engine_executes_nothing_of_its_queue():
    done = threading.Event()
    pol = RampPolicy()
    eng = RTCEngine(RTCEngineConfig(queue_threshold=10 * T, max_consecutive_errors=1), policy=pol, shutdown_event=done)
    eng.notify_observation({"state": np.zeros(4)})
    eng.step_once()  # a good chunk of T queued, then every inference fails
    pol.fail = True
    eng.start()
    try:
        eng.notify_observation({"state": np.ones(4)})
        assert done.wait(5) and eng.state == EngineState.DEAD
        assert eng.get_action() is None
        with pytest.raises(RuntimeError, match="is DEAD"):
            eng.start()
    finally:
        eng.stop()


@pytest.mark.parametrize("kind", ["sync", "rtc"])
def test_pause_resume_reset_outside_a_run_raise_nothing_and_keep_the_lifecycle_state(kind):
    cfg = SyncEngineConfig() if kind == "sync" else RTCEngineConfig()
    eng = make_engine(cfg, policy=RampPolicy())
    eng.pause()  # before start(): the engine starts paused
    eng.reset()
    assert eng.state == EngineState.STOPPED
    eng.start()
    assert eng.state == EngineState.PAUSED
    eng.resume()
    assert eng.state == EngineState.STREAMING
    eng.stop()
    for call in (eng.pause, eng.resume, eng.reset, eng.pause):  # resume after stop() made it STREAMING, thread-less
        call()
        assert eng.state == EngineState.STOPPED and not eng.ready


class NanPolicy(RampPolicy):
    """The ramp, with a NaN in one row of every chunk inferred from a state whose first value is negative."""

    def predict_action_chunk(self, obs, inference_delay, prefix):
        chunk = super().predict_action_chunk(obs, inference_delay, prefix)
        if np.asarray(obs["state"])[0] < 0:
            chunk[3, 1] = np.nan
        return chunk


def test_sync_never_executes_a_non_finite_chunk_and_its_get_action_does_not_raise():
    eng = make_engine(SyncEngineConfig(), policy=NanPolicy())
    eng.start()
    eng.notify_observation({"state": np.full(4, -1.0, np.float32)})
    assert eng.get_action() is None  # refused whole: not its first rows either (before: the NaN was executed)
    assert eng.stats["bad_chunks"] == 1 and eng.stats["qsize"] == 0
    eng.notify_observation({"state": np.ones(4, np.float32)})
    a = eng.get_action()
    assert a is not None and np.isfinite(a.values).all()


def test_rtc_never_executes_a_non_finite_chunk_and_keeps_its_leftover():
    eng = RTCEngine(RTCEngineConfig(fps=10, execution_horizon=5), policy=NanPolicy())
    eng.notify_observation({"state": np.ones(4, np.float32)})
    eng.step_once()
    eng.notify_observation({"state": np.full(4, -1.0, np.float32)})
    with pytest.raises(ValueError, match="non-finite"):  # the worker's _run counts it as a failed inference
        eng.step_once()
    assert eng.stats["bad_chunks"] == 1
    values = [eng.get_action().values for _ in range(T)]
    assert all(np.isfinite(v).all() and v[0] >= 1.0 for v in values)  # the good chunk's rows, all of them
