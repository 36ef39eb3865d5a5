"""The proxy gives a dead connection's memory back at once, without waiting for the cyclic GC."""

from __future__ import annotations

import asyncio
import gc

from chaos.toxiproxy.proxy import Proxy, make_toxic


async def _echo(reader, writer):
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


async def _partition_once() -> list:
    upstream = await asyncio.start_server(_echo, "127.0.0.1", 0)
    proxy = Proxy("site", "127.0.0.1:0", f"127.0.0.1:{upstream.sockets[0].getsockname()[1]}")
    await proxy.start()
    await proxy.toxics.add(make_toxic({"type": "latency", "stream": "downstream", "attributes": {"latency": 2}}))
    host, port = proxy.listen.rsplit(":", 1)
    clients = [await asyncio.open_connection(host, int(port)) for _ in range(3)]
    for reader, writer in clients:
        writer.write(b"x" * 3000)
        await writer.drain()
        assert await reader.readexactly(3000) == b"x" * 3000
    sides = [s for conn in proxy.connections for s in (conn.client, conn.upstream)]
    assert len(sides) == 6 and all(s._buffer is not None for s in sides)  # reads went through the buffers
    proxy.stop()  # a partition: every connection aborted
    for _, writer in clients:
        writer.close()
    upstream.close()
    return sides


def test_a_partition_releases_every_read_buffer_without_a_gc_pass():
    gc.disable()  # long-lived connections sit in the oldest generation: no timely cyclic collection
    try:
        sides = asyncio.run(_partition_once())
    finally:
        gc.enable()
    assert [s._buffer for s in sides] == [None] * 6
