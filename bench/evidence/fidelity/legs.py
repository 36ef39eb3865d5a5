"""Per network leg (site x direction): the delay each site's proxy applied against the delay its toxics
asked (chaos.toxiproxy.fidelity), the bandwidth it delivered against the rate asked, and the per-second
series of the mean error."""

from __future__ import annotations

import math

from bench.evidence.fidelity.rounding import _r

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
        return {
            k: {"t": [round(x, 3) for x in ts], "error_ms": [round(y, 4) for y in ys]}
            for k, (ts, ys) in self.series.items()
        }


MIN_SHAPED_S = 0.5  # a leg's backlogged traffic must fill this much ideal link time before its rate is judged
LEG_NAMES = {"upstream": "uplink", "downstream": "downlink"}  # the proxy's words -> the robot's


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
    out = {
        "site": site,
        "leg": LEG_NAMES.get(direction, direction),
        "chunks": n,
        "asked_ms_mean": None,
        "error_ms_p50": None,
        "error_ms_p99": None,
        "error_ms_max": None,
        "tolerance_ms": None,
        "bandwidth": None,
    }
    if n <= 0:
        out["note"] = "no toxic on this leg (the proxy forwards bytes untouched): nothing asked, nothing to measure"
        return out
    asked = leg["asked_ms_sum"] / n
    out.update(
        asked_ms_mean=_r(asked),
        error_ms_p50=_r(_percentile(leg["hist"], edges_ms, 0.50)),
        error_ms_p99=_r(_percentile(leg["hist"], edges_ms, 0.99)),
        error_ms_max=_r(leg.get("error_ms_max")),
        error_ms_mean=_r(leg["error_ms_sum"] / n),
        tolerance_ms=_r(max(tol["leg_error_ms"], tol["leg_error_ratio"] * asked)),
    )
    if leg.get("shaped_bytes") and leg.get("shaped_busy_s") and leg.get("shaped_ideal_s", 0) >= MIN_SHAPED_S:
        rate = float(leg.get("rate_kbps") or 0)
        delivered = leg["shaped_bytes"] / leg["shaped_busy_s"] / 1e3
        out["bandwidth"] = {
            "asked_kBps": rate,
            "delivered_kBps": _r(delivered, 1),
            "ratio": _r(delivered / rate) if rate > 0 else None,
        }
    return out
