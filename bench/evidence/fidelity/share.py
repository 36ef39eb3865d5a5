"""The bench's share of each request's figures: the router <-> replica hops beyond their floor, the
robot <-> router hops beyond what the proxies asked, the client's encode beyond its group's floor, and
`bench_share`, the round trip's share in the steady state and around each fault."""

from __future__ import annotations

import numpy as np

from bench.evidence.fidelity.legs import _percentile
from bench.evidence.fidelity.rounding import _r

SERVER_HOPS = ("uplink_from_router_ms", "downlink_to_router_ms")  # the router <-> replica hops: no toxic on them
HOP_FLOOR_QUANTILE = 10  # a hop's floor: this percentile of it over the run, per replica
HOP_FLOOR_MIN_REQUESTS = 20  # fewer answered requests through a replica: its floor is not read, its hops not split


def hop_excess(hop: np.ndarray, replica: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
    """Per request, a router <-> replica hop (SERVER_HOPS) beyond that replica's floor for it (the run's
    HOP_FLOOR_QUANTILE-th percentile), never below zero; NaN where the hop or its replica is unknown or the replica
    answered too few requests to read a floor. And the floors, ms, by replica.

    Neither hop crosses a proxy: in the twin both are loopback between two processes that share the host with the
    fleet, and a hop beyond its quiet floor waited for a core (the router's, the replica's receive or send). On a
    host of its own the replica's other threads (its dispatch loop, other requests' callbacks, under one GIL)
    would still delay some, so the excess is an upper bound of the bench's share."""
    return beyond_floor(hop, replica)


def encode_excess(encode_ms: np.ndarray, group: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
    """Per request, the client's encode (`encode_ms`: the engine's JPEG encode of its cameras, the msgpack body
    and the put) beyond its group's floor for it (every robot of a group sends the same cameras and state), and
    the floors by group. On a bench shard a hundred engines and the control loop share one process and its GIL,
    so an encode beyond its quiet floor mostly waited for them. An upper bound of the bench's share: a robot's
    own computer varies too (image content, its own threads); and the floor is this host's CPU, not the robot's,
    so a slower edge computer's encode is not what this measures."""
    return beyond_floor(encode_ms, group)


def beyond_floor(values: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
    """Per row, `values` beyond its key's floor (the HOP_FLOOR_QUANTILE-th percentile of that key's finite
    values), never below zero; NaN where the value or key is unknown or the key has under
    HOP_FLOOR_MIN_REQUESTS values. And the floors by key."""
    values = np.asarray(values, dtype=float)
    keys = np.asarray(keys, dtype=str)
    out = np.full(values.shape, np.nan)
    floors = {}
    for key in sorted(set(keys.tolist()) - {""}):
        rows = (keys == key) & np.isfinite(values)
        if np.count_nonzero(rows) < HOP_FLOOR_MIN_REQUESTS:
            continue
        floor = float(np.percentile(values[rows], HOP_FLOOR_QUANTILE))
        floors[key] = round(floor, 3)
        out[rows] = np.maximum(values[rows] - floor, 0.0)
    return out.astype(np.float32), floors


ROBOT_HOPS = (("uplink_to_router_ms", "upstream"), ("downlink_from_router_ms", "downstream"))  # through the proxy


def asked_around(by_s: dict | None, start_ms: np.ndarray, end_ms: np.ndarray) -> np.ndarray | None:
    """Per request, the most a leg's toxics asked of any chunk written in the buckets from `start_ms` to `end_ms`
    (the proxy's monotonic clock, ms: its chunk was written then), from the proxy's maxima per bucket (`by_s`:
    LegStats.asked_json, `bucket_s` long); a bucket without a chunk asked nothing. NaN for a request that began
    before the first kept bucket of a proxy that let older ones go (`dropped`). None without the maxima."""
    if not by_s or by_s.get("t0_s") is None:
        return None
    per_s = np.concatenate([np.asarray(by_s.get("asked_ms_max") or [], dtype=float), [0.0]])  # [-1]: none asked
    last = per_s.size - 2
    bucket_ms = 1e3 * float(by_s.get("bucket_s") or 1.0)
    t0 = round(by_s["t0_s"] * 1e3 / bucket_ms)
    first = np.floor(np.asarray(start_ms, dtype=float) / bucket_ms) - t0
    final = np.floor(np.asarray(end_ms, dtype=float) / bucket_ms) - t0
    ok = np.isfinite(first) & np.isfinite(final)
    if by_s.get("dropped"):
        ok &= first >= 0
    first, final = np.where(ok, np.maximum(first, 0), 0).astype(np.int64), np.where(ok, final, -1).astype(np.int64)
    out = np.zeros(first.shape)
    span = int(np.max(final - first, initial=0))
    for k in range(span + 1):
        i = first + k
        inside = (i <= final) & (i <= last)
        out = np.where(inside, np.maximum(out, per_s[np.where(inside, i, -1)]), out)
    return np.where(ok, out, np.nan)


def robot_hop_excess(
    hop: np.ndarray,
    site: np.ndarray,
    proxy_legs: dict | None,
    direction: str,
    asked_by_s: dict | None = None,
    window_ms: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, dict[str, dict]]:
    """Per request, a hop between the robot and the router (ROBOT_HOPS; `direction`: the proxy's word for it)
    beyond what its site's proxy could have asked of it, and at least that leg's p50 applied - asked error; NaN
    where the site's leg was not counted (a real Toxiproxy, a proxy from before the asked range was counted) or
    the site answered too few requests. And, by site: the asked range, the floor and the p50 error used.

    Such a hop is the robot's send or receive (a shard's: its engines share the process and its GIL with the
    control loop), the proxy's hold (what its toxics asked of the chunk: the system's network; plus its error) and
    two loopback hops. What is beyond the largest delay the toxics asked of any chunk on that leg and beyond the
    hop's floor (its 1st percentile over the site's requests less the smallest asked, so never below the
    loopback's true floor) the profile cannot explain: a lower bound of the bench's share for the request, as it
    takes every request to have been asked the most. The largest asked is the one around the request's own time
    where the proxy kept it by the 100 ms (`asked_by_s`: site -> LegStats.asked_json of this direction; `window_ms`:
    each request's hop start and end, ms of the proxy's clock): a bandwidth toxic asks hundreds of ms of a chunk
    in a burst's queue and a few the rest of the run. Else the whole run's (`asked_ms_max`). The leg's p50 error
    is the larger where the bound reads less (the proxy's own error, measured per chunk: bench_share's
    `uplink_ms`)."""
    hop = np.asarray(hop, dtype=float)
    site = np.asarray(site, dtype=str)
    out = np.full(hop.shape, np.nan)
    info: dict[str, dict] = {}
    for name in sorted(set(site.tolist()) - {""}):
        snap = (proxy_legs or {}).get(name) or {}
        leg = snap.get(direction)
        rows = (site == name) & np.isfinite(hop)
        if leg is None or np.count_nonzero(rows) < HOP_FLOOR_MIN_REQUESTS:
            continue
        if leg.get("chunks"):
            lo, hi = leg.get("asked_ms_min"), leg.get("asked_ms_max")
            error = _percentile(leg.get("hist") or [], snap.get("edges_ms") or [], 0.50) or 0.0
            if lo is None or hi is None:
                continue
        else:
            lo = hi = error = 0.0  # no toxic on this leg: the proxy forwards its bytes untouched, nothing asked
        floor = max(float(np.percentile(hop[rows], 1)) - lo, 0.0)
        most = np.full(np.count_nonzero(rows), float(hi))
        around = (
            asked_around((asked_by_s or {}).get(name), window_ms[0][rows], window_ms[1][rows])
            if window_ms is not None and leg.get("chunks")
            else None
        )
        if around is not None:
            most = np.where(np.isfinite(around), np.minimum(around, hi), most)
        out[rows] = np.maximum(hop[rows] - most - floor, error)
        info[name] = {
            "asked_ms_min": _r(lo),
            "asked_ms_max": _r(hi),
            "floor_ms": _r(floor),
            "error_ms_p50": _r(error),
            "asked_by_time": around is not None,
        }
    return out.astype(np.float32), info


FAULT_SETTLE_S = 10.0  # after a fault window: a partition's end and a restart send sessions back for seconds


def near_faults(t_s: np.ndarray, fault_windows: list[dict]) -> np.ndarray:
    """Which of the times `t_s` (s of the run) fall in a fault window or the FAULT_SETTLE_S after it; a window
    without an end (a kill, a restart still running) reaches to its start + FAULT_SETTLE_S at least."""
    t = np.asarray(t_s, dtype=float)
    out = np.zeros(t.shape, dtype=bool)
    for w in fault_windows or []:
        start = w.get("t_start")
        if start is None:
            continue
        end = w.get("t_end") if w.get("t_end") is not None else start
        out |= (t >= float(start)) & (t <= float(end) + FAULT_SETTLE_S)
    return out


def bench_share(
    proxy_legs: dict | None,
    replicas: list[dict],
    requests: dict | None = None,
    hop_floors: dict[str, dict[str, float]] | None = None,
    duration_s: float | None = None,
    robot_hops: dict[str, dict[str, dict]] | None = None,
    encode_floors: dict[str, float] | None = None,
    fault_windows: list[dict] | None = None,
) -> dict:
    """How much of the latency budget's figures the bench added (summary.json `fidelity.bench_share`, the report's
    "of it, the bench" column), where it can be measured:

    - `uplink_ms` / `downlink_ms`: the proxies' applied - asked delay per chunk, every site's histogram of that
      direction added (so chunk-weighted), p50 and p99; `sites_measured` of `sites` (a leg with no toxic forwards
      bytes untouched and is not stamped: its share is unmeasured, not zero);
    - `inference_ms`, `queue_wait_ms` (from the requests' `inference_bench_ms` / `queue_wait_bench_ms`,
      bench.evidence.replay): a figure's p50 and p99 less the same percentile of it with each request's bench part
      taken off; the forward pass beyond the replica's own unloaded time at the same batch size, and the queue
      wait that slower pass added to the requests behind it (host contention: a replica on its own GPU would not
      see it). `requests_measured`: the share of answered requests with a measured part (the others count none).
      Without those columns (a run recorded before them), `inference_ms` is `{p50, replicas}`: the replicas'
      excess p50s weighted by their answered requests;
    - `uplink_from_router_ms`, `downlink_to_router_ms` (SERVER_HOPS; from the requests' `<hop>_bench_ms`,
      hop_excess): the same for the two hops between the router and the replica, each request's hop beyond its
      replica's floor for it; `floor_ms` by replica (`hop_floors`). An upper bound (hop_excess says why);
    - `uplink_to_router_ms`, `downlink_from_router_ms` (ROBOT_HOPS; from the requests' `<hop>_bench_ms`,
      robot_hop_excess): the same for the two hops between the robot and the router, each request's hop beyond
      the most its site's proxy asked and its floor, at least the leg's p50 error; `sites`: what was used, by site
      (`robot_hops`). A lower bound but for that p50 error (robot_hop_excess says why);
    - `rtt_ms`: the same for the round trip, each request less its queue wait, forward and four hop parts; a run
      whose robot-side hops were not split (a real Toxiproxy) takes the proxies' p50 up and down
      off every request instead (their error is per chunk, not per request), `network_ms_taken_off`; with
      `fault_windows` ({t_start, t_end} of the run's faults), also `steady` and `around_faults` {p50, p99,
      requests}: the same for the requests sent outside every fault window and the FAULT_SETTLE_S after it, and
      for the others (reconnect storms and restarts load the host too: a bench p99 made there says nothing of
      steady state), and `by_fault`: [{fault, t_start, p50, p99, requests}] one entry a fault window (which fault
      the tail came with);
    - `send_lag_ms` / `merge_lag_ms` (from the engines' request records, `requests`): the robot's delays outside
      the round trip, from the observation's tick to its engine's worker taking it up, and from a chunk's arrival
      to its merge, p50 and p99. A robot's own computer runs one engine; a bench shard runs a hundred beside its
      control loop in one process, so these are the shard's (an upper bound of the bench's share: a real
      worker's wake-up is not zero);
    - `encode_ms` (from the requests' `encode_bench_ms`, encode_excess): the client's encode, outside the round
      trip, each request's beyond its group's floor; `floor_ms` by group (`encode_floors`). An upper bound.
    Requests count as the figures do: answered, in the measured window (t from 0 to `duration_s`, when given)."""
    out: dict = {}
    for direction, figure in (("upstream", "uplink_ms"), ("downstream", "downlink_ms")):
        hist, edges, measured, sites = None, [], 0, 0
        for snap in (proxy_legs or {}).values():
            leg = snap.get(direction)
            if not leg:
                continue
            sites += 1
            if not leg.get("chunks"):
                continue
            measured += 1
            edges = snap.get("edges_ms") or edges
            hist = list(leg["hist"]) if hist is None else [a + b for a, b in zip(hist, leg["hist"])]
        if sites:
            out[figure] = {
                "p50": _r(_percentile(hist, edges, 0.50)) if hist else None,
                "p99": _r(_percentile(hist, edges, 0.99)) if hist else None,
                "sites_measured": measured,
                "sites": sites,
            }
    req = requests or {}
    outcome = req.get("outcome")

    keep = None
    if outcome is not None:
        keep = np.asarray(outcome) == "ok"
        t = req.get("t")
        if duration_s is not None and t is not None and len(t) == len(keep):
            t = np.asarray(t, dtype=float)
            keep &= (t >= 0) & (t <= duration_s + 1e-9)

    def answered(name: str) -> np.ndarray:
        v = np.asarray(req.get(name, []), dtype=float)
        return v[keep] if keep is not None and len(keep) == len(v) else v

    def less(figure: np.ndarray, part: np.ndarray) -> dict | None:
        keep = np.isfinite(figure)
        if not keep.any() or part.size != figure.size:
            return None
        v, b = figure[keep], part[keep]
        was = np.isfinite(b)
        if not was.any():
            return None
        bare = v - np.where(was, b, 0.0)
        return {
            "p50": _r(np.percentile(v, 50) - np.percentile(bare, 50)),
            "p99": _r(np.percentile(v, 99) - np.percentile(bare, 99)),
            "requests_measured": _r(was.mean()),
        }

    judged = [r for r in replicas if r.get("forward_excess_ms_p50") is not None and r.get("requests")]
    qw_b, inf_b = answered("queue_wait_bench_ms"), answered("inference_bench_ms")
    inference = less(answered("inference_ms"), inf_b)
    if inference is not None:
        out["inference_ms"] = {**inference, "replicas": len(judged)}
    elif judged:
        n = sum(r["requests"] for r in judged)
        out["inference_ms"] = {
            "p50": _r(sum(max(r["forward_excess_ms_p50"], 0.0) * r["requests"] for r in judged) / n),
            "replicas": len(judged),
        }
    queue = less(answered("queue_wait_ms"), qw_b)
    if queue is not None:
        out["queue_wait_ms"] = queue
    hops_b = []
    for name in SERVER_HOPS:
        b = answered(name[:-3] + "_bench_ms")
        hop = less(answered(name), b)
        if hop is not None:
            out[name] = {**hop, "floor_ms": {rid: f.get(name) for rid, f in sorted((hop_floors or {}).items())}}
            hops_b.append(b)
    robot_side = False
    for name, _ in ROBOT_HOPS:
        b = answered(name[:-3] + "_bench_ms")
        hop = less(answered(name), b)
        if hop is not None:
            out[name] = {**hop, "sites": dict(sorted(((robot_hops or {}).get(name) or {}).items()))}
            hops_b.append(b)
            robot_side = True
    encode = less(answered("encode_ms"), answered("encode_bench_ms"))
    if encode is not None:  # outside the round trip: not taken off it
        out["encode_ms"] = {**encode, "floor_ms": dict(sorted((encode_floors or {}).items()))}
    for name in ("send_lag_ms", "merge_lag_ms"):  # the answered requests', as the budget's rows count them
        v = answered(name)
        v = v[np.isfinite(v)]
        if v.size:
            out[name] = {"p50": _r(np.percentile(v, 50)), "p99": _r(np.percentile(v, 99))}
    # the proxies' error per chunk, taken off every request where the robot-side hops were not split per request
    network = 0.0 if robot_side else sum((out.get(k) or {}).get("p50") or 0.0 for k in ("uplink_ms", "downlink_ms"))
    if robot_side:  # the one-way legs and the network per request too, the proxies' own error kept beside
        parts_of = {h: answered(h[:-3] + "_bench_ms") for h in [h for h, _ in ROBOT_HOPS] + list(SERVER_HOPS)}
        up = [parts_of["uplink_to_router_ms"], parts_of["uplink_from_router_ms"]]
        down = [parts_of["downlink_to_router_ms"], parts_of["downlink_from_router_ms"]]
        for name, parts in (("uplink_ms", up), ("downlink_ms", down), ("network_ms", up + down)):
            figure = answered(name)
            stacked = np.vstack([b if b.size == figure.size else np.full(figure.size, np.nan) for b in parts])
            total = np.where(np.isfinite(stacked).any(axis=0), np.nansum(stacked, axis=0), np.nan)
            leg = less(figure, total)
            if leg is not None:
                proxies = {
                    ("proxy_error_ms_" + k if k in ("p50", "p99") else k): v for k, v in (out.get(name) or {}).items()
                }
                out[name] = {**leg, **proxies}
    rtt = answered("rtt_ms")
    if qw_b.size == rtt.size and inf_b.size == rtt.size and (np.isfinite(qw_b).any() or np.isfinite(inf_b).any()):
        parts = np.nan_to_num(qw_b, nan=0.0) + np.nan_to_num(inf_b, nan=0.0) + network
        for b in hops_b:
            parts = parts + np.nan_to_num(b, nan=0.0)
        rtt_share = less(rtt, parts)
        if rtt_share is not None:
            rtt_share.pop("requests_measured")
            out["rtt_ms"] = rtt_share
            t_answered = answered("t")
            near = near_faults(t_answered, fault_windows) if fault_windows else None
            if near is not None and near.size == rtt.size:

                def phase_of(rows: np.ndarray) -> dict:
                    phase = less(rtt[rows], parts[rows]) if rows.any() else None
                    if phase is not None:
                        phase.pop("requests_measured")
                    return {**(phase or {"p50": None, "p99": None}), "requests": int(rows.sum())}

                for name, rows in (("steady", ~near), ("around_faults", near)):
                    out["rtt_ms"][name] = phase_of(rows)
                # which fault the tail came with: each window (and its settle time) on its own
                out["rtt_ms"]["by_fault"] = [
                    {
                        "fault": f"{w.get('action')} {w.get('target')}".strip() if w.get("action") else f"fault {i}",
                        "t_start": _r(float(w["t_start"])),
                        **phase_of(near_faults(t_answered, [w])),
                    }
                    for i, w in enumerate(fault_windows)
                    if w.get("t_start") is not None
                ]
            out["network_ms_taken_off"] = _r(network)
            out["note"] = (
                "the round trip less each request's queue wait and forward parts, its hops between the "
                "router and the replica beyond their floor (an upper bound) and "
                + (
                    "its hops between the robot and the router beyond what the proxies asked (a lower bound)"
                    if robot_side
                    else "the proxies' p50 error up and down"
                )
                + "; the client's encode is outside the round trip (its own row)"
            )
    if "rtt_ms" not in out:
        parts = [out.get(k, {}).get("p50") for k in ("uplink_ms", "downlink_ms", "inference_ms")]
        if any(p is not None for p in parts):
            out["rtt_ms"] = {"p50": _r(sum(p for p in parts if p is not None))}
            out["note"] = (
                "the round trip's share is the sum of its parts' p50s (an estimate: medians do not add); the "
                "client's encode and the server's queue wait are not split"
            )
    return out
