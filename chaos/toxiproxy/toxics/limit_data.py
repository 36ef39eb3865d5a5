"""`limit_data`: per connection and direction, pass `bytes` bytes, then close the connection.

The count survives updates of the toxic (it is per-connection state on the stub); the chunk that
crosses the limit is cut at the limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from chaos.toxiproxy.toxics.toxic import Chunk, Toxic, ToxicStub


class LimitDataState:
    __slots__ = ("transmitted",)

    def __init__(self):
        self.transmitted = 0


@dataclass
class LimitDataToxic(Toxic):
    type_name: ClassVar[str] = "limit_data"
    bytes: int = 0

    def new_state(self) -> LimitDataState:
        return LimitDataState()

    async def pipe(self, stub: ToxicStub) -> None:
        state: LimitDataState = stub.state
        while True:
            chunk = await stub.recv()
            if chunk is None:
                stub.close()
                return
            remaining = max(self.bytes - state.transmitted, 0)
            if remaining < len(chunk.data):
                chunk = Chunk(chunk.data[:remaining], chunk.timestamp, chunk.born, chunk.asked)
            if chunk.data:
                stub.send(chunk)
                state.transmitted += len(chunk.data)
            if self.bytes - state.transmitted <= 0:
                stub.close()
                return
