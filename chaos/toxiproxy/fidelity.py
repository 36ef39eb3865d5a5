"""What each link of a proxy really did: delay applied vs delay asked, bytes shaped vs rate asked.

Every chunk carries `born` (the loop time its bytes were read, the link's existing read stamp, so the
stamp costs no clock call) and `asked` (the delay its toxics intended so far: a latency toxic adds the
delay it drew, a bandwidth toxic moves it to the chunk's departure on an ideal link of its rate). The
sink stamps the write once and records `applied - asked` here. Invariant: memory is fixed per link
direction (a histogram of `len(EDGES_MS) + 1` counters and a few sums), whatever the traffic; a
recording is a bisect and a few additions.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right

# Error bins (ms): 0.1 ms steps to 2 ms, then x1.15 steps to ~30 s. Percentiles read the bin's upper edge.
EDGES_MS: tuple[float, ...] = tuple(
    [round(0.1 * i, 3) for i in range(1, 21)] + [round(2.0 * 1.15**k, 3) for k in range(1, 70)]
)


# the asked maximum is kept per 100 ms: a `loss` toxic holds some chunk of a busy leg a 200 ms retransmission
# timeout in most seconds, but in few tenths of one, and a request's hop spans a few tenths
ASKED_BUCKETS_PER_S = 10
ASKED_BUCKETS_KEPT = 3600 * ASKED_BUCKETS_PER_S  # at least the last hour, at most two (288 kB a leg)


class LegStats:
    """One direction of one proxy, summed over its connections."""

    __slots__ = (
        "chunks",
        "bytes",
        "asked_s",
        "asked_min_s",
        "asked_max_s",
        "asked_t0",
        "asked_by_s",
        "asked_dropped",
        "error_s",
        "error_max_s",
        "early",
        "hist",
        "shaped_bytes",
        "shaped_ideal_s",
        "shaped_busy_s",
        "rate_kbps",
    )

    def __init__(self) -> None:
        self.chunks = self.bytes = self.early = self.shaped_bytes = 0
        self.asked_s = self.error_s = self.error_max_s = self.shaped_ideal_s = self.shaped_busy_s = 0.0
        self.asked_min_s, self.asked_max_s = float("inf"), 0.0  # the range of what the toxics asked of one chunk
        # the most asked of a chunk written in each 1 / ASKED_BUCKETS_PER_S s of the loop's clock from bucket
        # `asked_t0` on, the last ASKED_BUCKETS_KEPT of them (40 bytes a second), so a request's hop is bounded by
        # what was asked around its own time; `asked_dropped`: older buckets were let go
        self.asked_t0: int | None = None
        self.asked_by_s = array("f")
        self.asked_dropped = False
        self.rate_kbps = 0
        self.hist = [0] * (len(EDGES_MS) + 1)

    def record(self, nbytes: int, asked_s: float, applied_s: float, now_s: float | None = None) -> None:
        """One chunk written: `asked_s` its toxics asked, `applied_s` it took, at `now_s` (the loop's monotonic
        clock; None: not kept by the 100 ms)."""
        if asked_s == float("inf"):  # a 100 % loss held the chunk until its toxic went: that was what it asked
            asked_s = applied_s
        err = applied_s - asked_s
        self.chunks += 1
        self.bytes += nbytes
        self.asked_s += asked_s
        if asked_s < self.asked_min_s:
            self.asked_min_s = asked_s
        if asked_s > self.asked_max_s:
            self.asked_max_s = asked_s
        if now_s is not None:
            bucket = int(now_s * ASKED_BUCKETS_PER_S)
            if self.asked_t0 is None:
                self.asked_t0 = bucket
            i = bucket - self.asked_t0
            by_s = self.asked_by_s
            if i >= len(by_s):
                if i >= 2 * ASKED_BUCKETS_KEPT:  # keep the last hour: drop the oldest, an hour at a time
                    drop = min(i + 1 - ASKED_BUCKETS_KEPT, len(by_s))
                    del by_s[:drop]
                    self.asked_t0 += i + 1 - ASKED_BUCKETS_KEPT
                    self.asked_dropped = True
                    i = ASKED_BUCKETS_KEPT - 1
                by_s.extend([0.0] * (i + 1 - len(by_s)))
            if i >= 0 and asked_s > by_s[i]:
                by_s[i] = asked_s
        if err < 0.0:
            self.early += 1  # a timer may fire up to the loop's clock resolution early
            err = 0.0
        self.error_s += err
        if err > self.error_max_s:
            self.error_max_s = err
        self.hist[bisect_right(EDGES_MS, err * 1e3)] += 1

    def shaped(self, nbytes: int, ideal_s: float, busy_s: float, rate_kbps: int) -> None:
        """A backlogged chunk of `nbytes` that an ideal link of `rate_kbps` sends in `ideal_s` took `busy_s` from the
        previous chunk's departure to its own (only backlogged chunks: an idle link has no rate to measure)."""
        self.shaped_bytes += nbytes
        self.shaped_ideal_s += ideal_s
        self.shaped_busy_s += busy_s
        self.rate_kbps = rate_kbps

    def asked_json(self) -> dict:
        """The most asked of a chunk in each `bucket_s` of the loop's monotonic clock (`GET
        /proxies/{p}/fidelity/asked`): `t0_s` the first kept bucket's start, `asked_ms_max` one value a bucket on;
        `dropped`: buckets before `t0_s` were let go (what was asked then is unknown, not nothing)."""
        return {
            "t0_s": None if self.asked_t0 is None else self.asked_t0 / ASKED_BUCKETS_PER_S,
            "bucket_s": 1.0 / ASKED_BUCKETS_PER_S,
            "dropped": self.asked_dropped,
            "asked_ms_max": [round(x * 1e3, 3) for x in self.asked_by_s],
        }

    def to_json(self) -> dict:
        return {
            "chunks": self.chunks,
            "bytes": self.bytes,
            "asked_ms_sum": round(self.asked_s * 1e3, 3),
            "asked_ms_min": round(self.asked_min_s * 1e3, 3) if self.chunks else None,
            "asked_ms_max": round(self.asked_max_s * 1e3, 3) if self.chunks else None,
            "error_ms_sum": round(self.error_s * 1e3, 3),
            "error_ms_max": round(self.error_max_s * 1e3, 3),
            "early": self.early,
            "hist": list(self.hist),
            "shaped_bytes": self.shaped_bytes,
            "shaped_ideal_s": round(self.shaped_ideal_s, 6),
            "shaped_busy_s": round(self.shaped_busy_s, 6),
            "rate_kbps": self.rate_kbps,
        }


def percentile_ms(hist: list[int], q: float) -> float | None:
    """The q-quantile (0..1) of a histogram over EDGES_MS, as its bin's upper edge (ms); None if empty."""
    total = sum(hist)
    if total <= 0:
        return None
    want = q * total
    seen = 0
    for i, n in enumerate(hist):
        seen += n
        if seen >= want and n:
            return EDGES_MS[i] if i < len(EDGES_MS) else float("inf")
    return EDGES_MS[-1]


def subtract(end: dict, start: dict | None) -> dict:
    """A leg's figures between two snapshots (the measured window without the warmup)."""
    if not start:
        return dict(end)
    out = {}
    for k, v in end.items():
        if k == "hist":
            out[k] = [a - b for a, b in zip(v, start.get(k) or [0] * len(v))]
        elif k in ("error_ms_max", "asked_ms_min", "asked_ms_max", "rate_kbps"):
            out[k] = v  # extremes and a setting do not subtract; the window's range is within the whole run's
        elif isinstance(v, (int, float)):
            out[k] = v - (start.get(k) or 0)
        else:
            out[k] = v
    return out


def add(snapshots: list[dict]) -> dict:
    """One proxy's fidelity snapshot (`GET /proxies/{p}/fidelity`: `edges_ms` and a leg per direction) summed over
    several copies of it: a site's proxies on every node of a cluster run (bench.run.mesh). Counts, sums and
    histograms add; `error_ms_max`, `asked_ms_max` and `rate_kbps` (maxima and a setting) take the largest,
    `asked_ms_min` the smallest."""
    if not snapshots:
        raise ValueError("no fidelity snapshots to add")
    out: dict = {"edges_ms": snapshots[0].get("edges_ms")}
    for direction in [k for k in snapshots[0] if k != "edges_ms"]:
        legs = [s[direction] for s in snapshots if s.get(direction)]
        total: dict = {}
        for leg in legs:
            for k, v in leg.items():
                if k == "hist":
                    prev = total.get(k) or [0] * len(v)
                    total[k] = [a + b for a, b in zip(prev, v)]
                elif k in ("asked_ms_min", "asked_ms_max"):
                    have = [x for x in (total.get(k), v) if x is not None]
                    total[k] = (min if k == "asked_ms_min" else max)(have) if have else None
                elif k in ("error_ms_max", "rate_kbps"):
                    total[k] = max(total.get(k, v), v)
                elif isinstance(v, (int, float)):
                    total[k] = round(total.get(k, 0) + v, 6)
                else:
                    total.setdefault(k, v)
        out[direction] = total
    return out
