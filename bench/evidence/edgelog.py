"""The record of what one robot saw, as `bench incident` reads it from an edge log, a bench run or a LeRobotDataset.

EdgeLog holds the robot's facts, its requests and its transitions; `stretches` gives the spans it spent out of
STREAMING (its stutter). Shared by bench.evidence.incident (edge logs, run directories, the reconstruction) and
bench.evidence.incident_dataset (LeRobotDatasets), so neither imports the other at module level.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# HELD: a tick the robot held mid-episode, the stutter a LeRobotDataset shows (bench.evidence.incident_dataset)
STUTTER_STATES = ("STALLED", "DEGRADED", "RECONNECTING", "DEAD", "HELD")


class IncidentError(ValueError):
    """Logs or a window `bench incident` cannot replay; the message names the flag, file or line and what to do."""


@dataclass
class EdgeLog:
    robot: dict = field(default_factory=dict)  # robot_type, fps, policy, engine
    requests: list[dict] = field(default_factory=list)
    transitions: list[dict] = field(default_factory=list)
    span: tuple[float, float] | None = None  # a window's [t0, t1) on the original log's clock
    # how stutter is read: "states" (the engine's transitions) or "held" (held ticks, from a LeRobotDataset)
    stutter: str = "states"

    def window(self, t0: float, t1: float) -> EdgeLog:
        """Records in [t0, t1), re-timed to start at 0; the state at t0 is kept as a first transition."""
        before = [tr for tr in self.transitions if tr["t"] < t0]
        trans = [dict(tr, t=tr["t"] - t0) for tr in self.transitions if t0 <= tr["t"] < t1]
        if before:
            trans.insert(0, {"t": 0.0, "from": before[-1]["to"], "to": before[-1]["to"], "reason": "window start"})
        return EdgeLog(
            dict(self.robot),
            [dict(r, t=r["t"] - t0) for r in self.requests if t0 <= r["t"] < t1],
            trans,
            (t0, t1),
            self.stutter,
        )


def stretches(log: EdgeLog, end: float) -> list[tuple[float, float, list[str]]]:
    """(start, end, states) of every stretch the robot spent out of STREAMING."""
    out, start, states = [], None, []
    for tr in log.transitions:
        to = str(tr["to"]).upper()
        if to in STUTTER_STATES:
            if start is None:
                start, states = tr["t"], []
            states.append(to)
        elif start is not None and to in ("STREAMING", "STOPPED", "CONNECTING"):
            out.append((start, tr["t"], states))
            start = None
    if start is not None:
        out.append((start, end, states))
    return out
