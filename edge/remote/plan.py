"""The execution plan: when the remote engine asks again, as pure functions of the measured delay.

RTC needs d <= s <= H - d: d the delay estimate in control steps, s the steps each chunk is executed for
(counted from its observation's tick), H the chunk's rows. `plan_execution` picks the request point for a d and
an H (or checks an explicit buffer_time_s against them), `delay_steps` turns a latency into d, and `is_due` says
whether a queue of a given length has reached the request point. No state, no clock, no I/O: the engine's
worker calls them each time it decides, and tests and the bench (bench.run.sizing) call them directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ExecutionPlan:
    """When the engine asks again, in control steps: the next request goes out when the queue holds
    `buffer_steps` actions or fewer, so each chunk is executed for `execution_steps` (s) steps counted from
    its observation (s = H - buffer_steps in RTC mode). `violation` names the numbers when the plan breaks
    RTC's d <= s <= H - d (an explicit buffer_time_s, or a delay over half the chunk), else ""."""

    delay_steps: int
    chunk_size: int
    buffer_steps: float
    execution_steps: int
    violation: str
    buffer_s: float  # buffer_steps in seconds: an explicit buffer_time_s exactly, so its timing is unchanged


def plan_execution(
    delay_steps: int, chunk_size: int, dt: float, buffer_time_s: float | None, rtc_enabled: bool = True
) -> ExecutionPlan:
    """The request point for a measured delay d (control steps) and a chunk of H rows.

    Derived (buffer_time_s None), RTC: s = H // 2 clamped into [d, H - d]; a chunk shorter than 2d has
    no such s, so s = d (the one request in flight cannot be outrun) and the plan names the violation.
    Derived, append (every chunk is executed whole, s = H): ask when d + 2 actions are left, so the next
    chunk lands with 2 to spare whatever its delay, and the queue holds the least old plan it can.
    An explicit buffer_time_s wins; in RTC mode a violation of d <= s <= H - d is named.
    """
    d, big_h = max(int(delay_steps), 0), max(int(chunk_size), 1)
    if buffer_time_s is None:
        if not rtc_enabled:
            b = min(d + 2, big_h)
            return ExecutionPlan(d, big_h, float(b), big_h, "", (b + 1e-6) * dt)
        if 2 * d <= big_h:
            s = min(max(big_h // 2, d), big_h - d)
            return ExecutionPlan(d, big_h, float(big_h - s), s, "", (big_h - s + 1e-6) * dt)
        return ExecutionPlan(
            d, big_h, float(big_h - d), d, _violation(d, d, big_h, "derived", dt), (big_h - d + 1e-6) * dt
        )
    buffer_steps = buffer_time_s / dt
    if not rtc_enabled:
        return ExecutionPlan(d, big_h, buffer_steps, big_h, "", buffer_time_s)
    s = max(int(round(big_h - buffer_steps)), 0)
    ok = d <= s <= big_h - d
    why = "" if ok else _violation(d, s, big_h, f"buffer_time_s={buffer_time_s:g}", dt)
    return ExecutionPlan(d, big_h, buffer_steps, s, why, buffer_time_s)


def _violation(d: int, s: int, big_h: int, source: str, dt: float) -> str:
    if 2 * d > big_h:
        fix = f"no s fits: the delay is over half the chunk; lower the delay or serve a chunk of >= {2 * d} rows"
    else:
        fix = (
            f"set buffer_time_s between {d * dt:.3g} and {(big_h - d) * dt:.3g} s ({d} to {big_h - d} steps), "
            f"or leave it unset (null) to derive it from the delay"
        )
    return f"RTC needs d <= s <= H - d; {source} gives d={d}, s={s}, H={big_h} ({d} <= {s} <= {big_h - d} fails): {fix}"


def delay_steps(latency_s: float, dt: float) -> int:
    """A latency in control steps, rounded up (what a request ships as inference_delay_steps)."""
    return int(math.ceil(latency_s / dt - 1e-9))


def is_due(qsize: int, dt: float, buffer_s: float) -> bool:
    """A request is due when the queue, less the action of the tick now running, is at or under the buffer."""
    return (qsize - 1) * dt <= buffer_s + 1e-9
