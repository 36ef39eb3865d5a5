"""Proxies: accept clients, dial the upstream, run each direction through its chain of toxics.

This module owns the listener of every proxy: its address, start, stop and update, its connections and its
chains (`Proxy`). The bytes' path through a connection is chaos.toxiproxy.streams (its docstring draws it),
the toxics and their chains as the API sees them chaos.toxiproxy.chains; their names are re-exported here.
"""

from __future__ import annotations

import asyncio
import logging
import os

from chaos.toxiproxy.addresses import join_hostport, listen_error, resolve_listen, split_hostport
from chaos.toxiproxy.chains import (
    DIRECTIONS,
    DOWNSTREAM,
    FLOAT32_MAX,
    MAX_NAME_CHARS,
    UPSTREAM,
    ToxicCollection,
    ToxicWrapper,
    check_name,
    make_toxic,
    toxicity_value,
)
from chaos.toxiproxy.errors import AlreadyStarted, ProxyError
from chaos.toxiproxy.fidelity import EDGES_MS, LegStats
from chaos.toxiproxy.streams import Connection, Link, _Side

__all__ = [
    "DIRECTIONS",
    "DOWNSTREAM",
    "FLOAT32_MAX",
    "MAX_NAME_CHARS",
    "UPSTREAM",
    "AlreadyStarted",
    "Connection",
    "Link",
    "Proxy",
    "ProxyError",
    "ToxicCollection",
    "ToxicWrapper",
    "check_name",
    "join_hostport",
    "listen_error",
    "make_toxic",
    "resolve_listen",
    "split_hostport",
    "toxicity_value",
]

log = logging.getLogger("chaos.toxiproxy")


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
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": self.toxics.to_json(),
        }

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
