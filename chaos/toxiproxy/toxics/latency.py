"""`latency`: each chunk leaves `latency` +/- `jitter` ms after it was read, never reordered.

Attributes (ms, integers): `latency`, `jitter`. The delay of a chunk is latency + uniform
[-jitter, +jitter), minus the time the chunk already spent in the link (so a chain of toxics does
not add the time spent upstream of this one twice, as in Toxiproxy). Chunks are handled one at a
time, so jitter can make a chunk wait for the one before it but never overtake it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

from chaos.toxiproxy.toxics.toxic import Toxic, ToxicStub, sleep_or_flush


@dataclass
class LatencyToxic(Toxic):
    type_name: ClassVar[str] = "latency"
    latency: int = 0
    jitter: int = 0

    def delay_s(self, rng: random.Random | None = None) -> float:
        delay = self.latency
        if self.jitter > 0:
            delay += (rng or random).randrange(-self.jitter, self.jitter)
        return delay / 1000.0

    async def pipe(self, stub: ToxicStub) -> None:
        free = 0.0  # when the chunk before left, on an ideal link (jitter never lets a chunk overtake it)
        while True:
            chunk = await stub.recv()
            if chunk is None:
                stub.close()
                return
            delay = self.delay_s()
            # what the profile asked of this chunk; the sink compares what the link applied (fidelity)
            free = max(chunk.born + chunk.asked + delay, free)
            chunk.asked = free - chunk.born
            sleep = delay - (stub.now() - chunk.timestamp)
            await sleep_or_flush(stub, sleep, chunk)
            chunk.timestamp += sleep
            stub.send(chunk)
