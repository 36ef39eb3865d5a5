"""Figures of the faults a run met: attacks and their outcomes, server crashes, unplanned exits and the
server's security denials."""

from __future__ import annotations

from bench.evidence.figures.scope import UNPLANNED_EXIT, scalar


def _attack_count(*outcomes: str):
    return lambda s: float(sum(1 for a in s.data.attacks if a.get("outcome") in outcomes))


scalar("attacks")(lambda s: float(len(s.data.attacks)))
scalar("attack_attempts")(lambda s: float(sum(int(a.get("attempts", 0)) for a in s.data.attacks)))
scalar("attacks_denied")(_attack_count("denied"))
scalar("attacks_contained")(_attack_count("denied", "contained"))
scalar("attacks_breached")(_attack_count("breached"))
scalar("attack_errors")(_attack_count("error", "pending"))
scalar("server_crashes")(lambda s: float(s.data.server_crashes))
scalar("unplanned_exits")(lambda s: float(sum(1 for w in s.data.fault_windows if w.get("action") == UNPLANNED_EXIT)))
scalar("security_denials")(lambda s: float(sum(int(r.get("denied_count") or 1) for r in s.data.security_denials)))
