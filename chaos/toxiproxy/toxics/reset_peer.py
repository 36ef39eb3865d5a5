"""`reset_peer`: on the first chunk (or end of stream), wait `timeout` ms, then reset the connection.

The reset is a TCP RST to both peers (SO_LINGER 0 then close), so a reader sees ECONNRESET.
Data after the trigger is dropped: the connection is being torn down. If the toxic is removed
while waiting, the reset happens at once (once triggered, a reset is never called off).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import ClassVar

from chaos.toxiproxy.toxics.toxic import Toxic, ToxicStub


@dataclass
class ResetPeerToxic(Toxic):
    type_name: ClassVar[str] = "reset_peer"
    timeout: int = 0

    async def pipe(self, stub: ToxicStub) -> None:
        await stub.recv()
        try:
            await asyncio.sleep(max(self.timeout, 0) / 1000.0)
        finally:
            stub.reset()
