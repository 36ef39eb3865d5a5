"""`loss`: packet loss as TCP shows it to the application: nothing is lost, the stream stalls.

The model (ours; Toxiproxy has no such toxic). TCP retransmits a lost segment after its
retransmission timeout (RTO) and doubles the RTO each time the retransmission is lost too; the
bytes behind it wait (in-order delivery, head-of-line blocking). So, per chunk:

- the chunk spans k = ceil(len / segment_size) segments (segment_size 0 = the chunk is one unit);
  its first transmission is lost with probability 1 - (1 - probability)^k;
- while lost, the chunk (and everything behind it) is held for the current RTO, starting at
  `rto_ms` and doubling on each consecutive loss, capped at `max_rto_ms`; each retransmission is
  one segment, lost again with `probability`;
- a delivery resets the RTO to `rto_ms` (a valid ACK resets the backoff).

Attributes: `probability` (0..1, float), `rto_ms` (initial RTO, default 200: Linux's minimum),
`max_rto_ms` (default 60000), `segment_size` (bytes, default 1460). It models the RTO path only:
fast retransmit (which recovers in about one RTT when more data follows the loss) is not modelled,
which is the right worst case for the sparse, small messages of a control loop.

On the real Toxiproxy (no `loss` toxic) `loss_fallback()` maps a loss toxic to the `latency`
toxic with the same mean and standard deviation of added delay; see docs/chaos.md.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import ClassVar

from chaos.toxiproxy.toxics.toxic import Toxic, ToxicStub, sleep_or_flush


class LossState:
    """Per connection and direction: what the toxic did, for tests and logs."""

    __slots__ = ("chunks", "lost_transmissions", "held_s")

    def __init__(self):
        self.chunks = 0
        self.lost_transmissions = 0
        self.held_s = 0.0


@dataclass
class LossToxic(Toxic):
    type_name: ClassVar[str] = "loss"
    probability: float = 0.0
    rto_ms: int = 200
    max_rto_ms: int = 60000
    segment_size: int = 1460

    def new_state(self) -> LossState:
        return LossState()

    def first_loss_probability(self, nbytes: int) -> float:
        p = min(max(self.probability, 0.0), 1.0)
        if self.segment_size <= 0:
            return p
        segments = max(1, math.ceil(nbytes / self.segment_size))
        return 1.0 - (1.0 - p) ** segments

    def hold_times_s(self, nbytes: int, rng: random.Random | None = None) -> list[float]:
        """The RTO waits one chunk goes through before it is delivered (empty: not lost)."""
        rng = rng or random
        p = min(max(self.probability, 0.0), 1.0)
        rto = max(self.rto_ms, 0) / 1000.0
        cap = max(self.max_rto_ms, self.rto_ms, 0) / 1000.0
        if p >= 1.0:
            return [math.inf]  # every retransmission is lost: the stream stalls for good
        waits: list[float] = []
        lost = rng.random() < self.first_loss_probability(nbytes)
        while lost:
            waits.append(min(rto, cap))
            rto = min(rto * 2, cap)
            lost = rng.random() < p
        return waits

    async def pipe(self, stub: ToxicStub) -> None:
        state: LossState = stub.state
        free = 0.0  # when the chunk before left an ideal link: a held chunk holds the ones behind it, as TCP does
        while True:
            chunk = await stub.recv()
            if chunk is None:
                stub.close()
                return
            state.chunks += 1
            waits = self.hold_times_s(len(chunk.data))
            free = max(chunk.born + chunk.asked, free) + sum(waits)
            chunk.asked = free - chunk.born
            for wait in waits:
                state.lost_transmissions += 1
                state.held_s += wait
                await sleep_or_flush(stub, wait, chunk)
            stub.send(chunk)


def delay_moments_ms(
    probability: float, rto_ms: float = 200, max_rto_ms: float = 60000, segments: int = 1
) -> tuple[float, float]:
    """Mean and standard deviation of the delay (ms) the model adds to one chunk."""
    p = min(max(probability, 0.0), 1.0)
    if p <= 0:
        return 0.0, 0.0
    if p >= 1:
        return math.inf, 0.0
    p_first = 1.0 - (1.0 - p) ** max(segments, 1)
    mean = second = 0.0
    prob_lost_n = p_first  # P(at least n losses), n = 1, 2, ...
    total, rto = 0.0, float(rto_ms)
    for _ in range(200):
        total += min(rto, max_rto_ms)
        rto = min(rto * 2, max_rto_ms)
        prob_exactly = prob_lost_n * (1.0 - p)
        mean += prob_exactly * total
        second += prob_exactly * total * total
        prob_lost_n *= p
        if prob_lost_n < 1e-15:
            break
    return mean, math.sqrt(max(second - mean * mean, 0.0))


def loss_fallback(toxic: dict) -> dict:
    """Map a `loss` toxic (Toxiproxy JSON shape) to the closest `latency` toxic.

    Matches the mean and the standard deviation of the added delay: latency = mean, jitter = std
    * sqrt(3) (a uniform [-j, j) has std j / sqrt(3)). The heavy tail (a rare chunk waits a whole
    RTO) becomes a spread of small delays on every chunk: the fallback is a stand-in, not the
    same fault. Name, stream and toxicity are kept.
    """
    attrs = dict(toxic.get("attributes") or {})
    default = LossToxic()
    mean, std = delay_moments_ms(
        float(attrs.get("probability", default.probability)),
        float(attrs.get("rto_ms", default.rto_ms)),
        float(attrs.get("max_rto_ms", default.max_rto_ms)),
    )
    if math.isinf(mean):
        mean, std = float(attrs.get("max_rto_ms", default.max_rto_ms)), 0.0
    out = {k: v for k, v in toxic.items() if k not in ("type", "attributes")}
    out["type"] = "latency"
    out["attributes"] = {"latency": int(round(mean)), "jitter": int(round(std * math.sqrt(3)))}
    return out
