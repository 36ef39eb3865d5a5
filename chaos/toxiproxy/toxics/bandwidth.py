"""`bandwidth`: chunks leave at no more than `rate` KB/s (1 KB = 1000 bytes); rate <= 0 = unlimited.

Each chunk costs len/rate seconds; the cost is slept before the chunk leaves, and the sleep's
overshoot is credited to the next chunk so the long-run rate is exact. A chunk larger than 100 ms
worth of bytes leaves in 100 ms slices (as in Toxiproxy), so a slow link still trickles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from chaos.toxiproxy.toxics.toxic import Chunk, Toxic, ToxicStub, sleep_or_flush


@dataclass
class BandwidthToxic(Toxic):
    type_name: ClassVar[str] = "bandwidth"
    rate: int = 0

    async def pipe(self, stub: ToxicStub) -> None:
        debt = 0.0  # seconds this stage owes the link; negative = overslept, credited
        while True:
            chunk = await stub.recv()
            if chunk is None:
                stub.close()
                return
            rate = self.rate
            if rate <= 0:
                debt = 0.0
                stub.send(chunk)
                continue
            data, ts = chunk.data, chunk.timestamp
            debt += len(data) / (rate * 1000.0)
            step = rate * 100  # bytes per 100 ms
            while len(data) > step:
                await sleep_or_flush(stub, 0.1, Chunk(data, ts))
                stub.send(Chunk(data[:step], ts))
                data = data[step:]
                debt -= 0.1
            start = stub.now()
            rest = Chunk(data, ts)
            await sleep_or_flush(stub, debt, rest)
            debt -= stub.now() - start
            stub.send(rest)
