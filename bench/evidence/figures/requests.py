"""Figures of the requests an engine sent: how many, their errors, goodput and superseded count, the series
of their timings, and the same series less the bench host's measured share (`without_bench`)."""

from __future__ import annotations

import numpy as np

from bench.evidence.figures.scope import OK_OUTCOMES, SCALARS, SERIES, RunData, _ratio, _Scope, scalar
from bench.scenario.assertions import Figures


def _ok_requests(s: _Scope) -> np.ndarray:
    outcome = s.col(s.requests, "outcome", object)
    return np.isin(outcome, list(OK_OUTCOMES))


scalar("requests")(lambda s: len(s.col(s.requests, "t")))
# not errors: a request the server superseded with a newer one, or one an episode reset stopped waiting for
NOT_ERRORS = ["superseded", "abandoned"]
scalar("request_errors")(
    lambda s: int(np.count_nonzero(~_ok_requests(s) & ~np.isin(s.col(s.requests, "outcome", object), NOT_ERRORS)))
)
scalar("request_error_ratio")(lambda s: _ratio(SCALARS["request_errors"](s), SCALARS["requests"](s)))


def _goodput(s: _Scope, rtt: np.ndarray | None = None) -> tuple[int, int]:
    """(requests answered within their robot's deadline, requests answered); `rtt`: the round trips to judge
    (without_bench's, less the bench's share), else the recorded ones."""
    ok = _ok_requests(s)
    rtt = s.col(s.requests, "rtt_ms").astype(float) if rtt is None else rtt
    robots = s.col(s.requests, "robot", np.int32)
    deadline_by_robot = dict(zip(s.data.robots.get("robot", []), s.data.robots.get("deadline_s", [])))
    deadline_ms = np.array([deadline_by_robot.get(int(r), np.inf) for r in robots], float) * 1e3
    answered = ok & np.isfinite(rtt)
    return int(np.count_nonzero(answered & (rtt <= deadline_ms))), int(np.count_nonzero(answered))


scalar("goodput_requests")(lambda s: _goodput(s)[0])
scalar("goodput_ratio")(lambda s: _ratio(*_goodput(s)))


# The figure keeps its scenario-facing name `superseded` (assertions and sweeps say it); the count it sums is the
# wire's `superseded_seqs`, which the edge counter and the requests column carry under that same name.
@scalar("superseded")
def _superseded(s: _Scope) -> int:
    sup = s.col(s.requests, "superseded_seqs", np.int32)
    outcome = s.col(s.requests, "outcome", object)
    return int(np.count_nonzero(outcome == "superseded")) + int(np.nansum(np.clip(sup, 0, None)))


def _req_col(name: str):
    def fn(s: _Scope) -> np.ndarray:
        v = s.col(s.requests, name).astype(float)
        ok = _ok_requests(s)
        v = v[ok] if v.size == ok.size else v
        return v[np.isfinite(v)]

    return fn


for _name in (
    "rtt_ms",
    "inference_ms",
    "queue_wait_ms",
    "network_ms",
    "server_overhead_ms",
    "uplink_ms",
    "downlink_ms",
    "uplink_to_router_ms",
    "uplink_from_router_ms",
    "downlink_to_router_ms",
    "downlink_from_router_ms",
    "encode_ms",
    "send_lag_ms",
    "merge_lag_ms",
):
    SERIES[_name] = _req_col(_name)
SERIES["delay_steps"] = lambda s: s.col(s.requests, "delay_steps").astype(float)

SERIES["execution_steps"] = lambda s: s.col(s.requests, "execution_steps").astype(float)


# what the bench host added to a request's figure, per request (bench.evidence.replay, and the four hops split at
# the router: bench.evidence.fidelity.hop_excess, robot_hop_excess; NaN: not measured, taken as none): a series
# minus these is what it would read on hosts of its own
_HOPS = ("uplink_to_router_ms", "uplink_from_router_ms", "downlink_to_router_ms", "downlink_from_router_ms")
_UP, _DOWN = tuple(h[:-3] + "_bench_ms" for h in _HOPS[:2]), tuple(h[:-3] + "_bench_ms" for h in _HOPS[2:])
BENCH_PARTS = {
    "queue_wait_ms": ("queue_wait_bench_ms",),
    "inference_ms": ("inference_bench_ms",),
    **{hop: (hop[:-3] + "_bench_ms",) for hop in _HOPS},
    "uplink_ms": _UP,
    "downlink_ms": _DOWN,
    "network_ms": _UP + _DOWN,
    "rtt_ms": ("queue_wait_bench_ms", "inference_bench_ms") + _UP + _DOWN,
    "encode_ms": ("encode_bench_ms",),
}


def _less_bench(s: _Scope, name: str, network_ms: float) -> np.ndarray:
    """Every request's `name` less its measured bench parts (one value a request, unfiltered)."""
    v = s.col(s.requests, name).astype(float)
    for part in BENCH_PARTS[name]:
        b = s.col(s.requests, part).astype(float)
        if b.size == v.size:
            v = v - np.nan_to_num(b, nan=0.0)
    if name in ("rtt_ms", "network_ms"):
        v = v - network_ms
    return v


def _without_bench(name: str, network_ms: float):
    def fn(s: _Scope) -> np.ndarray:
        v = _less_bench(s, name, network_ms)
        ok = _ok_requests(s)
        v = v[ok] if v.size == ok.size else v
        return v[np.isfinite(v)]

    return fn


def without_bench(data: RunData, top: Figures, network_ms: float = 0.0) -> Figures:
    """`top` (compute's) with the series of BENCH_PARTS less the bench's measured share per request, the round
    trip also less `network_ms` (the proxies' error, p50 up + down), and the goodput judged on those round
    trips: what an assertion would read had every process had a host of its own, as far as the bench measures
    its share. Every other figure is `top`'s."""

    def corrected(f: Figures, scope: _Scope) -> Figures:
        out = Figures(scalars=dict(f.scalars), series=dict(f.series), states=f.states)
        for name in BENCH_PARTS:
            out.series[name] = _without_bench(name, network_ms)(scope)
        good, answered = _goodput(scope, _less_bench(scope, "rtt_ms", network_ms))
        out.scalars["goodput_requests"], out.scalars["goodput_ratio"] = good, _ratio(good, answered)
        return out

    groups = data.robots.get("group", np.empty(0, object))
    robot_ids = data.robots.get("robot", np.empty(0, np.int32))
    out = corrected(top, _Scope(data, None))
    out.groups = {g: corrected(f, _Scope(data, robot_ids[groups == g])) for g, f in top.groups.items()}
    return out
