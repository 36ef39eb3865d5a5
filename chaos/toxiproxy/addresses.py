"""Addresses as Toxiproxy words them: parse and join `host:port` (IPv6 in brackets), resolve a listen
address, and word a listen failure as Go's net package does."""

from __future__ import annotations

import asyncio
import socket

from chaos.toxiproxy.errors import ProxyError


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
