"""`slicer`: splits each chunk into pieces of about `average_size` +/- `size_variation` bytes, sleeping
`delay` MICROseconds after each piece (Toxiproxy's units). Bytes and their order are untouched.

Pieces are cut by halving around the middle (with the variation) until a piece is within the
variation of the average, so no end of a chunk tends to get a tiny piece. Guard beyond
Toxiproxy: `average_size` <= 0 leaves chunks whole (Toxiproxy would recurse forever).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import ClassVar

from chaos.toxiproxy.toxics.toxic import Chunk, Toxic, ToxicStub


@dataclass
class SlicerToxic(Toxic):
    type_name: ClassVar[str] = "slicer"
    average_size: int = 0
    size_variation: int = 0
    delay: int = 0

    def offsets(self, size: int, rng: random.Random | None = None) -> list[tuple[int, int]]:
        """[(start, end), ...] covering range(size) in order."""
        if size <= 0:
            return []
        if self.average_size <= 0:
            return [(0, size)]
        rng = rng or random
        avg, var = self.average_size, max(self.size_variation, 0)
        out: list[tuple[int, int]] = []
        stack = [(0, size)]
        while stack:  # depth-first, right half pushed first: pieces come out in order
            start, end = stack.pop()
            if (end - start) - avg <= var or end - start <= 1:
                out.append((start, end))
                continue
            mid = start + (end - start) // 2
            if var > 0:
                mid += rng.randrange(-var, var)
            mid = min(max(mid, start + 1), end - 1)
            stack.append((mid, end))
            stack.append((start, mid))
        return out

    async def pipe(self, stub: ToxicStub) -> None:
        while True:
            chunk = await stub.recv()
            if chunk is None:
                stub.close()
                return
            data, ts, asked = chunk.data, chunk.timestamp, chunk.asked
            for start, end in self.offsets(len(data)):
                stub.send(Chunk(data[start:end], ts, chunk.born, asked))
                asked += max(self.delay, 0) / 1e6  # the next slice is meant to wait this much more
                try:
                    await asyncio.sleep(max(self.delay, 0) / 1e6)
                except asyncio.CancelledError:
                    if end < len(data):
                        stub.send(Chunk(data[end:], ts, chunk.born, asked))  # never drop data on the floor
                    raise
