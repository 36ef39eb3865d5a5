"""`timeout`: a silent link. Drops every chunk; closes `timeout` ms after the last chunk (0 = never).

Removing the toxic closes the connections it held (as Toxiproxy does): the peer would otherwise
resume mid-stream after bytes were dropped.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import ClassVar

from chaos.toxiproxy.toxics.toxic import Toxic, ToxicStub


@dataclass
class TimeoutToxic(Toxic):
    type_name: ClassVar[str] = "timeout"
    timeout: int = 0

    async def pipe(self, stub: ToxicStub) -> None:
        while True:
            if self.timeout > 0:
                try:
                    chunk = await asyncio.wait_for(stub.recv(), self.timeout / 1000.0)
                except TimeoutError:
                    stub.close()
                    return
            else:
                chunk = await stub.recv()
            if chunk is None:
                stub.close()
                return
            # The chunk is dropped: losing data is this toxic's purpose.

    def cleanup(self, stub: ToxicStub) -> None:
        stub.close()
