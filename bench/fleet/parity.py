"""Golden parity inside a bench run (design 13.6): a robot's `remote` engine and a local `rtc` engine,
fed the same observations, the same policy and the same injected delays, must hold byte-identical
merged queues and hand out byte-identical actions.

    robot tick ── obs ──► ParityEngine ──► remote engine (real server, router, site proxy)
                              │      └───► rtc engine (server.runtime.LocalPredictor, in this shard)
                              └─ after every request: both leftovers compared byte for byte;
                                 every tick: both actions compared; the remote action is executed

The pair runs in lockstep on the control thread (a request blocks the tick for its round trip), so
consumption between a request and its merge is identical on both sides: a parity group measures
equality, not timing. Delays are injected (`latency_override`): request n of both engines merges with
`delay_steps[n]` control steps, drawn from the robot's seed, so the comparison does not depend on
this machine's timing. A scenario group opts in with `shadow: {engine: rtc, max_delay_steps: N}`.

Invariant: every compared request and tick is counted in `parity` (checks, mismatches, first
mismatch), which the shard reports at the end and bench.evidence.figures turns into `parity_*` figures.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from edge.engine import Action, EngineState

SHADOW_ENGINES = ("rtc",)


class ParityEngine:
    """The engine interface over a lockstepped (remote, local rtc) pair; executes the remote's actions."""

    def __init__(self, engine_cfg: dict, shadow: dict, seed: int = 0, remote_factory=None, policy=None):
        from bench.scenario.load import shadow_engine_config
        from edge import RemoteEngineConfig
        from edge.remote import RemoteEngine
        from edge.rtc import RTCEngine

        cfg = RemoteEngineConfig.from_dict(dict(engine_cfg))
        self.cfg = cfg
        self.dt = 1.0 / cfg.fps
        rng = np.random.default_rng(seed)
        max_d = int(shadow.get("max_delay_steps", 0))
        self.delays_s = [float(d) * self.dt for d in rng.integers(0, max_d + 1, size=100_000)]
        override = lambda n: self.delays_s[(n - 1) % len(self.delays_s)]  # noqa: E731
        self.remote = (remote_factory or RemoteEngine)(cfg, latency_override=override)
        if policy is None:
            from server.runtime import LocalPredictor

            policy = LocalPredictor.from_checkpoint(str(shadow["checkpoint"]), rtc=cfg.rtc_enabled)
        self.local = RTCEngine(shadow_engine_config(cfg), policy=policy, latency_override=override)
        self._obs: dict | None = None
        self._fresh = False
        self.parity: dict[str, Any] = {
            "queue_checks": 0,
            "queue_mismatches": 0,
            "action_checks": 0,
            "action_mismatches": 0,
            "request_failures": 0,
            "first_mismatch": "",
        }

    # --- the engine interface ----------------------------------------------------------------------

    def start(self) -> None:
        self.local._state = EngineState.STREAMING  # driven by step_once here, never by its own thread

    def stop(self) -> None:
        for e in (self.remote, self.local):
            try:
                e.stop()
            except Exception:
                pass

    def reset(self) -> None:
        self.remote.reset()
        self.local.reset()
        self._obs, self._fresh = None, False

    def pause(self) -> None:
        self.remote.pause()
        self.local.pause()

    def resume(self) -> None:
        self.remote.resume()
        self.local.resume()

    def notify_observation(self, obs: dict) -> None:
        self._obs, self._fresh = obs, True

    def get_action(self) -> Action | None:
        if self._fresh and self.remote.queue.qsize() * self.dt <= self.remote.execution_plan().buffer_s:
            self._fresh = False
            self._request_pair(self._obs)
        x, y = self.remote.get_action(), self.local.get_action()
        if x is not None and y is not None and x.source == "chunk":
            self.parity["action_checks"] += 1
            if np.asarray(x.values, np.float32).tobytes() != np.asarray(y.values, np.float32).tobytes():
                self._mismatch("action_mismatches", f"action differs by {np.abs(x.values - y.values).max():.3g}")
        return x

    def _request_pair(self, obs: dict) -> None:
        self.remote.notify_observation(obs)
        self.local.notify_observation(obs)
        outcome = self.remote.step_once()
        if outcome != "ok":
            self.parity["request_failures"] += 1
            # the pair is out of step from here: start both over from empty queues in a new episode
            self.remote.reset()
            self.local.reset()
            return
        self.local.step_once()
        self.parity["queue_checks"] += 1
        for name in ("get_left_over", "get_processed_left_over"):
            a, b = getattr(self.remote.queue, name)(), getattr(self.local.queue, name)()
            if a.shape != b.shape or a.tobytes() != b.tobytes():
                diff = np.abs(a - b).max() if a.shape == b.shape and a.size else math.nan
                self._mismatch(
                    "queue_mismatches",
                    f"request {self.parity['queue_checks']}: {name} differs "
                    f"(shapes {a.shape} vs {b.shape}, max diff {diff:.3g})",
                )
                break

    def _mismatch(self, key: str, what: str) -> None:
        self.parity[key] += 1
        if not self.parity["first_mismatch"]:
            self.parity["first_mismatch"] = what

    # --- status: the remote's, plus the comparison -------------------------------------------------

    @property
    def ready(self) -> bool:
        return self.remote.ready

    @property
    def failed(self) -> bool:
        return self.remote.failed

    @property
    def state(self):
        return self.remote.state

    @property
    def stats(self) -> dict:
        return {**self.remote.stats, "parity": dict(self.parity)}

    def drain_records(self) -> list[dict]:
        return self.remote.drain_records()

    def drain_transitions(self) -> list:
        return self.remote.drain_transitions()


def make_parity_engine(engine_cfg: dict, shadow: dict, seed: int = 0) -> ParityEngine:
    if shadow.get("engine", "rtc") not in SHADOW_ENGINES:
        raise ValueError(f"shadow.engine {shadow.get('engine')!r}: known {', '.join(SHADOW_ENGINES)}")
    return ParityEngine(engine_cfg, shadow, seed)
