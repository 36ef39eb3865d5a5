"""Rebalancing: when a robot's engine moves its session to a less loaded replica of the same checkpoint.

A fleet's sessions stay where they were placed: after a replica restarts (or one is added), the robots that
failed over sit on the others until they fail again, and the returned replica idles while its peers run
full. So at an episode boundary (a reset: no chunk in flight that could still be merged, no RTC prefix to
carry) the worker may check the replicas' loads (one discovery query) and move its session:

    check due (every rebalance_check_s, jittered; a replica token appearing brings it forward) and the
    session older than rebalance_min_dwell_s
    ─► Status of every ready, not draining replica serving the session's checkpoint (hash and revision)
    ─► fair share T = sum(active) / sum(max); this replica's excess E = active - T * max
    ─► E / max > rebalance_threshold: move with probability min(E / active, MAX_MOVE_FRACTION),
       to a replica under its share, drawn with weight = its deficit (T * max - active); a robot that
       drew "stay" looks again 3-5 s later, while its replica is still over its share

Every robot of an over-full replica draws on its own: in expectation just its excess leaves (no stampede
from one replica to the next), the draws spread over the episodes' boundaries, and robots that check later
read the loads the earlier movers left. The dwell bounds the moves per robot: at most one per
rebalance_min_dwell_s (a flapping replica cannot make the fleet oscillate faster than that).

Invariants: a move never changes the checkpoint (the reopen asks for the first session's hash, as a
reconnect does); it happens only at a boundary the worker owns; a check that cannot read the loads
changes nothing.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

MAX_MOVE_FRACTION = 0.5  # at most half of a replica's robots draw "move" in one round of checks
TOKEN_CHECK_S = (0.5, 2.0)  # a replica token appeared: check within this window (spread over the fleet)
UNREADY_RECHECK_S = (1.0, 3.0)  # a replica was there but not ready yet: look again this much later
# still over its share after drawing "stay": look again this much later, past a server's default 2 s grace
# (session.gc_grace_s) in which a moved session still counts on the replica it left
OVER_SHARE_RECHECK_S = (3.0, 5.0)
# a replica token appeared this recently, but the check read no peer (its Status answer came late: a replica
# just started answers its first queries slowly on a loaded host): look again as for an unready one
RECENT_TOKEN_S = 15.0


@dataclass(frozen=True)
class Move:
    """One check's finding on an over-full replica: move to `target` (its replica id), or stay this time
    (`target` ""; the replica is still over its share, so the engine looks again soon)."""

    target: str
    own_load: float
    fair_share: float
    probability: float


def plan_move(statuses, own_id: str, checkpoint_hash: str, threshold: float, rng: random.Random) -> Move | None:
    """What one robot on replica `own_id` draws from the replicas' Status: None when its replica holds no more
    than its share (or nothing can be judged), else a Move (to a target, or "" to stay this time). Only ready,
    not draining replicas whose checkpoint_hash is `checkpoint_hash` count; `own_id` must be among them."""
    peers = [
        s
        for s in statuses
        if s.ready and not s.draining and s.checkpoint_hash == checkpoint_hash and int(s.max_sessions) > 0
    ]
    own = next((s for s in peers if s.replica_id == own_id), None)
    if own is None or len(peers) < 2 or own.active_sessions <= 0:
        return None
    share = sum(int(s.active_sessions) for s in peers) / sum(int(s.max_sessions) for s in peers)
    excess = own.active_sessions - share * own.max_sessions
    if excess / own.max_sessions <= threshold:
        return None
    deficits = {s.replica_id: share * s.max_sessions - s.active_sessions for s in peers if s.replica_id != own_id}
    deficits = {r: d for r, d in deficits.items() if d >= 1.0}
    if not deficits:
        return None
    p = min(excess / own.active_sessions, MAX_MOVE_FRACTION)
    load = own.active_sessions / own.max_sessions
    if rng.random() >= p:
        return Move("", load, share, p)
    ids = sorted(deficits)
    return Move(rng.choices(ids, weights=[deficits[r] for r in ids])[0], load, share, p)


class Rebalancer:
    """When the worker's next check is due (monotonic seconds), from the engine's config: rebalance,
    rebalance_check_s, rebalance_min_dwell_s. The worker calls `token()` from the replica watch,
    `opened(now)` on every session it opens, and `checked(now, unready)` after each check."""

    def __init__(self, cfg, rng: random.Random | None = None):
        self.cfg = cfg
        self.rng = rng or random.Random()
        self.opened_at = 0.0
        self.next_check = 0.0  # set by the first `opened`
        self._token = False  # deposit only (Zenoh's thread): a replica token appeared
        self.token_at = -math.inf  # when a check first saw that deposit (monotonic s)

    def token(self) -> None:
        self._token = True

    def opened(self, now: float) -> None:
        self.opened_at = now
        self.next_check = now + self._period()

    def due(self, now: float) -> bool:
        """A check is due at this boundary: enabled, the session has dwelt long enough, and the period is up or
        a replica token appeared (its check spread over TOKEN_CHECK_S)."""
        if not self.cfg.rebalance:
            return False
        if self._token:
            self._token = False
            self.token_at = now
            self.next_check = min(self.next_check, now + self.rng.uniform(*TOKEN_CHECK_S))
        return now >= self.next_check and now - self.opened_at >= self.cfg.rebalance_min_dwell_s

    def checked(self, now: float, unready: bool = False, over_share: bool = False, lone: bool = False) -> None:
        """After a check: look again soon while a replica was not ready yet, or the check read no peer (`lone`:
        its query failed or only this replica answered) though a replica token appeared within RECENT_TOKEN_S,
        or this one is still over its share (a robot that drew "stay"); else after the period."""
        if unready or (lone and now - self.token_at <= RECENT_TOKEN_S):
            self.next_check = now + self.rng.uniform(*UNREADY_RECHECK_S)
        elif over_share:
            self.next_check = now + self.rng.uniform(*OVER_SHARE_RECHECK_S)
        else:
            self.next_check = now + self._period()

    def _period(self) -> float:
        return self.cfg.rebalance_check_s * self.rng.uniform(0.75, 1.25)
