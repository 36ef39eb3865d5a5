"""summary.json's `state_changes`: a fleet's robot state changes grouped by from, to and the kind of reason."""

from __future__ import annotations

import numpy as np

from bench.evidence.figures import reason_class, state_changes


def test_ids_and_numbers_that_differ_robot_to_robot_are_taken_out_of_a_reason():
    a = reason_class("session 201330cf643361b2 on r1")
    assert a == reason_class("session 9c0b1d2e3f405162 on r1") == "session <id> on r1"
    assert reason_class(
        "offline for more than max_offline_s=60 s (client robot-9326addc5e9c: cannot reach a Zenoh "
        "router at tcp/127.0.0.1:51031)"
    ) == ("offline for more than max_offline_s=N s (client <id>: cannot reach a Zenoh router at tcp/N:N)")
    assert reason_class("drain") == "drain" and reason_class(None) == ""


def _transitions(rows):
    t, robot, a, b, why = zip(*rows)
    return {
        "t": np.array(t, float),
        "robot": np.array(robot),
        "from_state": np.array(a, object),
        "to_state": np.array(b, object),
        "reason": np.array(why, object),
    }


def test_a_fleet_collapse_reads_as_a_few_kinds_with_the_dead_first():
    rows = [(-30.0, r, "STOPPED", "CONNECTING", "start") for r in range(5)]
    rows += [(-17.0 + r, r, "CONNECTING", "STREAMING", f"session {r:016x} on r{r % 2}") for r in range(3)]
    rows += [(15.0 + r, r, "STREAMING", "RECONNECTING", "lost") for r in range(3)]
    rows += [
        (
            29.5 + r,
            r,
            "CONNECTING",
            "DEAD",
            f"offline for more than max_offline_s=60 s (no replica of reacher answered; {r} tries)",
        )
        for r in (3, 4)
    ]
    out = state_changes(_transitions(rows))
    assert out[0]["to"] == "DEAD" and out[0]["changes"] == 2 and out[0]["robots"] == 2
    assert (out[0]["t_first"], out[0]["t_last"]) == (32.5, 33.5) and "offline for more than" in out[0]["example"]
    kinds = {(c["from"], c["to"], c["reason"]): c for c in out}
    assert kinds[("STOPPED", "CONNECTING", "start")]["robots"] == 5
    # the session ids are one kind; the replica's name stays (where robots went is worth seeing)
    assert kinds[("CONNECTING", "STREAMING", "session <id> on r0")]["changes"] == 2
    assert kinds[("CONNECTING", "STREAMING", "session <id> on r1")]["robots"] == 1
    assert kinds[("STREAMING", "RECONNECTING", "lost")]["robots"] == 3
    assert len(state_changes(_transitions(rows), most=2)) == 2
    assert state_changes({}) == [] and state_changes({"t": np.array([])}) == []
