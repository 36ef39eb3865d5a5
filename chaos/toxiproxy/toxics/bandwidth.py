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
        free = 0.0  # when an ideal link of this rate finishes what it was given (loop time)
        last_sent = 0.0
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
            t_in = stub.now()
            data, ts, born = chunk.data, chunk.timestamp, chunk.born
            per_byte = 1.0 / (rate * 1000.0)
            # the ideal link: the chunk starts when it arrives as asked upstream or when the link frees up
            ideal = max(born + chunk.asked, free)
            free = ideal + len(data) * per_byte
            debt += len(data) * per_byte
            step = rate * 100  # bytes per 100 ms
            n = len(data)
            while len(data) > step:
                await sleep_or_flush(stub, 0.1, Chunk(data, ts, born, free - born))
                ideal += step * per_byte
                stub.send(Chunk(data[:step], ts, born, ideal - born))
                data = data[step:]
                debt -= 0.1
            start = stub.now()
            rest = Chunk(data, ts, born, free - born)
            await sleep_or_flush(stub, debt, rest)
            now = stub.now()
            debt -= now - start
            stub.send(rest)
            if stub.leg is not None and (t_in <= last_sent + 1e-4 or n > step):
                # backlogged (it waited for the chunk before, or it alone fills 100 ms of the link): the link was
                # busy, so its rate is measurable; an idle link's small chunk mostly measures the loop's wake-up
                stub.leg.shaped(n, n * per_byte, now - max(t_in, last_sent), rate)
            last_sent = now
