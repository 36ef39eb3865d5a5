"""`check_engine`: the contract of `edge.engine` as a check anyone can run on an engine (a built-in one or theirs).

    check_engine(lambda policy: make_engine(RTCEngineConfig(), policy=policy))         # a local engine
    check_engine(lambda: make_engine(RemoteEngineConfig(...)), action_dim=3,           # the remote one, as a robot
                 observation={"state": np.zeros(4, np.float32)})                       # configures it
    # raises AssertionError naming the promise that broke and what to do

It drives the engine as a control loop does (`notify_observation` then `get_action` each tick) through its
whole life and checks what edge/engine.py promises: the lifecycle (STOPPED before `start()`, a second `start()`
does nothing, `stop()` twice is fine, `start()` after `stop()` raises EngineStopped, calls outside a run raise
nothing and start nothing, a stopped engine executes nothing of its queue); `get_action()` returns an `Action`
(1-D finite float values, `action_dim` wide, a known source) or None, never raises, and returns in bounded
time, also while the policy hangs; on the caller's thread neither call waits, sleeps, logs or does I/O
(`sys.setprofile` watches that thread for sockets, files, zenoh, sleeps and thread waits); `pause()` stops
inference and keeps the state PAUSED; `reset()` executes nothing of the finished episode; the state is always
an `EngineState`, `failed` is exactly DEAD, and `drain_transitions()` is one chain of state names that
never leaves DEAD.

A factory that takes one argument gets the checker's `ProbePolicy` (a numpy policy the checker can hang), so
the chunk actions can be traced to the policy and the bound on `get_action` is tested with a stalled worker.
An engine that infers on the control thread by design (`sync`) says so with `inline_inference=True`. No torch.
"""

from __future__ import annotations

import inspect
import math
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from edge.engine import Action, Engine, EngineState, EngineStopped, FallbackBehavior

__all__ = ["ProbePolicy", "check_engine"]

_SOURCES = {"chunk"} | {f.value for f in FallbackBehavior if f != FallbackBehavior.HOLD}  # hold gives None
# what a control thread must never call inside notify_observation / get_action (module, name; "" = any name)
_BLOCKING_PY = {
    ("threading", "wait"),
    ("threading", "wait_for"),
    ("threading", "join"),
    ("logging", "_log"),
    ("socket", ""),
    ("ssl", ""),
    ("selectors", ""),
    ("subprocess", ""),
    ("http.client", ""),
    ("urllib.request", ""),
}
_BLOCKING_C = {
    ("time", "sleep"),
    ("builtins", "open"),
    ("io", "open"),
    ("_io", "open"),
    ("builtins", "print"),
    ("builtins", "input"),
    ("posix", "read"),
    ("posix", "write"),
    ("posix", "open"),
    ("posix", "fsync"),
    ("select", ""),
    ("_socket", ""),
    ("socket", ""),
    ("_ssl", ""),
}

_FILE_TYPES = {"TextIOWrapper", "BufferedWriter", "BufferedReader", "BufferedRandom", "FileIO"}


class ProbePolicy:
    """The checker's policy: `predict_action_chunk` returns a (chunk_size, action_dim) float32 chunk whose rows are
    unique to their call, so an executed action can be traced to it. After `stall()`, a call made off the control
    thread hangs until `release()` (at most `max_stall_s`): a worker stuck in inference."""

    def __init__(self, action_dim: int = 3, chunk_size: int = 20, max_stall_s: float = 10.0):
        self.action_dim, self.chunk_size, self.max_stall_s = action_dim, chunk_size, max_stall_s
        self.control_thread: int | None = None
        self.rows: set[bytes] = set()
        self.calls = 0
        self.calls_on_control_thread = 0
        self._go = threading.Event()
        self._go.set()
        self._inside = threading.local()
        self._lock = threading.Lock()

    def stall(self) -> None:
        self._go.clear()

    def release(self) -> None:
        self._go.set()

    def inside(self) -> bool:
        """True while this thread runs predict_action_chunk (an inline engine's policy time is not the engine's)."""
        return getattr(self._inside, "on", False)

    def predict_action_chunk(self, obs, inference_delay, prefix) -> np.ndarray:
        on_control = threading.get_ident() == self.control_thread
        self._inside.on = True
        try:
            if not on_control:
                self._go.wait(self.max_stall_s)
            with self._lock:
                n = self.calls
                self.calls += 1
                self.calls_on_control_thread += on_control
            rows = np.arange(self.chunk_size, dtype=np.float32)[:, None] * 0.5
            chunk = (n + 1) * 1000.0 + rows + np.arange(self.action_dim, dtype=np.float32)[None, :] * 0.125
            chunk = chunk.astype(np.float32)
            with self._lock:
                self.rows.update(r.tobytes() for r in chunk)
            return chunk
        finally:
            self._inside.on = False


class _Watch:
    """sys.setprofile on the calling thread: the first call to something blocking or doing I/O, and where."""

    def __init__(self, probe: ProbePolicy | None):
        self.probe = probe
        self.found: str = ""
        zenoh_mods = [m for name, m in list(sys.modules.items()) if name == "zenoh" or name.startswith("zenoh.")]
        self.zenoh_types = {v for m in zenoh_mods for v in vars(m).values() if isinstance(v, type)}

    def __call__(self, frame, event, arg) -> None:
        if self.found or (self.probe is not None and self.probe.inside()):
            return
        what = ""
        if event == "call":
            mod = frame.f_globals.get("__name__", "")
            name = frame.f_code.co_name
            if (mod, name) in _BLOCKING_PY or (mod, "") in _BLOCKING_PY or mod == "zenoh" or mod.startswith("zenoh."):
                what = f"{mod}.{name}"
                frame = frame.f_back or frame
        elif event == "c_call":
            owner = getattr(arg, "__self__", None)
            mod = getattr(arg, "__module__", None) or (owner.__name__ if inspect.ismodule(owner) else "")
            name = getattr(arg, "__name__", "")
            if (mod, name) in _BLOCKING_C or (mod, "") in _BLOCKING_C or mod.startswith("zenoh"):
                what = f"{mod}.{name}"
            elif owner is not None and type(owner) in self.zenoh_types:
                what = f"zenoh {type(owner).__name__}.{name}"
            elif owner is not None and (
                type(owner).__module__ in ("_socket", "socket", "_ssl") or type(owner).__name__ in _FILE_TYPES
            ):
                what = f"{type(owner).__name__}.{name}"
        if what:
            self.found = f"{what} (called from {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name})"


def _factory(engine_or_factory: Engine | Callable[..., Engine]) -> tuple[Callable[[], Engine], ProbePolicy | None]:
    if isinstance(engine_or_factory, Engine):
        return (lambda: engine_or_factory), None
    if not callable(engine_or_factory):
        raise TypeError(f"check_engine: pass an Engine or a factory returning one, got {engine_or_factory!r}")
    try:
        params = [
            p
            for p in inspect.signature(engine_or_factory).parameters.values()
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    if len(params) == 1:
        probe = ProbePolicy()
        return (lambda: engine_or_factory(probe)), probe
    return engine_or_factory, None


def check_engine(
    engine_or_factory: Engine | Callable[..., Engine],
    *,
    observation: Mapping[str, Any] | None = None,
    action_dim: int | None = None,
    inline_inference: bool = False,
    expect_chunks: bool | None = None,
    fps: float = 30.0,
    run_s: float = 1.0,
    stall_s: float = 0.5,
    max_call_s: float = 0.1,
    first_chunk_timeout_s: float = 10.0,
    stop_timeout_s: float = 15.0,
) -> None:
    """Assert the engine contract (module docstring) on an engine through its whole life (it is stopped after).

    engine_or_factory: an Engine not yet started, a factory `() -> Engine`, or `(policy) -> Engine` that gets the
    checker's ProbePolicy. observation: what the robot would notify (default a 4-wide zero state). action_dim: the
    declared width of every action (the probe's when it is used). inline_inference: the engine runs the policy
    on the caller's thread by design (sync); otherwise doing so fails. expect_chunks: a chunk action must arrive
    within first_chunk_timeout_s (default: when the probe is used). max_call_s bounds every notify_observation and
    get_action, also while the policy hangs for stall_s. Raises AssertionError naming the broken promise."""
    make, probe = _factory(engine_or_factory)
    if probe is not None:
        probe.control_thread = threading.get_ident()
        action_dim = probe.action_dim if action_dim is None else action_dim
    if expect_chunks is None:
        expect_chunks = probe is not None
    obs = dict(observation) if observation is not None else {"state": np.zeros(4, np.float32)}
    eng = make()
    assert isinstance(eng, Engine), (
        f"check_engine: the factory returned {type(eng).__name__}, not an edge.engine.Engine"
    )
    run = _Run(eng, probe, obs, action_dim, inline_inference, fps, max_call_s)
    try:
        run.check()
        run.before_start()
        run.started()
        run.streaming(run_s, first_chunk_timeout_s if expect_chunks else 0.0)
        if probe is not None and not inline_inference:
            run.stalled(stall_s, first_chunk_timeout_s)
        run.watched()
        run.paused()
        run.stopped(stop_timeout_s)
        run.transitions()
    except BaseException:
        if probe is not None:
            probe.release()
        try:  # a failed check leaves no worker or session behind
            eng.stop()
        except Exception:
            pass
        raise


class _Run:
    """One engine driven through its life by check_engine; every tick and status read is checked."""

    def __init__(
        self,
        eng: Engine,
        probe: ProbePolicy | None,
        obs: dict,
        action_dim: int | None,
        inline: bool,
        fps: float,
        max_call_s: float,
    ):
        self.eng, self.probe, self.obs, self.action_dim, self.inline = eng, probe, obs, action_dim, inline
        self.name = type(eng).__name__
        self.period, self.max_call_s = 1.0 / fps, max_call_s
        self.last_chunk: Action | None = None
        self.chunks = 0
        self.episode: int | None = None
        self.transitions_seen: list[tuple] = []

    def fail(self, why: str) -> None:
        raise AssertionError(f"check_engine({self.name}): {why}")

    # --- one tick --------------------------------------------------------------------------------------

    def call(self, what: str, fn: Callable[[], Any], bound: float | None = None, during: str = "") -> Any:
        t0 = time.perf_counter()
        try:
            out = fn()
        except Exception as exc:
            self.fail(
                f"{what} raised {type(exc).__name__}: {exc}{during}; it must never raise for a network, "
                f"server or policy fault (return None or the fallback, and say it in state and stats)"
            )
        took = time.perf_counter() - t0
        if bound is not None and took > bound:
            self.fail(
                f"{what} took {took:.3f} s{during} (bound {bound:g} s); the control thread never waits for "
                f"inference or the network: return what the queue holds, the fallback, or None"
            )
        return out

    def tick(self, during: str = "", chunk_ok: bool = True) -> Action | None:
        self.call("notify_observation", lambda: self.eng.notify_observation(self.obs), self.max_call_s, during)
        a = self.call("get_action()", self.eng.get_action, self.max_call_s, during)
        self.action(a, during, chunk_ok)
        self.check(during)
        return a

    def loop(
        self, seconds: float, until: Callable[[], bool] | None = None, during: str = "", chunk_ok: bool = True
    ) -> None:
        t0 = time.monotonic()
        k = 0
        while time.monotonic() - t0 < seconds and not (until is not None and until()):
            self.tick(during, chunk_ok)
            k += 1
            time.sleep(max(0.0, t0 + k * self.period - time.monotonic()))  # the control loop's own clock

    def action(self, a: Any, during: str, chunk_ok: bool) -> None:
        if a is None:
            return
        if not isinstance(a, Action):
            self.fail(f"get_action() returned {type(a).__name__}{during}; it returns an edge.engine.Action or None")
        v = a.values
        if not isinstance(v, np.ndarray) or v.ndim != 1 or not np.issubdtype(v.dtype, np.floating):
            self.fail(f"get_action() returned values {v!r}{during}; Action.values is a 1-D floating-point ndarray")
        if not np.isfinite(v).all():
            self.fail(f"get_action() returned non-finite values {v}{during}; no NaN or inf ever reaches a robot")
        if self.action_dim is not None and v.shape != (self.action_dim,):
            self.fail(
                f"get_action() returned {v.shape[0]} values{during}; the declared action_dim is {self.action_dim}"
            )
        if a.source not in _SOURCES:
            words = sorted(_SOURCES - {"chunk"})
            self.fail(f"Action.source {a.source!r}{during} is neither 'chunk' nor a fallback word {words}")
        if a.age_s is not None and not (math.isfinite(a.age_s) and a.age_s >= 0):
            self.fail(f"Action.age_s {a.age_s!r}{during}: an age is None or finite seconds >= 0")
        if a.source == "chunk":
            if not chunk_ok:
                self.fail(f"get_action() returned a chunk action{during}")
            if self.probe is not None and v.astype(np.float32).tobytes() not in self.probe.rows:
                self.fail(f"get_action() returned {v}{during}, which is no row of any chunk the policy returned")
            if self.episode is not None and a.episode_id is not None and a.episode_id == self.episode:
                self.fail(f"get_action() returned an action of episode {a.episode_id} after reset() ended it")
            self.last_chunk = a
            self.chunks += 1
        elif (
            a.source == FallbackBehavior.REPEAT_LAST.value
            and self.last_chunk is not None
            and not np.array_equal(v, self.last_chunk.values)
        ):
            self.fail(f"a repeat_last fallback returned {v}{during}, not the last action {self.last_chunk.values}")

    def check(self, during: str = "") -> EngineState:
        eng = self.eng
        s = self.call("state", lambda: eng.state)
        if not isinstance(s, EngineState):
            self.fail(f"state is {s!r}{during}; it is an edge.engine.EngineState")
        failed, ready = self.call("failed", lambda: eng.failed), self.call("ready", lambda: eng.ready)
        if not isinstance(failed, bool) or not isinstance(ready, bool):
            self.fail(f"failed and ready are bools, got {failed!r} and {ready!r}{during}")
        if failed != (s == EngineState.DEAD):
            s = eng.state  # the worker may have turned it DEAD between the two reads
            if failed != (s == EngineState.DEAD):
                self.fail(f"failed is {failed} while the state is {s.value}{during}; failed means exactly DEAD")
        stats = self.call("stats", lambda: eng.stats)
        if not isinstance(stats, Mapping):
            self.fail(f"stats is {type(stats).__name__}{during}; it is a mapping of counters")
        self.transitions_seen += self.call("drain_transitions()", eng.drain_transitions)
        records = self.call("drain_records()", eng.drain_records)
        if not isinstance(records, list):
            self.fail(f"drain_records() returned {type(records).__name__}; it returns a list of dicts")
        return s

    # --- the phases ------------------------------------------------------------------------------------

    def before_start(self) -> None:
        eng, during = self.eng, " before start()"
        if self.check(during) != EngineState.STOPPED or eng.ready:
            self.fail(
                f"a new engine is {eng.state.value} (ready {eng.ready}); it is STOPPED and not ready until start()"
            )
        calls = self.probe.calls if self.probe is not None else 0
        self.tick(during)
        for what in ("pause", "resume", "reset"):
            self.call(f"{what}()", getattr(eng, what), self.max_call_s, during)
            if self.check(during) != EngineState.STOPPED:
                self.fail(f"{what}(){during} made the engine {eng.state.value}; outside a run it starts nothing")
        self.inline_check()
        if self.probe is not None and not self.inline and self.probe.calls != calls:
            self.fail(f"the policy ran {self.probe.calls - calls} times{during}; nothing runs before start()")
        self.last_chunk = None

    def started(self) -> None:
        self.call("start()", self.eng.start)
        self.call("start() a second time", self.eng.start, self.max_call_s, " while running")
        if self.check(" after start()") == EngineState.STOPPED:
            self.fail("start() left the engine STOPPED")

    def streaming(self, run_s: float, first_chunk_timeout_s: float) -> None:
        if first_chunk_timeout_s > 0:
            self.loop(first_chunk_timeout_s, until=lambda: self.chunks > 0, during=" while streaming")
            if not self.chunks:
                self.fail(
                    f"no chunk action within {first_chunk_timeout_s:g} s of start() (state "
                    f"{self.eng.state.value}, stats {dict(self.eng.stats)})"
                )
        self.loop(run_s, during=" while streaming")
        self.inline_check()

    def inline_check(self) -> None:
        p = self.probe
        if p is not None and not self.inline and p.calls_on_control_thread:
            self.fail(
                f"the policy ran on the caller's thread {p.calls_on_control_thread} times; an engine with a "
                f"worker never infers in notify_observation or get_action (a synchronous engine by design, "
                f"like sync, passes inline_inference=True)"
            )

    def stalled(self, stall_s: float, recover_s: float) -> None:
        p = self.probe
        p.stall()
        self.episode = self.last_chunk.episode_id if self.last_chunk is not None else None  # reset() ends it
        self.call("reset()", self.eng.reset, self.max_call_s, " with the policy hanging")
        release = threading.Timer(stall_s, p.release)  # released from here, so a blocked get_action ends too
        release.daemon = True
        release.start()
        try:
            self.loop(stall_s, until=p._go.is_set, during=" while the policy hung in the worker")
        finally:
            release.cancel()
            p.release()
        before = self.chunks
        self.loop(recover_s, until=lambda: self.chunks > before, during=" after the policy answered again")
        if self.chunks == before:
            self.fail(f"no chunk action within {recover_s:g} s after a hung policy answered again and reset()")

    def watched(self, ticks: int = 8) -> None:
        watch = _Watch(self.probe)
        for _ in range(ticks):
            for what, fn in (
                ("notify_observation", lambda: self.eng.notify_observation(self.obs)),
                ("get_action()", self.eng.get_action),
            ):
                sys.setprofile(watch)
                try:
                    out = fn()
                except Exception as exc:
                    self.fail(f"{what} raised {type(exc).__name__}: {exc}; it must never raise")
                finally:
                    sys.setprofile(None)
                if watch.found:
                    self.fail(
                        f"{what} called {watch.found} on the caller's thread; the control thread never "
                        f"waits, sleeps, logs or does I/O: hand that to the engine's worker"
                    )
                if what == "get_action()":
                    self.action(out, " (watched)", True)
            time.sleep(self.period)  # the control loop's own clock
        self.inline_check()

    def paused(self) -> None:
        eng, p = self.eng, self.probe
        self.call("pause()", eng.pause, self.max_call_s, " while running")
        s = self.check(" after pause()")
        if s not in (EngineState.PAUSED, EngineState.DEAD):
            self.fail(f"pause() left the engine {s.value}; a paused engine says PAUSED")
        self.tick(" while paused")  # an inference already running may still finish
        calls = p.calls if p is not None else 0
        self.loop(5 * self.period, during=" while paused")
        if p is not None and p.calls > calls:
            self.fail(f"the policy ran {p.calls - calls} times while paused; pause() stops requesting chunks")
        self.call("resume()", eng.resume, self.max_call_s, " while paused")
        if self.check(" after resume()") == EngineState.PAUSED:
            self.fail("resume() left the engine PAUSED")
        self.loop(3 * self.period, during=" after resume()")

    def stopped(self, stop_timeout_s: float) -> None:
        eng, p = self.eng, self.probe
        self.call("stop()", eng.stop, stop_timeout_s)
        self.call("stop() a second time", eng.stop, stop_timeout_s)
        during = " after stop()"
        s = self.check(during)
        if s not in (EngineState.STOPPED, EngineState.DEAD) or eng.ready:
            self.fail(
                f"after stop() the engine is {s.value} (ready {eng.ready}); it is STOPPED (or DEAD) and not ready"
            )
        calls = p.calls if p is not None else 0
        for _ in range(3):
            self.tick(during, chunk_ok=False)
        for what in ("pause", "resume", "reset", "pause", "resume"):
            self.call(f"{what}()", getattr(eng, what), self.max_call_s, during)
            if self.check(during) != s or eng.ready:
                self.fail(
                    f"{what}(){during} made the engine {eng.state.value} (ready {eng.ready}); a stopped engine "
                    f"stays {s.value}"
                )
        self.tick(during, chunk_ok=False)
        if p is not None and p.calls != calls:
            self.fail(f"the policy ran {p.calls - calls} times after stop(); a stopped engine infers nothing")
        try:
            eng.start()
        except EngineStopped:
            pass
        except Exception as exc:
            self.fail(f"start() after stop() raised {type(exc).__name__}: {exc}; it raises edge.engine.EngineStopped")
        else:
            self.fail("start() after stop() returned; an engine runs once: it raises edge.engine.EngineStopped")

    def transitions(self) -> None:
        names = {s.value for s in EngineState}
        prev = None
        for tr in self.transitions_seen + self.eng.drain_transitions():
            if not (isinstance(tr, tuple) and len(tr) == 4):
                self.fail(f"drain_transitions() gave {tr!r}; each is (t_mono, from_state, to_state, reason)")
            t, a, b, _why = tr
            if a not in names or b not in names:
                self.fail(f"transition {tr!r} names a state that is no EngineState value ({sorted(names)})")
            if a == b or a == EngineState.DEAD.value:
                self.fail(f"transition {tr!r}: a transition changes the state, and DEAD is never left")
            if prev is not None and (a != prev[2] or t < prev[0]):
                self.fail(f"transitions {prev!r} then {tr!r} are not one chain in time order")
            prev = tr
        if prev is not None and prev[2] != self.eng.state.value:
            self.fail(f"the last transition goes to {prev[2]} but the state is {self.eng.state.value}")
