"""Tick timing: the shared tick schedule of a shard and the classification of every tick.

A tick of robot r is scheduled at ``t0 + phase_r + k * period``. Its action is ready at ``t_end``;
``lateness = t_end - scheduled``. Two parts make it up:

    scheduled ──host_delay──► t_begin ──engine──► t_end
    (the shard loop reached    (notify_observation +
     this robot: bench cost)    get_action: system under test)

Classes, after iRobot's ros2-performance (late > 20 % of the period, too late > one period):
  on_time   lateness <= 0.2 period
  host_late the bench host caused it: host_delay alone exceeds 0.2 period, or the loop slot was
            starved of CPU (wall time far above its thread CPU time) while the engine part was late
  late      the system under test made it later than 0.2 period
  too_late  the system under test made it later than one period

Invariant: a tick is counted in exactly one class, and lateness the bench caused is never
counted as late or too_late.
"""

from __future__ import annotations

import numpy as np

ON_TIME, LATE, TOO_LATE, HOST_LATE = 0, 1, 2, 3
TICK_CLASSES = {ON_TIME: "on_time", LATE: "late", TOO_LATE: "too_late", HOST_LATE: "host_late"}
LATE_FRACTION = 0.2


def classify_tick(lateness_s: float, host_delay_s: float, period_s: float, starved: bool = False) -> int:
    """The class of one tick (a scalar version of `classify_ticks`, cheap enough for the loop)."""
    late_after = LATE_FRACTION * period_s
    if lateness_s <= late_after:
        return ON_TIME
    if host_delay_s > late_after or starved:
        return HOST_LATE
    return TOO_LATE if lateness_s > period_s else LATE


def classify_ticks(lateness_s, host_delay_s, period_s, starved=None) -> np.ndarray:
    """Vectorised classes (int8) for arrays of ticks; `period_s` may be a scalar or an array."""
    lateness = np.asarray(lateness_s, dtype=float)
    host = np.asarray(host_delay_s, dtype=float)
    period = np.broadcast_to(np.asarray(period_s, dtype=float), lateness.shape)
    late_after = LATE_FRACTION * period
    starved_arr = np.zeros(lateness.shape, bool) if starved is None else np.asarray(starved, bool)
    out = np.full(lateness.shape, ON_TIME, dtype=np.int8)
    is_late = lateness > late_after
    host_late = is_late & ((host > late_after) | starved_arr)
    out[is_late] = LATE
    out[is_late & (lateness > period)] = TOO_LATE
    out[host_late] = HOST_LATE
    return out


def slot_starved(wall_s: float, cpu_s: float, period_s: float) -> bool:
    """A loop slot was starved when it waited for CPU longer than the late threshold."""
    return (wall_s - cpu_s) > LATE_FRACTION * period_s


class TickSchedule:
    """Phase slots of one shard: robots at one fps share `slots` wake-ups per period.

    Robots are spread evenly over the slots so one wake-up serves ~N/slots robots and their
    ticks are not all due at the same instant (real fleets are not phase-locked). Each slot has
    its own deadline; `next_due()` returns the earliest slot to run.
    """

    def __init__(self, t0: float, periods: list[float], slots_per_period: int = 6, keys: list | None = None):
        """`keys` (optional, one per robot) keeps robots of different kinds in different slots."""
        self.t0 = t0
        self.slots: list[tuple[float, float]] = []  # (period, phase) per slot id
        self.members: list[list[int]] = []
        self.slot_key: list = []
        self.robot_slot = [0] * len(periods)
        by_kind: dict[tuple, list[int]] = {}
        for i, p in enumerate(periods):
            by_kind.setdefault((p, None if keys is None else keys[i]), []).append(i)
        for (period, key), robots in sorted(by_kind.items(), key=lambda kv: (kv[0][0], repr(kv[0][1]))):
            n = max(1, min(slots_per_period, len(robots)))
            base = len(self.slots)
            for s in range(n):
                self.slots.append((period, period * s / n))
                self.members.append([])
                self.slot_key.append(key)
            for j, r in enumerate(robots):
                sid = base + (j * n) // len(robots)
                self.robot_slot[r] = sid
                self.members[sid].append(r)
        self.k = [0] * len(self.slots)  # next tick index per slot

    def due_time(self, sid: int) -> float:
        period, phase = self.slots[sid]
        return self.t0 + phase + self.k[sid] * period

    def next_due(self) -> tuple[int, float]:
        best, best_t = 0, float("inf")
        for sid in range(len(self.slots)):
            t = self.due_time(sid)
            if t < best_t:
                best, best_t = sid, t
        return best, best_t

    def advance(self, sid: int, now: float) -> int:
        """Move slot `sid` past its current tick; skip ticks already more than one period gone.

        Returns how many ticks were skipped (a loop that fell behind drops ticks rather than
        bunching them: the skipped ones are reported as host-late by the caller).
        """
        period, _ = self.slots[sid]
        self.k[sid] += 1
        skipped = 0
        while self.due_time(sid) + period < now:
            self.k[sid] += 1
            skipped += 1
        return skipped
