"""The edge log a robot writes is what `bench incident` reads."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from bench.evidence import incident
from edge.edge_log import EdgeLogWriter


@dataclass
class _Cfg:
    fps: float = 30.0
    buffer_time_s: float = 0.5
    degraded_after_s: float = 0.5
    connect_endpoints: tuple = ("tcp/127.0.0.1:7447",)


class _Engine:
    """Produces what RemoteEngine's drain_records/drain_transitions produce."""

    def __init__(self):
        self.cfg = _Cfg()
        self.records = deque(
            [
                {
                    "t": 10.0,
                    "seq": 1,
                    "rtt_ms": 12.0,
                    "queue_wait_ms": 0.2,
                    "inference_ms": 5.0,
                    "network_ms": 6.8,
                    "encode_ms": 0.3,
                    "delay_steps": 1,
                    "superseded_seqs": 0,
                    "outcome": "ok",
                },
                {
                    "t": 12.5,
                    "seq": 2,
                    "rtt_ms": float("nan"),
                    "queue_wait_ms": float("nan"),
                    "inference_ms": float("nan"),
                    "network_ms": float("nan"),
                    "encode_ms": 0.3,
                    "delay_steps": 1,
                    "superseded_seqs": 0,
                    "outcome": "timeout",
                },
            ]
        )
        self.transitions = deque(
            [(9.0, "connecting", "streaming", "session"), (12.0, "streaming", "stalled", "queue empty")]
        )

    def drain_records(self):
        out, self.records = list(self.records), deque()
        return out

    def drain_transitions(self):
        out, self.transitions = list(self.transitions), deque()
        return out


def test_the_edge_log_round_trips_into_bench_incident(tmp_path):
    path = tmp_path / "robot7.jsonl"
    w = EdgeLogWriter(_Engine(), path, robot={"robot_type": "reacher", "policy": "reacher"}, period_s=0.05).start()
    w.stop()
    log = incident.read_edge_log(path)
    assert log.robot["robot_type"] == "reacher" and log.robot["engine"]["buffer_time_s"] == 0.5
    assert "connect_endpoints" not in log.robot["engine"]
    assert [r["outcome"] for r in log.requests] == ["ok", "timeout"]
    assert log.requests[1]["rtt_ms"] is None  # strict JSON: no NaN
    assert [tr["to"] for tr in log.transitions] == ["STREAMING", "STALLED"]
    assert incident.stretches(log.window(8.0, 14.0), 6.0) == [(4.0, 6.0, ["STALLED"])]
