"""The Zenoh router's memory under session churn: does a reconnect leak, or does it plateau?

    python -m benchmarks.router_memory [--cycles 100] [--sessions 13]

A real router process (wire.procs.start_router) and one long-lived subscriber session; then, per cycle,
`--sessions` client sessions connect, each declares what a robot declares (a liveliness token, an action
subscriber, an observation publisher), publishes 20 observations of 2 KiB, and closes. This is what a
partition of a site does to the router, without the wait. The router's resident set is read every 10
cycles. A leak grows by the same step every cycle; a plateau (the allocator's high-water mark) stops.
Writes reports/bench/router_memory.json: the samples, the growth over the first and the second half.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks.common import Result, cli, parse_with_out, run_main, write_report

REPORT = Path("reports/bench/router_memory.json")


def run(quick: bool) -> Result:
    res = run_main(main, ["--cycles", "4", "--sessions", "3"] if quick else [])
    rep = res.details
    res.add("router RSS at the end", rep["rss_mb"][-1]["rss_mb"], "MiB")
    res.add("router RSS growth, second half", rep["growth_second_half_mb"], "MiB")
    return res


def main(argv: list[str] | None = None) -> dict:
    import psutil

    from wire.procs import start_router
    from wire.transport import open_session

    parser = cli(__doc__)
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--sessions", type=int, default=13, help="client sessions per cycle (a site's robots)")
    args = parse_with_out(parser, argv, REPORT)
    if args.cycles < 2 or args.sessions < 1:
        parser.error("--cycles must be >= 2 and --sessions >= 1")

    log = Path(tempfile.mkdtemp(prefix="router-memory-")) / "router.log"
    child, endpoint = start_router(None, log)
    samples: list[tuple[int, float]] = []
    try:
        router = psutil.Process(child.pid)
        rss = lambda: round(router.memory_info().rss / 2**20, 2)  # noqa: E731
        watcher = open_session(connect=[endpoint])
        watcher.declare_subscriber("bench/**", lambda _sample: None)
        payload = b"x" * 2048
        samples.append((0, rss()))
        for cycle in range(1, args.cycles + 1):
            sessions = [open_session(connect=[endpoint]) for _ in range(args.sessions)]
            for i, s in enumerate(sessions):
                s.liveliness().declare_token(f"bench/live/{cycle}/{i}")
                s.declare_subscriber(f"bench/robot/{i}/action", lambda _sample: None)
                pub = s.declare_publisher(f"bench/robot/{i}/obs")
                for _ in range(20):
                    pub.put(payload)
            for s in sessions:
                s.close()
            if cycle % 10 == 0 or cycle == args.cycles:
                samples.append((cycle, rss()))
                print(f"cycle {cycle:4d}: router {samples[-1][1]:.1f} MB", flush=True)
        watcher.close()
    finally:
        child.stop()
    half = len(samples) // 2
    first, mid, last = samples[0][1], samples[half][1], samples[-1][1]
    report = {
        "cycles": args.cycles,
        "sessions_per_cycle": args.sessions,
        "sessions_total": args.cycles * args.sessions,
        "rss_mb": [{"cycle": c, "rss_mb": v} for c, v in samples],
        "growth_first_half_mb": round(mid - first, 2),
        "growth_second_half_mb": round(last - mid, 2),
        "growth_second_half_ratio": round((last - mid) / mid, 4) if mid else None,
    }
    print(
        f"router memory: {first:.1f} MB -> {mid:.1f} MB at cycle {samples[half][0]} -> {last:.1f} MB at cycle "
        f"{samples[-1][0]} ({args.cycles * args.sessions} sessions); second half grew "
        f"{report['growth_second_half_mb']:+.2f} MB ({100 * (report['growth_second_half_ratio'] or 0):+.1f} %)"
    )
    return write_report(args.out, report)


if __name__ == "__main__":
    main()
