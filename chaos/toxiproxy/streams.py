"""The data path of a proxy: each connection's two sockets and the two links that pump its bytes
through their toxics.

    Client <-> client side ══ upstream link (client -> upstream) ══════> upstream side <-> Upstream
                           <═ downstream link (upstream -> client) ════
    link:  source socket -> ChunkQueue -> ToxicStub(toxic 1) -> ... -> Sink -> destination socket
    empty chain (the fast path): source socket -> destination socket, no Chunk, no task

This module owns the connections of every proxy and the stages of their links. Invariants:
- Bytes leave a link in the order they entered it, and every byte that enters leaves unless a
  toxic's purpose is to drop it (timeout, reset_peer, limit_data) or the proxy is disabled or
  deleted (which closes every connection, as a partition does).
- A chain change (add, update, remove a toxic) applies to connections already open, at once, and
  never reorders or drops what the chain holds: a removed toxic flushes its buffered chunks.
- When either side closes, the close travels through the chain behind the data, then the whole
  connection closes (the other direction gets its queued data and then a close).
- All of it runs on one asyncio event loop thread; nothing here blocks.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import struct
from typing import Any

from chaos.toxiproxy.addresses import split_hostport
from chaos.toxiproxy.chains import DOWNSTREAM, UPSTREAM, ToxicWrapper
from chaos.toxiproxy.toxics import NoopToxic
from chaos.toxiproxy.toxics.toxic import RESET, Chunk, ChunkQueue, Meter, Toxic, ToxicStub

log = logging.getLogger("chaos.toxiproxy")

_NOOP = NoopToxic()


class Stage:
    """One toxic of one link: its stub and the task running its pipe (or noop, per toxicity)."""

    __slots__ = ("wrapper", "stub", "task")

    def __init__(self, wrapper: ToxicWrapper, stub: ToxicStub):
        self.wrapper, self.stub, self.task = wrapper, stub, None

    def start(self) -> None:
        # Toxicity is drawn once per run of the stage: per connection and direction, redrawn when
        # the toxic is updated or its neighbour in the chain changes (as Toxiproxy does).
        toxic = self.wrapper.toxic if random.random() < self.wrapper.toxicity else _NOOP
        self.task = asyncio.get_running_loop().create_task(self._run(toxic))

    async def _run(self, toxic: Toxic) -> None:
        try:
            await toxic.pipe(self.stub)
        except asyncio.CancelledError:
            pass
        except Exception:  # a toxic bug closes its connection, never the proxy
            log.exception("toxic %s (%s) failed; closing its connection", self.wrapper.name, self.wrapper.type)
            self.stub.close()

    async def interrupt(self) -> bool:
        """Stop the running toxic (it forwards what it holds). False if the stage already ended."""
        task = self.task
        if task is None or task.done():
            return False
        task.cancel()
        await asyncio.wait({task})
        return True

    async def restart(self) -> None:
        if await self.interrupt():
            self.start()


class Sink:
    """The end of a link: writes chunks to the destination socket; None closes, RESET resets."""

    __slots__ = ("link", "closed")

    def __init__(self, link: Link):
        self.link, self.closed = link, False

    def put(self, item) -> None:
        if self.closed:
            return  # the link is closing: later chunks have nowhere to go
        if item is None:
            self.closed = True
            self.link.conn.close_side(self.link.dest)
        elif item is RESET:
            self.closed = True
            self.link.conn.reset()
        else:
            self.link.dest.write(item.data)
            now = self.link.conn.loop.time()
            self.link.leg.record(len(item.data), item.asked, now - item.born, now)


class Link:
    """One direction of one connection: source side -> stages -> sink -> destination side."""

    __slots__ = ("conn", "direction", "source", "dest", "meter", "sink", "stages", "entry", "eof", "_pauses", "leg")

    def __init__(self, conn: Connection, direction: str, source: _Side, dest: _Side):
        self.conn, self.direction, self.source, self.dest = conn, direction, source, dest
        self.leg = conn.proxy.legs[direction]  # chunks through toxics record what the link applied
        self.meter = Meter(on_high=lambda: self.pause("chain"), on_low=lambda: self.resume("chain"))
        self.sink = Sink(self)
        self.stages: list[Stage] = []
        self.entry: Any = self.sink  # where the source's reads go: the first stage or the sink
        self.eof = False
        self._pauses: set[str] = set()

    # data in

    def feed(self, data: bytes) -> None:
        entry = self.entry
        if entry is self.sink:
            if not entry.closed:
                self.dest.write(data)  # fast path: empty chain, no per-chunk machinery
        else:
            entry.put(Chunk(data, self.conn.loop.time()))

    def feed_eof(self) -> None:
        if not self.eof:
            self.eof = True
            self.entry.put(None)

    # flow control: the source is paused while the chain holds too much or the destination is full

    def pause(self, reason: str) -> None:
        if not self._pauses:
            self.source.pause_reading()
        self._pauses.add(reason)

    def resume(self, reason: str) -> None:
        if reason in self._pauses:
            self._pauses.discard(reason)
            if not self._pauses:
                self.source.resume_reading()

    # chain changes (called with the API lock held)

    def _new_stage(self, wrapper: ToxicWrapper, output) -> Stage:
        stub = ToxicStub(ChunkQueue(self.meter), output, wrapper.toxic.new_state(), self.leg)
        return Stage(wrapper, stub)

    def build(self, chain: list[ToxicWrapper]) -> None:
        """Set up the stages of a new link, in chain order, and start them."""
        out: Any = self.sink
        stages = []
        for wrapper in reversed(chain):
            stage = self._new_stage(wrapper, out)
            stages.append(stage)
            out = stage.stub.input
        self.stages = stages[::-1]
        self.entry = out
        for stage in self.stages:
            stage.start()

    async def add(self, wrapper: ToxicWrapper) -> None:
        stage = self._new_stage(wrapper, self.sink)
        prev = self.stages[-1] if self.stages else None
        # Re-pointing the last output is atomic on the loop: chunks sent before it already reached
        # the sink, chunks sent after it go through the new toxic. Nothing is reordered.
        if prev is None:
            self.entry = stage.stub.input
        else:
            prev.stub.output = stage.stub.input
        self.stages.append(stage)
        stage.start()
        if prev is not None:
            await prev.restart()

    async def update(self, wrapper: ToxicWrapper) -> None:
        for stage in self.stages:
            if stage.wrapper is wrapper:
                await stage.restart()
                return

    async def remove(self, wrapper: ToxicWrapper) -> None:
        index = next((i for i, s in enumerate(self.stages) if s.wrapper is wrapper), None)
        if index is None:
            return
        stage = self.stages[index]
        if await stage.interrupt():
            wrapper.toxic.cleanup(stage.stub)
        # What the removed toxic had not taken yet follows what it already sent: flush it, in order,
        # then splice the stage out (no await between the two: the splice is atomic on the loop).
        out = stage.stub.output
        for item in stage.stub.input.drain():
            if not stage.stub.closed:
                out.put(item)
        if index == 0:
            self.entry = out
        else:
            self.stages[index - 1].stub.output = out
        del self.stages[index]
        if index > 0:
            await self.stages[index - 1].restart()

    def cancel(self) -> None:
        for stage in self.stages:
            if stage.task is not None:
                stage.task.cancel()


READ_SIZE = 64 << 10  # bytes one socket read may take: the most a chunk holds


class _Side(asyncio.BufferedProtocol):
    """One socket of a connection. Reads feed one link; the other link writes to it.

    Reads land in this side's own buffer and leave it as an exact-size `bytes`: asyncio's plain Protocol
    allocates 256 KiB for every read and shrinks it, and glibc, its mmap threshold raised by the first
    such free, serves those from the heap and keeps the holes; a 52-robot soak's proxy grew 5-8 % that way
    (measured; gone with MALLOC_MMAP_THRESHOLD_ set, and with this buffer).
    """

    __slots__ = ("conn", "transport", "feeds", "drains", "lost", "closing", "_buffer", "early")

    def __init__(self, conn: Connection):
        self.conn = conn
        self.transport: asyncio.Transport | None = None
        self.feeds: Link | None = None
        self.drains: Link | None = None
        self.lost = False
        self.closing = False
        self._buffer: memoryview | None = None
        # bytes read before the links exist (uvloop reads a socket whose connection_made paused it): fed first
        self.early: list[bytes | None] = []  # None: the peer's EOF

    def connection_made(self, transport) -> None:
        self.transport = transport

    def release(self) -> None:
        """Drop the read buffer (the connection is over; a late read would allocate a new one)."""
        self._buffer = None

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._buffer is None:
            self._buffer = memoryview(bytearray(READ_SIZE))
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        # a copy: the buffer is reused by the next read, and chunks and transport buffers outlive it
        data = bytes(self._buffer[:nbytes])
        if self.feeds is None:  # read before the upstream answered (uvloop): kept, in order, for the link
            self.early.append(data)
            self.transport.pause_reading()
        else:
            self.feeds.feed(data)

    def eof_received(self) -> bool:
        if self.feeds is not None:
            self.feeds.feed_eof()
        else:  # before the links exist: the close follows the early bytes
            self.early.append(None)
        return True  # keep our write half open: the other direction may still be delivering

    def connection_lost(self, exc) -> None:
        self.lost = True
        if self.feeds is not None:
            self.feeds.feed_eof()
        self.conn.side_lost(self)

    def pause_writing(self) -> None:
        if self.drains is not None:
            self.drains.pause("dest")

    def resume_writing(self) -> None:
        if self.drains is not None:
            self.drains.resume("dest")

    # used by links

    def write(self, data: bytes) -> None:
        if not self.closing:
            self.transport.write(data)

    def pause_reading(self) -> None:
        if not self.lost and not self.closing:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if not self.lost and not self.closing:
            self.transport.resume_reading()


class _ClientSide(_Side):
    """The accepted socket: once accepted, its connection dials the upstream."""

    __slots__ = ()

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.conn.accepted()


class Connection:
    """A client connection and its upstream connection, joined by two links."""

    __slots__ = ("proxy", "loop", "client", "upstream", "links", "closed")

    def __init__(self, proxy):  # the chaos.toxiproxy.proxy.Proxy that accepted it
        self.proxy = proxy
        self.loop = asyncio.get_running_loop()
        self.client = _ClientSide(self)
        self.upstream: _Side | None = None
        self.links: dict[str, Link] = {}
        self.closed = False

    def accepted(self) -> None:
        """Called once the client socket is accepted: dial the upstream, then start both links."""
        self.client.transport.pause_reading()  # bytes wait in the kernel until the upstream answers
        self.proxy.connections.add(self)
        self.loop.create_task(self._dial())

    async def _dial(self) -> None:
        host, port = split_hostport(self.proxy.upstream)
        try:
            _, side = await self.loop.create_connection(lambda: _Side(self), host, port)
        except (OSError, ValueError) as exc:
            log.warning(
                "proxy %s: unable to open connection to upstream %s: %s", self.proxy.name, self.proxy.upstream, exc
            )
            self.abort()
            return
        self.upstream = side
        if self.closed or self.client.lost:
            self.abort()
            return
        up = Link(self, UPSTREAM, self.client, side)
        down = Link(self, DOWNSTREAM, side, self.client)
        self.links = {UPSTREAM: up, DOWNSTREAM: down}
        self.client.feeds, self.client.drains = up, down
        side.feeds, side.drains = down, up
        chains = self.proxy.toxics.chains
        up.build(list(chains[UPSTREAM]))
        down.build(list(chains[DOWNSTREAM]))
        early, self.client.early = self.client.early, []
        for data in early:
            up.feed(data) if data is not None else up.feed_eof()
        self.client.transport.resume_reading()

    def close_side(self, side: _Side) -> None:
        """A link delivered its close: close that socket after its queued bytes are written."""
        if not side.closing and not side.lost:
            side.closing = True
            side.transport.close()

    def reset(self) -> None:
        """Reset both sockets: SO_LINGER 0 makes close() send RST, so peers see ECONNRESET."""
        for side in (self.client, self.upstream):
            if side is None or side.lost:
                continue
            sock = side.transport.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
            side.closing = True
            side.transport.abort()
        self._finish()

    def abort(self) -> None:
        """Close both sockets now, dropping whatever the chains hold (disable, delete, relisten)."""
        for side in (self.client, self.upstream):
            if side is not None and side.transport is not None and not side.lost:
                side.closing = True
                side.transport.abort()
        self._finish()

    def side_lost(self, side: _Side) -> None:
        if self.client.lost and (self.upstream is None or self.upstream.lost):
            self._finish()

    def _finish(self) -> None:
        if not self.closed:
            self.closed = True
            for link in self.links.values():
                link.cancel()
            self.proxy.connections.discard(self)
            # A connection is a reference cycle (sides <-> links <-> sink, meter callbacks) that only the
            # cyclic GC frees, and a connection that lived long sits in its oldest generation, collected
            # rarely: give the read buffers back now, so a partition's dead connections do not hold
            # 64 KiB per socket until then (measured: +1.7 MB RSS per heal of 13 robots, every heal).
            for side in (self.client, self.upstream):
                if side is not None:
                    side.release()
