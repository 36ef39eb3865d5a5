"""`slow_close`: data passes untouched; the close that follows it is held `delay` ms.

If the toxic is removed or updated while it holds a close, the close goes on at once (Toxiproxy
would lose it and leave the connection open).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import ClassVar

from chaos.toxiproxy.toxics.toxic import Toxic, ToxicStub


@dataclass
class SlowCloseToxic(Toxic):
    type_name: ClassVar[str] = "slow_close"
    delay: int = 0

    async def pipe(self, stub: ToxicStub) -> None:
        while True:
            chunk = await stub.recv()
            if chunk is None:
                try:
                    await asyncio.sleep(max(self.delay, 0) / 1000.0)
                finally:
                    stub.close()  # interrupted or not, the close is never lost
                return
            stub.send(chunk)
