"""The latency budget: each stage of a request's round trip as measured, what of it the bench added, and
the design's reference beside it (summary.json's `latency_budget`)."""

from __future__ import annotations

# Design section 11 (Pi0-class reference), shown beside the measured budget.
BUDGET_REFERENCE = {
    "client encode": ("2-9 ms", "2-9 ms"),
    "network (up + down + server overhead)": ("~4 ms", "~81 ms"),
    "uplink (tx + 1/2 RTT)": ("~2 ms", "~54 ms"),
    "uplink: robot -> router": ("most of the uplink", "most of the uplink"),
    "uplink: router -> server": ("< 1 ms (one LAN hop)", "< 1 ms (one LAN hop)"),
    "downlink (+ 1/2 RTT)": ("~2 ms", "~27 ms"),
    "downlink: server -> router": ("< 1 ms (one LAN hop)", "< 1 ms (one LAN hop)"),
    "downlink: router -> robot": ("most of the downlink", "most of the downlink"),
    "server queue wait": ("0 - 1x inference", "0 - 1x inference"),
    "inference": ("15-150 ms", "15-150 ms"),
    "server overhead (batching, reply send)": ("~0", "~0"),  # the design has no row: part of network_ms
    "total (rtt)": ("~110-175 ms", "~190-250 ms"),
    # outside the round trip, on the robot: its own computer runs one engine (the design has no row for them)
    "robot: observation -> send (outside the rtt)": ("~0", "~0"),
    "robot: arrival -> merge (outside the rtt)": ("~0", "~0"),
}
BUDGET_SERIES = [
    ("client encode", "encode_ms"),
    ("network (up + down + server overhead)", "network_ms"),
    ("uplink (tx + 1/2 RTT)", "uplink_ms"),
    ("uplink: robot -> router", "uplink_to_router_ms"),
    ("uplink: router -> server", "uplink_from_router_ms"),
    ("downlink (+ 1/2 RTT)", "downlink_ms"),
    ("downlink: server -> router", "downlink_to_router_ms"),
    ("downlink: router -> robot", "downlink_from_router_ms"),
    ("server queue wait", "queue_wait_ms"),
    ("inference", "inference_ms"),
    ("server overhead (batching, reply send)", "server_overhead_ms"),
    ("total (rtt)", "rtt_ms"),
    ("robot: observation -> send (outside the rtt)", "send_lag_ms"),
    ("robot: arrival -> merge (outside the rtt)", "merge_lag_ms"),
]


def latency_budget(figures: dict, fidelity: dict | None = None) -> list[dict]:
    """The budget's rows, each with what of it the bench added where that is measured (`bench_p50_ms`,
    `bench_p99_ms`: bench.evidence.fidelity.bench_share; None where it cannot be split)."""
    share = dict((fidelity or {}).get("bench_share") or {})
    up, down = share.get("uplink_ms") or {}, share.get("downlink_ms") or {}
    if (up or down) and "network_ms" not in share:
        # network = up + down: the parts' p50s and p99s added (the p99s' sum bounds the p99 from above)
        share["network_ms"] = {
            q: (None if up.get(q) is None and down.get(q) is None else (up.get(q) or 0.0) + (down.get(q) or 0.0))
            for q in ("p50", "p99")
        }
    rows = []
    for stage, key in BUDGET_SERIES:
        s = figures.get(key) or {}
        ref = BUDGET_REFERENCE[stage]
        bench = share.get(key) or {}  # send_lag_ms, merge_lag_ms: the shard's whole (bench_share says why)
        rows.append(
            {
                "stage": stage,
                "figure": key,
                "p50_ms": s.get("p50"),
                "p95_ms": s.get("p95"),
                "p99_ms": s.get("p99"),
                "count": s.get("count", 0),
                "bench_p50_ms": bench.get("p50"),
                "bench_p99_ms": bench.get("p99"),
                "design_lan": ref[0],
                "design_wan": ref[1],
            }
        )
    return rows
