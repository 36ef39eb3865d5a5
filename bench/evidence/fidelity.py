"""The twin's own error: how far this run's bench host bent what the scenario asked for.

Owns `summary.json` → `fidelity`: per network leg (site x direction) the delay each site's proxy
applied against the delay its toxics asked (chaos.toxiproxy.fidelity) and the bandwidth it delivered
against the rate asked; per shard the host-late tick ratio, the loop overrun ratio and the worst
scheduler wait (slot wall time - its CPU time); per replica the forward pass against the same
replica's unloaded forward at the same batch size, measured when it started. Each figure is judged
against the scenario's `fidelity:` tolerances; `valid` is false when any is out, and `reasons` says
which, in a sentence naming the shard, leg or replica. Invariant: a figure that could not be measured
is reported as null with a note and never makes a run invalid.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from bench.fleet.ticks import HOST_LATE

LEG_DIRECTIONS = (("upstream", "uplink"), ("downstream", "downlink"))


class LegErrorSeries:
    """Mean (applied - asked) delay of each network leg, one point per sample (the runner samples every second).

    Fed the proxy's cumulative counters (chaos.toxiproxy.fidelity.LegStats.to_json per site and direction), it
    keeps only the previous snapshot's two counters per leg and, per point, two floats: memory grows by 16 bytes
    per leg per sample (about 1.4 MB per leg per day at 1 Hz), not by the full counters and histogram each time
    (about 18 KB per second with two sites, which made a soak's runner grow 1.1 MB a minute).
    """

    def __init__(self) -> None:
        from array import array

        self._array = array
        self._last: dict[str, tuple[int, float]] = {}
        self.series: dict[str, tuple] = {}  # "site uplink" -> (array t, array mean error ms)

    def add(self, t: float, legs: dict) -> None:
        for site, snap in (legs or {}).items():
            for direction, word in LEG_DIRECTIONS:
                counters = (snap or {}).get(direction) or {}
                key = f"{site} {word}"
                chunks, err = int(counters.get("chunks", 0)), float(counters.get("error_ms_sum", 0.0))
                prev = self._last.get(key)
                self._last[key] = (chunks, err)
                if prev is None or chunks <= prev[0]:
                    continue  # the first sample, or no chunk through this leg in the last second
                ts, ys = self.series.setdefault(key, (self._array("d"), self._array("d")))
                ts.append(t)
                ys.append((err - prev[1]) / (chunks - prev[0]))

    def to_json(self) -> dict[str, dict[str, list[float]]]:
        return {k: {"t": [round(x, 3) for x in ts], "error_ms": [round(y, 4) for y in ys]}
                for k, (ts, ys) in self.series.items()}

MIN_SHAPED_S = 0.5  # a leg's backlogged traffic must fill this much ideal link time before its rate is judged
LEG_NAMES = {"upstream": "uplink", "downstream": "downlink"}  # the proxy's words -> the robot's


def _r(x, nd=3):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else round(float(x), nd)


def _percentile(hist: list[int], edges_ms: list[float], q: float) -> float | None:
    """The q-quantile of the proxy's error histogram (bins over `edges_ms`, the last one open) as its bin's
    upper edge, ms; None if empty. The proxy sends its edges with its counts (chaos.toxiproxy.fidelity)."""
    total = sum(hist)
    if total <= 0 or not edges_ms:
        return None
    seen = 0
    for i, n in enumerate(hist):
        seen += n
        if n and seen >= q * total:
            return float(edges_ms[i]) if i < len(edges_ms) else math.inf
    return float(edges_ms[-1])


def leg_figures(site: str, direction: str, leg: dict, edges_ms: list[float], tol: dict) -> dict:
    """One leg from the proxy's window counters (chaos.toxiproxy.fidelity.LegStats.to_json, subtracted)."""
    n = int(leg.get("chunks") or 0)
    out = {"site": site, "leg": LEG_NAMES.get(direction, direction), "chunks": n, "asked_ms_mean": None,
           "error_ms_p50": None, "error_ms_p99": None, "error_ms_max": None, "tolerance_ms": None, "bandwidth": None}
    if n <= 0:
        out["note"] = "no toxic on this leg (the proxy forwards bytes untouched): nothing asked, nothing to measure"
        return out
    asked = leg["asked_ms_sum"] / n
    out.update(asked_ms_mean=_r(asked), error_ms_p50=_r(_percentile(leg["hist"], edges_ms, 0.50)),
               error_ms_p99=_r(_percentile(leg["hist"], edges_ms, 0.99)), error_ms_max=_r(leg.get("error_ms_max")),
               error_ms_mean=_r(leg["error_ms_sum"] / n),
               tolerance_ms=_r(max(tol["leg_error_ms"], tol["leg_error_ratio"] * asked)))
    if leg.get("shaped_bytes") and leg.get("shaped_busy_s") and leg.get("shaped_ideal_s", 0) >= MIN_SHAPED_S:
        rate = float(leg.get("rate_kbps") or 0)
        delivered = leg["shaped_bytes"] / leg["shaped_busy_s"] / 1e3
        out["bandwidth"] = {"asked_kBps": rate, "delivered_kBps": _r(delivered, 1),
                            "ratio": _r(delivered / rate) if rate > 0 else None}
    return out


def shard_figures(data, duration_s: float) -> list[dict]:
    """Per shard: host-late ticks / ticks, overrun slots / slots, worst (wall - cpu) of a slot, ms."""
    out = []
    ticks, robots, loop = data.ticks or {}, data.robots or {}, data.loop or {}
    shard_of = {}
    if len(robots.get("robot", [])) and "shard" in robots:
        shard_of = dict(zip(np.asarray(robots["robot"]).tolist(), np.asarray(robots["shard"]).tolist()))
    t_shard = None
    if len(ticks.get("robot", [])) and shard_of:
        tm = (ticks["t"] >= 0) & (ticks["t"] <= duration_s)
        t_shard = np.array([shard_of.get(int(r), -1) for r in ticks["robot"][tm]])
        t_class = np.asarray(ticks["tick_class"][tm])
    shards = sorted(set(shard_of.values()))
    lm = None
    if len(loop.get("t", [])) and "shard" in loop:
        lm = (loop["t"] >= 0) & (loop["t"] <= duration_s)
    for k in shards:
        row = {"shard": int(k), "ticks": 0, "host_late_ratio": None, "loop_overrun_ratio": None,
               "scheduler_wait_ms_max": None}
        if t_shard is not None:
            mine = t_shard == k
            row["ticks"] = int(np.count_nonzero(mine))
            if row["ticks"]:
                row["host_late_ratio"] = _r(np.count_nonzero(t_class[mine] == HOST_LATE) / row["ticks"], 5)
        if lm is not None:
            m = lm & (loop["shard"] == k)
            slots = int(np.count_nonzero(m))
            if slots:
                row["loop_overrun_ratio"] = _r(np.count_nonzero(loop["overrun"][m]) / slots, 5)
                row["scheduler_wait_ms_max"] = _r(float(np.max(loop["wall_ms"][m] - loop["cpu_ms"][m])), 2)
        out.append(row)
    return out


UNLOADED_RE = re.compile(r"unloaded forward ms by batch size: (\{.*\})")
SUSPECT_REFERENCE_RATIO = 0.8  # loaded passes at p50 this much faster than the replica's unloaded time at the same
# batch size: the reference, not the run, is off (an H100 replica's reference timed raw frames stacked on the host
# and the previous pass's GPU tail, its loaded passes neither: 0.65x at 64 sessions, the bench's share -11 ms at p50)


def unloaded_forward(log_path: Path) -> dict[int, float] | None:
    """A replica's own unloaded forward ms by batch size, from the first start's log line (server.service)."""
    try:
        with open(log_path, errors="replace") as f:
            for line in f:
                m = UNLOADED_RE.search(line)
                if m:
                    return {int(k): float(v) for k, v in json.loads(m.group(1)).items()}
    except OSError:
        return None
    return None


def _at_batch(ref: dict[int, float], b: np.ndarray) -> np.ndarray:
    """The unloaded time at batch size b: linear between measured sizes, extrapolated past the largest. A larger
    batch never runs faster, so the measured sizes are first read as their lower envelope from the right (each the
    fastest of it and every larger size: a size measured while a neighbour started up reads slow), and the slope
    past the largest is never below zero."""
    xs = np.array(sorted(ref), dtype=float)
    ys = np.minimum.accumulate(np.array([ref[int(x)] for x in xs])[::-1])[::-1]
    out = np.interp(b, xs, ys)
    if len(xs) >= 2:
        slope = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
        beyond = b > xs[-1]
        out[beyond] = ys[-1] + slope * (b[beyond] - xs[-1])
    return np.maximum(out, 1e-3)


def replica_figures(audit, unloaded: dict[str, dict | None], window_ms: tuple[float, float]) -> list[dict]:
    """Per replica of `unloaded`: its answered requests' forward pass (`audit`: bench.evidence.audit's table) in
    `window_ms` (runner's monotonic clock), against its own unloaded time at the same batch size."""
    replica, fwd_all, batch_all, mono, answered = _forward_columns(audit)
    in_window = answered & (window_ms[0] <= mono) & (mono <= window_ms[1])
    out = []
    for rid in sorted(unloaded):
        ref = unloaded[rid]
        rows = in_window & (replica == rid)
        n = int(rows.sum())
        row = {"replica": rid, "requests": n, "unloaded_ms": ref, "forward_ms_p50": None,
               "forward_ratio_p50": None, "forward_ratio_p99": None, "forward_excess_ms_p50": None}
        if not ref:
            row["note"] = "no unloaded forward time in its log (warmup_inferences: 0?): not judged"
        elif n:
            fwd = fwd_all[rows]
            base = _at_batch(ref, batch_all[rows])
            ratio = fwd / base
            row.update(forward_ms_p50=_r(np.percentile(fwd, 50)), forward_ratio_p50=_r(np.percentile(ratio, 50)),
                       forward_ratio_p99=_r(np.percentile(ratio, 99)),
                       forward_excess_ms_p50=_r(np.percentile(fwd - base, 50)))
        out.append(row)
    return out


def _forward_columns(audit):
    """replica, forward_ms, batch, mono_ms of every audit row, and which rows are answered requests that carry
    all three numbers (a batch of 0 or null: not a forward pass)."""
    from bench.evidence.audit import equals, floats, strings

    fwd, batch, mono = floats(audit, "forward_ms"), floats(audit, "batch"), floats(audit, "mono_ms")
    answered = equals(audit, "outcome", "ok") & ~np.isnan(fwd) & ~np.isnan(batch) & (batch != 0) & ~np.isnan(mono)
    return strings(audit, "replica"), fwd, batch, mono, answered


def other_load(cpu_samples, cores: int, duration_s: float) -> dict | None:
    """The host's CPU used outside the run (host % minus the run's own processes, as % of all cores), mean over
    the first and the last window a `_drift` figure compares, and the shift between them (points of all cores).
    A drift of the run's latency between two windows whose background load differs measures the host."""
    from bench.evidence.figures import drift_windows

    (a0, a1), (b0, b1) = drift_windows(duration_s)
    first, last, probe_first, probe_last = [], [], [], []
    for x in cpu_samples or ():
        t = x.get("t")
        if t is None or x.get("host_percent") is None:
            continue
        other = max(0.0, x["host_percent"] - sum((x.get("processes") or {}).values()) / max(cores, 1))
        probe = x.get("speed_probe_ms")
        if a0 <= t < a1:
            first.append(other)
            if probe is not None:
                probe_first.append(probe)
        elif b0 < t <= b1:
            last.append(other)
            if probe is not None:
                probe_last.append(probe)
    if not first or not last:
        return None
    f, lst = float(np.mean(first)), float(np.mean(last))
    out = {"first_window_s": [_r(a0, 1), _r(a1, 1)], "last_window_s": [_r(b0, 1), _r(b1, 1)],
           "first_percent": _r(f, 1), "last_percent": _r(lst, 1), "shift": _r((lst - f) / 100.0, 3)}
    if probe_first and probe_last:  # the VM's own speed (the in-run speed probe, CPU time: higher is slower)
        # the mean, not the median: the VM flips between two speeds within seconds (bench.run.usage), and a
        # window's speed is its mix of them
        pf, pl = float(np.mean(probe_first)), float(np.mean(probe_last))
        out.update(probe_first_ms=_r(pf, 1), probe_last_ms=_r(pl, 1), probe_shift=_r(pl / pf - 1.0, 3))
    return out


def judge(legs: list[dict], shards: list[dict], replicas: list[dict], tol: dict,
          background: dict | None = None) -> list[str]:
    """Plain sentences, one per figure out of tolerance. `background` (other_load) is judged when given: the
    run asserts on a drift between its first and last windows."""
    reasons = []
    shift_tol = tol.get("other_load_shift", 0.05)
    if background and abs(background["shift"]) > shift_tol:
        w = background["first_window_s"][1] - background["first_window_s"][0]
        reasons.append(f"the host's load from outside the run moved between the windows a drift compares: "
                       f"{background['first_percent']:.0f} % of the cores in the first {w:.0f} s, "
                       f"{background['last_percent']:.0f} % in the last (tolerance {100 * shift_tol:.0f} points): "
                       "a drift there measures the host, not the system")
    speed_tol = tol.get("speed_shift", 0.15)
    if background and background.get("probe_shift") is not None and abs(background["probe_shift"]) > speed_tol:
        reasons.append(f"the host's own speed moved between the windows a drift compares: the in-run speed probe's "
                       f"mean was {background['probe_first_ms']:.1f} ms in the first, {background['probe_last_ms']:.1f} "
                       f"in the last ({100 * background['probe_shift']:+.0f} %, tolerance {100 * speed_tol:.0f} %): every "
                       "CPU step of a round trip moved with it, so a drift there measures the host")
    for s in shards:
        k = s["shard"]
        if s["host_late_ratio"] is not None and s["host_late_ratio"] > tol["host_late_ratio"]:
            reasons.append(f"shard {k}: {100 * s['host_late_ratio']:.2f} % of its ticks were late because of the bench "
                           f"host (tolerance {100 * tol['host_late_ratio']:.2f} %)")
        if s["loop_overrun_ratio"] is not None and s["loop_overrun_ratio"] > tol["loop_overrun_ratio"]:
            reasons.append(f"shard {k}: {100 * s['loop_overrun_ratio']:.2f} % of its loop slots overran their budget "
                           f"(tolerance {100 * tol['loop_overrun_ratio']:.2f} %)")
        if s["scheduler_wait_ms_max"] is not None and s["scheduler_wait_ms_max"] > tol["scheduler_wait_ms"]:
            reasons.append(f"shard {k}: its control loop waited up to {s['scheduler_wait_ms_max']:.0f} ms in one slot "
                           f"for a core or the GIL (tolerance {tol['scheduler_wait_ms']:.0f} ms)")
    for g in legs:
        where = f"site {g['site']} {g['leg']}"
        if g.get("error_ms_p99") is not None and g["error_ms_p99"] > g["tolerance_ms"]:
            reasons.append(f"{where}: the proxy applied up to {g['error_ms_p99']:.1f} ms (p99) more delay than the "
                           f"{g['asked_ms_mean']:.1f} ms the profile asked (tolerance {g['tolerance_ms']:.1f} ms)")
        bw = g.get("bandwidth")
        if bw and bw.get("ratio") is not None and bw["ratio"] < tol["bandwidth_ratio"]:
            reasons.append(f"{where}: delivered {bw['delivered_kBps']:.0f} kB/s while busy of the {bw['asked_kBps']:.0f} "
                           f"asked ({bw['ratio']:.2f}; tolerance {tol['bandwidth_ratio']:.2f})")
    excess_tol = tol.get("forward_excess_ms", 2.0)
    for r in replicas:
        # starved: slower than its unloaded self by the ratio AND by enough ms to matter (a 1.5 ms forward pass
        # doubles from one context switch on a busy host, which no round trip notices)
        if r.get("forward_ratio_p50") is not None and r["forward_ratio_p50"] > tol["forward_ratio"] \
                and (r.get("forward_excess_ms_p50") is None or r["forward_excess_ms_p50"] > excess_tol):
            reasons.append(f"replica {r['replica']}: its forward pass took {r['forward_ratio_p50']:.2f}x its own "
                           f"unloaded time at the same batch size, {r.get('forward_excess_ms_p50')} ms more (p50; "
                           f"tolerance {tol['forward_ratio']:.2f}x and {excess_tol:g} ms): starved of CPU")
    return reasons


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


def robot_hop_excess(hop: np.ndarray, site: np.ndarray, proxy_legs: dict | None, direction: str,
                     asked_by_s: dict | None = None,
                     window_ms: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, dict[str, dict]]:
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
        around = asked_around((asked_by_s or {}).get(name), window_ms[0][rows], window_ms[1][rows]) \
            if window_ms is not None and leg.get("chunks") else None
        if around is not None:
            most = np.where(np.isfinite(around), np.minimum(around, hi), most)
        out[rows] = np.maximum(hop[rows] - most - floor, error)
        info[name] = {"asked_ms_min": _r(lo), "asked_ms_max": _r(hi), "floor_ms": _r(floor), "error_ms_p50": _r(error),
                      "asked_by_time": around is not None}
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


def bench_share(proxy_legs: dict | None, replicas: list[dict], requests: dict | None = None,
                hop_floors: dict[str, dict[str, float]] | None = None, duration_s: float | None = None,
                robot_hops: dict[str, dict[str, dict]] | None = None,
                encode_floors: dict[str, float] | None = None,
                fault_windows: list[dict] | None = None) -> dict:
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
            out[figure] = {"p50": _r(_percentile(hist, edges, 0.50)) if hist else None,
                           "p99": _r(_percentile(hist, edges, 0.99)) if hist else None,
                           "sites_measured": measured, "sites": sites}
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
        return {"p50": _r(np.percentile(v, 50) - np.percentile(bare, 50)),
                "p99": _r(np.percentile(v, 99) - np.percentile(bare, 99)), "requests_measured": _r(was.mean())}

    judged = [r for r in replicas if r.get("forward_excess_ms_p50") is not None and r.get("requests")]
    qw_b, inf_b = answered("queue_wait_bench_ms"), answered("inference_bench_ms")
    inference = less(answered("inference_ms"), inf_b)
    if inference is not None:
        out["inference_ms"] = {**inference, "replicas": len(judged)}
    elif judged:
        n = sum(r["requests"] for r in judged)
        out["inference_ms"] = {"p50": _r(sum(max(r["forward_excess_ms_p50"], 0.0) * r["requests"] for r in judged) / n),
                               "replicas": len(judged)}
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
                proxies = {("proxy_error_ms_" + k if k in ("p50", "p99") else k): v for k, v in (out.get(name) or {}).items()}
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
                    {"fault": f"{w.get('action')} {w.get('target')}".strip() if w.get("action") else f"fault {i}",
                     "t_start": _r(float(w["t_start"])), **phase_of(near_faults(t_answered, [w]))}
                    for i, w in enumerate(fault_windows) if w.get("t_start") is not None]
            out["network_ms_taken_off"] = _r(network)
            out["note"] = ("the round trip less each request's queue wait and forward parts, its hops between the "
                           "router and the replica beyond their floor (an upper bound) and "
                           + ("its hops between the robot and the router beyond what the proxies asked (a lower "
                              "bound)" if robot_side else "the proxies' p50 error up and down")
                           + "; the client's encode is outside the round trip (its own row)")
    if "rtt_ms" not in out:
        parts = [out.get(k, {}).get("p50") for k in ("uplink_ms", "downlink_ms", "inference_ms")]
        if any(p is not None for p in parts):
            out["rtt_ms"] = {"p50": _r(sum(p for p in parts if p is not None))}
            out["note"] = ("the round trip's share is the sum of its parts' p50s (an estimate: medians do not add); the "
                           "client's encode and the server's queue wait are not split")
    return out


# the parts of the round trip's share the end-of-run line names: the proxies' error up and down, or, where the
# robot-side hops were split per request (those include it), the four hops
SHARE_PARTS = ((("uplink_ms", "uplink"), ("downlink_ms", "downlink"), ("queue_wait_ms", "queue wait"),
                ("inference_ms", "inference"), ("uplink_from_router_ms", "router -> server"),
                ("downlink_to_router_ms", "server -> router")),
               (("uplink_to_router_ms", "robot -> router"), ("uplink_from_router_ms", "router -> server"),
                ("queue_wait_ms", "queue wait"), ("inference_ms", "inference"),
                ("downlink_to_router_ms", "server -> router"), ("downlink_from_router_ms", "router -> robot")))


def compute(data, duration_s: float, tol: dict, proxy_legs: dict | None, audit,
            unloaded: dict[str, dict | None], window_ms: tuple[float, float], proxy_note: str | None = None,
            cores: int = 1, judge_drift: bool = False, queue_replay: list[dict] | None = None,
            hop_floors: dict[str, dict[str, float]] | None = None,
            robot_hops: dict[str, dict[str, dict]] | None = None,
            encode_floors: dict[str, float] | None = None) -> dict:
    """The `fidelity` mapping of summary.json. `proxy_legs`: site -> the proxy's window counters
    ({"edges_ms", "upstream", "downstream"}), None when the proxy cannot say (real Toxiproxy). `judge_drift`:
    the scenario asserts on a `_drift` figure, so the host's outside load in its two windows is judged."""
    legs = []
    for site, snap in sorted((proxy_legs or {}).items()):
        for d in ("upstream", "downstream"):
            if d in snap:
                legs.append(leg_figures(site, d, snap[d], snap.get("edges_ms") or [], tol))
    shards = shard_figures(data, duration_s) if data is not None else []
    replicas = replica_figures(audit, unloaded, window_ms)
    background = other_load(getattr(data, "cpu_samples", None), cores, duration_s) if data is not None else None
    reasons = judge(legs, shards, replicas, tol, background if judge_drift else None)
    out = {"valid": not reasons, "reasons": reasons, "tolerances": dict(tol), "legs": legs, "shards": shards,
           "replicas": replicas, "other_load": background,
           "bench_share": bench_share(proxy_legs, replicas, getattr(data, "requests", None), hop_floors,
                                        duration_s, robot_hops, encode_floors, getattr(data, "fault_windows", None)),
           "queue_replay": list(queue_replay or [])}
    if proxy_note:
        out["note"] = proxy_note
    return out


def table_lines(f: dict) -> list[str]:
    """The end-of-run table (stderr): one line per leg, shard and replica, then the verdict on the twin."""
    if not f.get("legs") and not f.get("shards"):  # no tick ran (a run that failed to start): nothing was judged
        return ["  fidelity: not judged (no robot ticked)"]
    lines = [f"  fidelity: {'VALID' if f.get('valid') else 'OUT OF TOLERANCE'}"]
    for g in f.get("legs", []):
        if g.get("error_ms_p99") is None:
            continue
        bw = g.get("bandwidth")
        lines.append(f"    leg {g['site']}/{g['leg']:8} asked {g['asked_ms_mean']:7.1f} ms  applied-asked p50 "
                     f"{g['error_ms_p50']:6.1f} p99 {g['error_ms_p99']:7.1f} ms (tol {g['tolerance_ms']:.1f})"
                     + (f"  bw {bw['delivered_kBps']}/{bw['asked_kBps']:.0f} kB/s" if bw else ""))
    for s in f.get("shards", []):
        lines.append(f"    shard {s['shard']}: host-late {_pct(s['host_late_ratio'])}  overrun {_pct(s['loop_overrun_ratio'])}"
                     f"  worst wait {s['scheduler_wait_ms_max']} ms")
    for r in f.get("replicas", []):
        if r.get("forward_ms_p50") is None:  # it answered nothing (it did not start, or the run ended first)
            continue
        lines.append(f"    replica {r['replica']}: forward p50 {r['forward_ms_p50']} ms, {r['forward_ratio_p50']}x "
                     f"unloaded (p99 {r['forward_ratio_p99']}x)"
                     + (f"; faster than its unloaded reference {r['unloaded_ms']}: that reference is suspect, and "
                        "the bench's share read against it comes out below zero"
                        if r["forward_ratio_p50"] < SUSPECT_REFERENCE_RATIO else ""))
    bg = f.get("other_load")
    if bg:
        lines.append(f"    host outside the run: {bg['first_percent']:.0f} % of the cores in the first window, "
                     f"{bg['last_percent']:.0f} % in the last"
                     + (f"; speed probe {bg['probe_first_ms']:.1f} -> {bg['probe_last_ms']:.1f} ms"
                        if bg.get("probe_shift") is not None else ""))
    share = f.get("bench_share") or {}
    if (share.get("rtt_ms") or {}).get("p50") is not None:
        parts = [f"{name} {share[k]['p50']:.1f}" for k, name in SHARE_PARTS[1 if share.get(ROBOT_HOPS[0][0]) else 0]
                 if (share.get(k) or {}).get("p50") is not None]
        p99 = share["rtt_ms"].get("p99")
        lines.append(f"    the bench's share of the round trip: ~{share['rtt_ms']['p50']:.1f} ms at p50"
                     + (f", ~{p99:.1f} at p99" if p99 is not None else "") + f" ({', '.join(parts)} at p50)")
        steady, near = share["rtt_ms"].get("steady") or {}, share["rtt_ms"].get("around_faults") or {}
        if steady.get("p99") is not None and near.get("requests"):
            lines.append(f"      away from the faults ({steady['requests']} requests) ~{steady['p50']:.1f} / ~"
                         f"{steady['p99']:.1f} ms at p50 / p99; in their windows and {FAULT_SETTLE_S:g} s after "
                         f"({near['requests']}) " + (f"~{near['p50']:.1f} / ~{near['p99']:.1f} ms"
                                                     if near.get("p99") is not None else "unmeasured"))
            for b in share["rtt_ms"].get("by_fault") or []:
                if b.get("p99") is not None:
                    lines.append(f"        {b['fault']} at t {b['t_start']:g} s ({b['requests']} requests): "
                                 f"~{b['p50']:.1f} / ~{b['p99']:.1f} ms")
    for q in f.get("queue_replay") or []:
        if q.get("replay_error_ms_p50") is not None:
            lines.append(f"    replica {q['replica']} queue replayed: wait p50 {q['queue_wait_ms_p50']} / p99 "
                         f"{q['queue_wait_ms_p99']} ms, replay {q['replayed_ms_p50']} / {q['replayed_ms_p99']}, unloaded "
                         f"{q['unloaded_ms_p50']} / {q['unloaded_ms_p99']}")
    lags = [f"{name} p50 {share[k]['p50']:.1f} / p99 {share[k]['p99']:.1f} ms" for k, name in
            (("send_lag_ms", "observation -> send"), ("merge_lag_ms", "arrival -> merge")) if share.get(k)]
    enc = share.get("encode_ms") or {}
    if enc.get("p50") is not None and enc.get("p99") is not None:
        lags.append(f"client encode beyond its floor p50 {enc['p50']:.1f} / p99 {enc['p99']:.1f} ms")
    if lags:
        lines.append(f"    the shards' own delay outside the round trip: {'; '.join(lags)}")
    lines += [f"    ! {x}" for x in f.get("reasons", [])]
    return lines


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.2f} %"


def forward_series(audit, unloaded: dict[str, dict | None], t0_ms: float,
                   duration_s: float) -> dict[str, tuple[list, list]]:
    """Per replica, per second of the run: the median forward / unloaded ratio (the report's figure)."""
    replica, fwd, batch, mono, answered = _forward_columns(audit)
    out = {}
    for rid, ref in unloaded.items():
        if not ref:
            continue
        rows = answered & (replica == rid)
        if not rows.any():
            continue
        t = (mono[rows] - t0_ms) / 1e3
        ratio = fwd[rows] / _at_batch(ref, batch[rows])
        m = (t >= 0) & (t <= duration_s)
        sec = np.floor(t[m]).astype(int)
        xs, ys = [], []
        for k in np.unique(sec):
            xs.append(float(k))
            ys.append(float(np.median(ratio[m][sec == k])))
        out[rid] = (xs, ys)
    return out
