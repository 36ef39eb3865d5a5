"""The report of a run whose children ran on other clocks and hosts: summary.json's `clock`, the note when the
uplink/downlink split was dropped, and each remote node's CPU under the CPU split."""

from __future__ import annotations

import json

from bench.evidence import report
from bench.scenario.assertions import AssertionResult


def test_the_report_says_when_the_split_was_dropped_and_where_remote_cpu_ran(tmp_path):
    clock = {
        "children": {
            "shard:0": {"offset_ms": 5000.0, "uncertainty_ms": 3.0, "rtt_ms": 6.0, "exchanges": 16, "same_clock": False}
        },
        "hop_split": {
            "valid": False,
            "requests_dropped": 12,
            "max_clock_error_of_hop": 0.25,
            "dropped_pairs": [{"shard": 0, "replica": "r0", "requests": 12, "clock_error_ms": 3.0, "hop_ms_p50": 1.1}],
            "note": "12 answered requests have no uplink_ms/downlink_ms: shard 0 -> r0: clocks unsure "
            "by 3.00 ms, over 25% of the 1.10 ms one-way hop",
        },
        "router_split": {
            "valid": False,
            "requests_dropped": 7,
            "clock_error_ms": 0.3,
            "dropped_pairs": [],
            "note": "7 answered requests have no hops split at the router: shard 1 -> r0: the "
            "nodes' wall clocks unsure by 4.00 ms, over 25% of the 9.00 ms one-way hop",
        },
    }
    cpu = {
        "host_percent": 20.0,
        "split": {"shard:0": 50.0, "runner": 1.0},
        "cores": 2,
        "samples": 5,
        "node_of": {"shard:0": "node 5d2dca76ab12 (nodeB, 10.0.0.2)"},
        "nodes": {
            "node 5d2dca76ab12 (nodeB, 10.0.0.2)": {
                "host_percent": 61.5,
                "cores": 16,
                "samples": 5,
                "processes": ["shard:0"],
            }
        },
    }
    o = report.RunOutcome(
        "t",
        "",
        tmp_path,
        "pass",
        "now",
        1.0,
        1.0,
        1,
        [AssertionResult("ticks > 1", True, 5)],
        meta={"clock": clock, "cpu": cpu, "cores": 2},
    )
    report.write_all(o)
    assert json.loads((tmp_path / "summary.json").read_text())["clock"] == clock
    page = (tmp_path / "report.html").read_text()
    assert "uplink / downlink split: 12 answered requests have no uplink_ms/downlink_ms" in page
    assert "split at the router: 7 answered requests have no hops split at the router: shard 1 -&gt; r0" in page
    assert "node 5d2dca76ab12 (nodeB, 10.0.0.2): host 61.5 % of its 16 cores; runs shard:0" in page
