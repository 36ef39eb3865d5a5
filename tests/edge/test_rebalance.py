"""Rebalancing (edge.remote.rebalance): which robots of an over-full replica move, where, and when; then engines
against two replicas over a real router: a replica that joins late gets its share at episode boundaries, the
fleet stops moving once balanced, and with `rebalance: false` nobody moves."""

from __future__ import annotations

import random
import time
from collections import Counter
from types import SimpleNamespace

import numpy as np

from edge.remote.rebalance import MAX_MOVE_FRACTION, Rebalancer, plan_move
from tests.edge.conftest import S
from tests.edge.responder import HASH_A, HASH_B, Responder
from tests.edge.test_remote import engine


def st(rid, active, max_sessions=100, ready=True, draining=False, checkpoint_hash=HASH_A):
    return SimpleNamespace(
        replica_id=rid,
        active_sessions=active,
        max_sessions=max_sessions,
        ready=ready,
        draining=draining,
        checkpoint_hash=checkpoint_hash,
    )


def draws(statuses, own, n=4000, threshold=0.05, seed=1):
    rng = random.Random(seed)
    moves = [plan_move(statuses, own, HASH_A, threshold, rng) for _ in range(n)]
    return [m for m in moves if m is not None and m.target]


def test_robots_of_a_full_replica_move_in_expectation_just_its_excess():
    # r1 returned empty beside two full replicas: a third of each full one should leave, all to r1
    found = [st("r0", 150, 150), st("r1", 0, 150), st("r2", 150, 150)]
    moves = draws(found, "r0")
    assert {m.target for m in moves} == {"r1"}
    assert abs(len(moves) / 4000 - 1 / 3) < 0.03  # excess 50 of 150 sessions
    assert moves[0].fair_share == 300 / 450 and moves[0].own_load == 1.0


def test_a_replica_within_its_share_or_under_the_threshold_keeps_its_robots():
    assert draws([st("r0", 50), st("r1", 50)], "r0") == []
    assert draws([st("r0", 52), st("r1", 48)], "r0") == []  # 2 over the share of 100: under 5 %
    assert draws([st("r0", 40), st("r1", 60)], "r0") == []  # under its share: it receives, it does not send
    assert len(draws([st("r0", 60), st("r1", 40)], "r0")) > 0
    rng = random.Random(3)
    stays = [plan_move([st("r0", 60), st("r1", 40)], "r0", HASH_A, 0.05, rng) for _ in range(200)]
    assert all(m is not None for m in stays) and any(not m.target for m in stays)  # over its share: a "stay"


def test_targets_are_drawn_by_deficit_and_the_fraction_is_capped():
    found = [st("r0", 100), st("r1", 0), st("r2", 20)]  # share 40: deficits 40 and 20
    moves = draws(found, "r0")
    assert abs(len(moves) / 4000 - MAX_MOVE_FRACTION) < 0.03  # excess 60 of 100, capped at half
    targets = Counter(m.target for m in moves)
    assert abs(targets["r1"] / len(moves) - 2 / 3) < 0.05


def test_no_move_to_another_checkpoint_a_draining_or_unready_replica_or_without_its_own_status():
    for other in (
        st("r1", 0, checkpoint_hash=HASH_B),
        st("r1", 0, draining=True),
        st("r1", 0, ready=False),
    ):
        assert draws([st("r0", 100), other], "r0", n=200) == []
    assert draws([st("r1", 0), st("r2", 0)], "r0", n=200) == []  # own replica not among the answers
    assert draws([st("r0", 0), st("r1", 0)], "r0", n=200) == []  # nothing to move


def test_checks_come_with_the_period_a_token_brings_them_forward_and_the_dwell_bounds_them():
    cfg = SimpleNamespace(rebalance=True, rebalance_check_s=30.0, rebalance_min_dwell_s=20.0)
    r = Rebalancer(cfg, random.Random(0))
    r.opened(100.0)
    assert not r.due(110.0)  # inside the dwell and the period
    r.token()
    assert not r.due(112.0)  # brought forward, but the session has not dwelt 20 s
    assert r.due(120.5)  # dwelt: the token's check is due
    r.checked(120.5, unready=True)
    assert not r.due(121.0) and r.due(123.6)  # an unready replica: a recheck 1-3 s later
    r.checked(124.0, over_share=True)
    assert not r.due(126.9) and r.due(129.1)  # drew "stay" on an over-full replica: again 3-5 s later
    r.checked(130.0)
    assert not r.due(130.0 + 22.0) and r.due(130.0 + 38.0)  # then the jittered period (22.5-37.5 s)
    assert not Rebalancer(SimpleNamespace(rebalance=False, rebalance_check_s=1.0, rebalance_min_dwell_s=0.0)).due(1e9)


def test_a_check_that_reads_no_peer_soon_after_a_token_looks_again_soon():
    """A replica that just started answers its first Status late on a loaded host: the check after its token
    reads only its own replica, and waiting out the whole period would leave the newcomer idle for it."""
    cfg = SimpleNamespace(rebalance=True, rebalance_check_s=30.0, rebalance_min_dwell_s=0.0)
    r = Rebalancer(cfg, random.Random(1))
    r.opened(100.0)
    r.token()
    assert not r.due(102.0)  # the token seen: its check comes 0.5-2 s later
    assert r.due(104.1)
    r.checked(104.1, lone=True)  # the token's check: no peer answered
    assert not r.due(105.0) and r.due(107.2)  # an unready-like recheck 1-3 s later
    r.checked(107.2, lone=True)
    assert r.due(110.3)  # still within RECENT_TOKEN_S of the token: soon again
    r.checked(120.0, lone=True)  # past it (15 s after the token): a lone replica (no peer at all) waits the period
    assert not r.due(120.0 + 22.0) and r.due(120.0 + 38.0)
    r2 = Rebalancer(cfg, random.Random(1))
    r2.opened(100.0)
    assert r2.due(200.0)
    r2.checked(200.0, lone=True)  # no token ever appeared: the period
    assert not r2.due(200.0 + 22.0)


def _fleet(router, n, **kw):
    cfg = {"rebalance_check_s": 0.4, "rebalance_min_dwell_s": 0.5, "max_action_age_s": 2.0, **kw}
    engines = [engine(router, **cfg) for _ in range(n)]
    for e in engines:
        e.start()
    return engines


def _drive(engines, seconds, until=None, episode_ticks=12):
    """Every engine's control loop at 30 Hz in one thread, each resetting its episode every `episode_ticks`
    ticks (staggered); stops early when `until()` holds."""
    t0, k = time.monotonic(), 0
    while time.monotonic() - t0 < seconds:
        for i, e in enumerate(engines):
            e.notify_observation({"state": np.full(S, 0.01 * k, np.float32)})
            e.get_action()
            if (k + 3 * i) % episode_ticks == 0 and k:
                e.reset()
        if until is not None and k % 10 == 0 and until():
            return True
        k += 1
        time.sleep(max(0.0, t0 + k / 30.0 - time.monotonic()))
    return until() if until is not None else False


def _placement(engines):
    return Counter(e.stats["replica_id"] for e in engines)


def test_a_replica_that_joins_late_receives_its_share_and_the_fleet_then_stays(router):
    r0 = Responder(router, replica_id="r0", state_dim=S, max_sessions=4).start()
    r1 = Responder(router, replica_id="r1", state_dim=S, max_sessions=4)
    engines = _fleet(router, 4)
    try:
        assert _drive(
            engines, 10.0, until=lambda: _placement(engines)["r0"] == 4 and min(e.stats["chunks"] for e in engines) > 0
        )
        r1.start()  # its liveliness token brings every engine's check forward
        settled = {"since": time.monotonic(), "moves": -1}

        def balanced_for_2_s() -> bool:  # two robots on r0 may draw "move" at once: the next check undoes it
            moves_now = sum(e.stats["moves"] for e in engines)
            if _placement(engines) != Counter({"r0": 2, "r1": 2}) or moves_now != settled["moves"]:
                settled.update(since=time.monotonic(), moves=moves_now)
            return time.monotonic() - settled["since"] >= 2.0

        assert _drive(engines, 30.0, until=balanced_for_2_s), f"not balanced: {_placement(engines)}"
        moves = sum(e.stats["moves"] for e in engines)
        _drive(engines, 3.0)  # balanced: the checks go on, nobody moves
        assert _placement(engines) == Counter({"r0": 2, "r1": 2})
        assert sum(e.stats["moves"] for e in engines) == moves <= 8
        assert sum(e.stats["rebalance_checks"] for e in engines) > moves
        assert not any(e.failed for e in engines) and all(e.stats["reconnects"] == 0 for e in engines)
        chunks = [e.stats["chunks"] for e in engines]
        _drive(engines, 1.5)
        assert all(e.stats["chunks"] > c for e, c in zip(engines, chunks)), "every robot streams after the moves"
    finally:
        for e in engines:
            e.stop()
        r0.close()
        r1.close()


def test_with_rebalance_off_nobody_moves(router):
    r0 = Responder(router, replica_id="r0", state_dim=S, max_sessions=4).start()
    r1 = Responder(router, replica_id="r1", state_dim=S, max_sessions=4)
    engines = _fleet(router, 3, rebalance=False)
    try:
        assert _drive(engines, 10.0, until=lambda: _placement(engines)["r0"] == 3)
        r1.start()
        _drive(engines, 3.0)
        assert _placement(engines) == Counter({"r0": 3})
        assert sum(e.stats["moves"] + e.stats["rebalance_checks"] for e in engines) == 0
    finally:
        for e in engines:
            e.stop()
        r0.close()
        r1.close()
