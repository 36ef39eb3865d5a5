"""Micro-benchmark of the mailbox hot paths per strategy: deposit cost (the Zenoh callback) and take cost.

    python -m benchmarks.scheduling --sessions 200 --deposits 50000 --max-batch 4

One row per strategy: deposit and take in microseconds per call, and the spread of dispatches per
session (max - min) under overload, where every session always has a request pending.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

from benchmarks.common import Result
from server.mailbox import Mailbox
from server.scheduling import Request, scheduler_names


def measure(strategy: str, sessions: int, deposits: int, max_batch: int) -> dict[str, float]:
    clock = [0.0]
    box = Mailbox(
        strategy,
        max_queue_size=sessions,
        request_ttl_ms=None,
        clock=lambda: clock[0],
        scheduler_options={"batch_window_ms": 1.0} if strategy == "batch_optimized" else None,
    )
    reqs = [
        Request(
            f"s{i % sessions}",
            f"c{i % sessions}",
            "m",
            seq_id=i,
            arrived=i * 1e-5,
            urgency=(i % 7) / 6,
            priority=i % 3,
            steps_remaining=i % 20,
            cadence_s=0.1,
            batch_key=i % 2,
        )
        for i in range(deposits)
    ]
    t0 = time.perf_counter()
    for r in reqs:
        box.deposit(r)
    deposit_us = (time.perf_counter() - t0) / deposits * 1e6

    served: Counter[str] = Counter()
    takes, t_take, seq = 0, 0.0, deposits
    clock[0] = 1.0
    for _ in range(sessions * 5):
        t0 = time.perf_counter()
        batch = box.take(max_batch, timeout_s=0)
        t_take += time.perf_counter() - t0
        takes += 1
        clock[0] += 0.002
        for r in batch.requests:  # overload: the served session asks again at once
            served[r.session_id] += 1
            seq += 1
            box.deposit(
                Request(
                    r.session_id,
                    r.client,
                    "m",
                    seq_id=seq,
                    arrived=clock[0],
                    priority=r.priority,
                    steps_remaining=r.steps_remaining,
                    cadence_s=0.1,
                    batch_key=r.batch_key,
                )
            )
    counts = [served.get(f"s{i}", 0) for i in range(sessions)]
    return {"deposit_us": deposit_us, "take_us": t_take / takes * 1e6, "spread": max(counts) - min(counts)}


def run(quick: bool) -> Result:
    """Every registered strategy at the documented size (quick: 50 sessions, 5,000 deposits)."""
    sessions, deposits = (50, 5_000) if quick else (200, 50_000)
    res = Result(details={"sessions": sessions, "deposits": deposits, "max_batch": 4, "strategies": {}})
    for name in scheduler_names():
        row = measure(name, sessions, deposits, 4)
        res.details["strategies"][name] = row
        res.add(f"{name} deposit", row["deposit_us"], "us")
        res.add(f"{name} take", row["take_us"], "us")
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--deposits", type=int, default=50_000)
    ap.add_argument("--max-batch", type=int, default=4)
    ap.add_argument("--strategy", action="append", help="repeatable; default: every registered strategy")
    a = ap.parse_args(argv)
    print(f"{'strategy':<16} {'deposit_us':>10} {'take_us':>9} {'spread':>7}")
    for name in a.strategy or scheduler_names():
        row = measure(name, a.sessions, a.deposits, a.max_batch)
        print(f"{name:<16} {row['deposit_us']:>10.2f} {row['take_us']:>9.2f} {row['spread']:>7}")


if __name__ == "__main__":
    main()
