"""The toxic contract: one `Toxic` per fault type, run on a `ToxicStub` per connection direction.

              Toxic
                v
  Client <-> ToxicStub <-> Upstream

A link (one direction of one connection) is a chain of stubs joined by `ChunkQueue`s; each stub
runs its toxic's `pipe()` as one asyncio task that takes chunks from `stub.input` and hands them
to `stub.output` (the next stub's queue, or the sink that writes the destination socket). A
toxic is a dataclass of its JSON attributes (the same words as Toxiproxy's) plus `pipe()`; the
same instance serves every connection, per-connection state lives on the stub (`new_state`).

Invariants kept here:
- A chunk handed to a stub leaves it exactly once, in order, unless the toxic's purpose is to
  drop it (timeout, reset_peer, limit_data). `send()` never blocks, so a toxic interrupted
  (task cancelled) while holding a chunk forwards it before it exits: no data on the floor.
- `None` on a queue is end of stream; `RESET` asks the sink to reset (RST) the connection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

RESET = object()  # sentinel: the sink resets the whole connection instead of closing it


class Chunk:
    """One socket read (or a slice of one) and the loop time it was read.

    `timestamp` moves as toxics hold the chunk; `born` stays the read time and `asked` sums the delay
    the toxics intended, so the sink can measure what the link really applied (chaos.toxiproxy.fidelity)."""

    __slots__ = ("data", "timestamp", "born", "asked")

    def __init__(self, data: bytes, timestamp: float, born: float | None = None, asked: float = 0.0):
        self.data = data
        self.timestamp = timestamp
        self.born = timestamp if born is None else born
        self.asked = asked

    def __repr__(self) -> str:
        return f"Chunk({len(self.data)}B @ {self.timestamp:.6f})"


class Meter:
    """Bytes queued inside one link; tells the link when to pause and resume reading its source."""

    __slots__ = ("nbytes", "high", "low", "on_high", "on_low", "_paused")

    def __init__(self, high: int = 4 << 20, low: int = 1 << 20, on_high=None, on_low=None):
        self.nbytes = 0
        self.high, self.low = high, low
        self.on_high, self.on_low = on_high, on_low
        self._paused = False

    def add(self, n: int) -> None:
        self.nbytes += n
        if not self._paused and self.nbytes > self.high:
            self._paused = True
            if self.on_high:
                self.on_high()

    def sub(self, n: int) -> None:
        self.nbytes -= n
        if self._paused and self.nbytes <= self.low:
            self._paused = False
            if self.on_low:
                self.on_low()


class ChunkQueue:
    """Unbounded FIFO between two stages: `put` never blocks, `get` awaits.

    Invariant: every item put is returned by exactly one `get` (or `drain`), in put order, even
    when a waiting `get` is cancelled (cancellation happens before an item is taken).
    """

    __slots__ = ("_items", "_waiter", "meter")

    def __init__(self, meter: Meter | None = None):
        self._items: deque = deque()
        self._waiter: asyncio.Future | None = None
        self.meter = meter

    def put(self, item) -> None:
        self._items.append(item)
        if self.meter is not None and isinstance(item, Chunk):
            self.meter.add(len(item.data))
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _take(self):
        item = self._items.popleft()
        if self.meter is not None and isinstance(item, Chunk):
            self.meter.sub(len(item.data))
        return item

    async def get(self):
        while not self._items:
            w = asyncio.get_running_loop().create_future()
            self._waiter = w
            try:
                await w
            finally:
                self._waiter = None
        return self._take()

    def get_nowait(self):
        if not self._items:
            raise IndexError("queue is empty")
        return self._take()

    def drain(self) -> list:
        """Take every queued item (in order) without waiting."""
        out = []
        while self._items:
            out.append(self._take())
        return out

    def __len__(self) -> int:
        return len(self._items)


class ToxicStub:
    """Where a toxic runs for one connection direction: its input queue, output and state."""

    __slots__ = ("input", "output", "state", "closed", "loop", "leg")

    def __init__(self, input: ChunkQueue, output, state: Any = None, leg: Any = None):
        self.input = input
        self.output = output  # a ChunkQueue or the link's sink: anything with put()
        self.state = state
        self.leg = leg  # the link direction's chaos.toxiproxy.fidelity.LegStats, or None
        self.closed = False
        self.loop = asyncio.get_event_loop()

    async def recv(self) -> Chunk | None:
        """The next chunk, or None at end of stream."""
        return await self.input.get()

    def send(self, chunk: Chunk) -> None:
        if not self.closed:
            self.output.put(chunk)

    def close(self) -> None:
        """End of stream downstream of this stub: the destination is closed once it is reached."""
        if not self.closed:
            self.closed = True
            self.output.put(None)

    def reset(self) -> None:
        """Reset the connection (RST to both peers) once this reaches the sink."""
        if not self.closed:
            self.closed = True
            self.output.put(RESET)

    def now(self) -> float:
        return self.loop.time()


class BadAttribute(ValueError):
    """An attribute has the wrong JSON type; the message reads like Toxiproxy's."""


INT64 = range(-(2**63), 2**63)  # Go's int64: every integer attribute fits it, so no toxic's arithmetic overflows


class BigInt:
    """An integer literal of a request body beyond int64, kept as its text: Python would convert a long one in
    quadratic time (and refuses one over 4300 digits). No field takes it; errors quote it, as Go's do."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


@dataclass
class Toxic:
    """Base of every toxic. Subclasses are dataclasses whose fields are the JSON attributes."""

    type_name: ClassVar[str] = ""

    async def pipe(self, stub: ToxicStub) -> None:
        """Move chunks from stub.input to stub.output until end of stream; see module invariants."""
        while True:
            chunk = await stub.recv()
            if chunk is None:
                stub.close()
                return
            stub.send(chunk)

    def new_state(self) -> Any:
        """Per-connection state kept on the stub for as long as the toxic is in the chain."""
        return None

    def cleanup(self, stub: ToxicStub) -> None:
        """Called on each stub when the toxic is removed, after its task stopped."""

    # --- JSON ---------------------------------------------------------------------------------

    def attributes(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def update_attributes(self, raw: Any) -> None:
        """Merge JSON attributes (unknown keys ignored, as Toxiproxy does); raise on wrong types."""
        if raw is None:
            return
        if not isinstance(raw, dict):
            raise BadAttribute(
                f"json: cannot unmarshal {_json_kind(raw)} into Go struct field "
                f"ToxicWrapper.attributes of type {type(self).__name__}"
            )
        values = {}
        for f in dataclasses.fields(self):
            if f.name not in raw or raw[f.name] is None:
                continue
            v = raw[f.name]
            kind = f.type if isinstance(f.type, str) else f.type.__name__
            if kind == "int":
                if isinstance(v, bool) or not isinstance(v, int) or v not in INT64:
                    raise BadAttribute(
                        f"json: cannot unmarshal {_json_kind(v)} into Go struct field "
                        f"{type(self).__name__}.attributes.{f.name} of type int64"
                    )
            elif kind == "float":
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise BadAttribute(
                        f"json: cannot unmarshal {_json_kind(v)} into Go struct field "
                        f"{type(self).__name__}.attributes.{f.name} of type float64"
                    )
                v = float(v)
            values[f.name] = v
        for k, v in values.items():  # all or nothing: a bad value leaves the toxic untouched
            setattr(self, k, v)

    @classmethod
    def attribute_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))


def _json_kind(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "number"
    if isinstance(v, float):
        return f"number {v}"
    if isinstance(v, BigInt):
        return f"number {v.text}"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return "null"


async def sleep_or_flush(stub: ToxicStub, seconds: float, held: Chunk) -> None:
    """Sleep while holding `held`; if interrupted, forward it first (never drop data on the floor)."""
    if seconds <= 0:
        return
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        stub.send(held)
        raise
