"""Proxies: accept clients, dial the upstream, run each direction through its chain of toxics.

    Client <-> client side ══ upstream link (client -> upstream) ══════> upstream side <-> Upstream
                           <═ downstream link (upstream -> client) ════
    link:  source socket -> ChunkQueue -> ToxicStub(toxic 1) -> ... -> Sink -> destination socket
    empty chain (the fast path): source socket -> destination socket, no Chunk, no task

This module owns the connections of every proxy and the toxic chains of their links. Invariants:
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
import os
import random
import socket
import struct
from typing import Any

from chaos.toxiproxy.fidelity import EDGES_MS, LegStats
from chaos.toxiproxy.toxics import REGISTRY, NoopToxic
from chaos.toxiproxy.toxics.toxic import RESET, Chunk, ChunkQueue, Meter, Toxic, ToxicStub

log = logging.getLogger("chaos.toxiproxy")

UPSTREAM, DOWNSTREAM = "upstream", "downstream"
DIRECTIONS = (UPSTREAM, DOWNSTREAM)  # also the order of GET /proxies/{p}/toxics
_NOOP = NoopToxic()


class ProxyError(Exception):
    """A failure with an HTTP status, worded like Toxiproxy's errors."""

    def __init__(self, message: str, status: int = 500):
        super().__init__(message)
        self.message, self.status = message, status


class AlreadyStarted(Exception):
    pass


# --- toxics as the API sees them -------------------------------------------------------------


class ToxicWrapper:
    """A toxic in a proxy's chain: name, type, stream, toxicity and the attributes object."""

    __slots__ = ("name", "type", "stream", "direction", "toxicity", "toxic")

    def __init__(self, name: str, type: str, stream: str, toxicity: float, toxic: Toxic):
        self.name, self.type, self.stream, self.toxicity, self.toxic = name, type, stream, toxicity, toxic
        self.direction = stream.lower()

    def to_json(self) -> dict:
        return {"attributes": self.toxic.attributes(), "name": self.name, "type": self.type,
                "stream": self.stream, "toxicity": self.toxicity}


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

    def __init__(self, link: "Link"):
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

    def __init__(self, conn: "Connection", direction: str, source: "_Side", dest: "_Side"):
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


# --- connections -----------------------------------------------------------------------------


READ_SIZE = 64 << 10  # bytes one socket read may take: the most a chunk holds


class _Side(asyncio.BufferedProtocol):
    """One socket of a connection. Reads feed one link; the other link writes to it.

    Reads land in this side's own buffer and leave it as an exact-size `bytes`: asyncio's plain Protocol
    allocates 256 KiB for every read and shrinks it, and glibc, its mmap threshold raised by the first
    such free, serves those from the heap and keeps the holes; a 52-robot soak's proxy grew 5-8 % that way
    (measured; gone with MALLOC_MMAP_THRESHOLD_ set, and with this buffer).
    """

    __slots__ = ("conn", "transport", "feeds", "drains", "lost", "closing", "_buffer")

    def __init__(self, conn: "Connection"):
        self.conn = conn
        self.transport: asyncio.Transport | None = None
        self.feeds: Link | None = None
        self.drains: Link | None = None
        self.lost = False
        self.closing = False
        self._buffer: memoryview | None = None

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
        self.feeds.feed(bytes(self._buffer[:nbytes]))

    def eof_received(self) -> bool:
        if self.feeds is not None:
            self.feeds.feed_eof()
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

    def __init__(self, proxy: "Proxy"):
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
            log.warning("proxy %s: unable to open connection to upstream %s: %s", self.proxy.name,
                        self.proxy.upstream, exc)
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


# --- toxic chains ----------------------------------------------------------------------------


class ToxicCollection:
    """A proxy's two chains of toxics; every change is applied to every open link at once."""

    def __init__(self, proxy: "Proxy"):
        self.proxy = proxy
        self.chains: dict[str, list[ToxicWrapper]] = {d: [] for d in DIRECTIONS}

    def to_json(self) -> list[dict]:
        return [w.to_json() for d in DIRECTIONS for w in self.chains[d]]

    def find(self, name: str) -> ToxicWrapper | None:
        for d in DIRECTIONS:
            for w in self.chains[d]:
                if w.name == name:
                    return w
        return None

    def _links(self, direction: str) -> list[Link]:
        return [c.links[direction] for c in list(self.proxy.connections) if c.links]

    async def add(self, wrapper: ToxicWrapper) -> None:
        self.chains[wrapper.direction].append(wrapper)
        await _gather(link.add(wrapper) for link in self._links(wrapper.direction))

    async def update(self, wrapper: ToxicWrapper) -> None:
        await _gather(link.update(wrapper) for link in self._links(wrapper.direction))

    async def remove(self, wrapper: ToxicWrapper) -> None:
        self.chains[wrapper.direction].remove(wrapper)
        await _gather(link.remove(wrapper) for link in self._links(wrapper.direction))

    async def reset(self) -> None:
        for d in DIRECTIONS:
            while self.chains[d]:
                await self.remove(self.chains[d][0])


async def _gather(coros) -> None:
    coros = list(coros)
    if coros:
        await asyncio.gather(*coros)


# The longest name of a proxy or a toxic. Both percent-encoded (12 bytes a character at worst) in the longest route
# take 25 KiB of the API's 64 KiB request head (api.MAX_HEADER_BYTES): whatever is created can be addressed.
MAX_NAME_CHARS = 1024

FLOAT32_MAX = 3.4028234663852886e38  # Go decodes toxicity into a float32


def check_name(name: str, where: str = "") -> None:
    """400 for a name too long to be addressed in a URL later (Toxiproxy has no limit; its request head has 1 MB)."""
    if len(name) > MAX_NAME_CHARS:
        raise ProxyError(f"name too long: at most {MAX_NAME_CHARS} characters{where}", 400)


def toxicity_value(value, field: str) -> float:
    """A body's toxicity as Go decodes it into a float32; a 400 naming `field`, as Go's error does, otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not abs(value) <= FLOAT32_MAX:
        raise ProxyError(f"bad request body: json: cannot unmarshal {_kind(value)} into Go struct field {field} of "
                         "type float32", 400)
    return float(value)


def make_toxic(body: dict) -> ToxicWrapper:
    """Validate a toxic-create body the way Toxiproxy does, in its order of checks (null is absent, as in Go)."""
    defaults = {"name": "", "type": "", "stream": "downstream", "toxicity": 1.0}
    name, type_, stream, toxicity = (default if body.get(key) is None else body[key]
                                     for key, default in defaults.items())
    for key, value in (("name", name), ("type", type_), ("stream", stream)):
        if not isinstance(value, str):
            raise ProxyError(f"bad request body: json: cannot unmarshal {_kind(value)} into Go struct field "
                             f"ToxicWrapper.{key} of type string", 400)
    toxicity = toxicity_value(toxicity, "ToxicWrapper.toxicity")
    check_name(name)
    if stream.lower() not in DIRECTIONS:
        raise ProxyError("stream was invalid, can be either upstream or downstream", 400)
    if not name:
        name = f"{type_}_{stream}"
    cls = REGISTRY.get(type_)
    if cls is None:
        raise ProxyError("invalid toxic type", 400)
    return ToxicWrapper(name, type_, stream, toxicity, cls())


def _kind(v) -> str:
    from chaos.toxiproxy.toxics.toxic import _json_kind

    return _json_kind(v)


# --- proxies ---------------------------------------------------------------------------------


def split_hostport(addr: str) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port); raises ValueError worded like Go's net package."""
    if not isinstance(addr, str):
        raise ValueError(f"address {addr!r}: not a string")
    if addr.startswith("["):
        host, sep, rest = addr[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError(f"address {addr}: missing port in address")
        port_s = rest[1:]
    else:
        host, sep, port_s = addr.rpartition(":")
        if not sep:
            raise ValueError(f"address {addr}: missing port in address")
        if ":" in host:
            raise ValueError(f"address {addr}: too many colons in address")
    try:
        port = int(port_s)
    except ValueError:
        raise ValueError(f"address {addr}: invalid port") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"address {addr}: invalid port")
    return host, port


def join_hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def resolve_listen(addr: str) -> tuple[str, int]:
    """Resolve a listen address to one (ip, port). An empty host means 127.0.0.1 here: this proxy
    never binds every interface (Toxiproxy would), and no listen at all means 127.0.0.1:0."""
    if addr == "":
        return "127.0.0.1", 0
    host, port = split_hostport(addr)
    if host in ("", "localhost"):
        return "127.0.0.1", port
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
        return host, port
    except OSError:
        pass
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    infos.sort(key=lambda i: i[0] != socket.AF_INET)
    if not infos:
        raise ValueError(f"address {addr}: no such host")
    return infos[0][4][0], port


def listen_error(exc: Exception) -> ProxyError:
    """A listen address that does not resolve, worded as Go's net.Listen words it (on create and update alike)."""
    return ProxyError(f"listen tcp: {exc}", 500)


class Proxy:
    """One listening address forwarding to one upstream, with its connections and toxics."""

    def __init__(self, name: str, listen: str, upstream: str):
        self.name, self.listen, self.upstream = name, listen, upstream
        self.enabled = False
        self.toxics = ToxicCollection(self)
        self.connections: set[Connection] = set()
        self._server: asyncio.AbstractServer | None = None
        self.legs = {d: LegStats() for d in DIRECTIONS}  # what its links applied (GET /proxies/{p}/fidelity)

    def fidelity_json(self) -> dict:
        return {"edges_ms": list(EDGES_MS), **{d: leg.to_json() for d, leg in self.legs.items()}}

    def asked_json(self) -> dict:
        return {d: leg.asked_json() for d, leg in self.legs.items()}

    def to_json(self) -> dict:
        return {"name": self.name, "listen": self.listen, "upstream": self.upstream, "enabled": self.enabled,
                "toxics": self.toxics.to_json()}

    async def start(self) -> None:
        if self.enabled:
            raise AlreadyStarted(self.name)
        try:
            host, port = await resolve_listen(self.listen)
        except (ValueError, OSError) as exc:
            raise listen_error(exc) from None
        loop = asyncio.get_running_loop()

        def accept() -> _Side:
            return Connection(self).client

        try:
            self._server = await loop.create_server(accept, host, port, reuse_address=True, backlog=1024)
        except OSError as exc:  # asyncio's text repeats the address: Go's is the errno's
            reason = (os.strerror(exc.errno) if exc.errno else str(exc)).lower()
            raise ProxyError(f"listen tcp {join_hostport(host, port)}: bind: {reason}", 500) from None
        sockname = self._server.sockets[0].getsockname()
        self.listen = join_hostport(sockname[0], sockname[1])
        self.enabled = True
        log.info("proxy %s: started on %s -> %s", self.name, self.listen, self.upstream)

    def stop(self) -> None:
        if not self.enabled:
            return
        self.enabled = False
        if self._server is not None:
            self._server.close()
            self._server = None
        for conn in list(self.connections):
            conn.abort()
        log.info("proxy %s: terminated", self.name)

    async def differs(self, listen: str, upstream: str) -> bool:
        try:
            host, port = await resolve_listen(listen)
        except (ValueError, OSError) as exc:
            raise listen_error(exc) from None
        return self.listen != join_hostport(host, port) or self.upstream != upstream

    async def update(self, listen: str, upstream: str, enabled: bool) -> None:
        """Toxiproxy's update: a new listen/upstream restarts the proxy; `enabled` starts/stops it."""
        if await self.differs(listen, upstream):
            self.stop()
            self.listen, self.upstream = listen, upstream
        if enabled != self.enabled:
            if enabled:
                await self.start()
            else:
                self.stop()
