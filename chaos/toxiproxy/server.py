"""The proxy server: one asyncio loop running the HTTP API and every proxy.

`serve()` is the process entry (used by `python -m chaos.toxiproxy`); `ServerThread` runs the
same server on a background thread of the calling process (tests, tools). Invariant: the loop
thread is the only thread that touches proxies, connections and toxics.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from pathlib import Path

from chaos.toxiproxy.api import VERSION, Api, decode_body
from chaos.toxiproxy.collection import ProxyCollection
from chaos.toxiproxy.proxy import ProxyError

log = logging.getLogger("chaos.toxiproxy")


class ToxiproxyServer:
    """The API server and its proxy collection, bound to the running loop."""

    def __init__(self, host: str = "127.0.0.1", port: int = 8474):
        self.host, self.port = host, port
        self.collection = ProxyCollection()
        self.api = Api(self.collection)
        self._http: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self._http = await asyncio.start_server(
            self.api.serve_connection, self.host, self.port, reuse_address=True, backlog=256
        )
        self.port = self._http.sockets[0].getsockname()[1]

    @property
    def api_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def populate_file(self, path: str | Path) -> None:
        """Like `toxiproxy-server -config FILE`: a JSON populate list; errors are logged, not fatal."""
        try:
            entries = decode_body(Path(path).read_bytes())  # the API's decoder: what it refuses, a file cannot bring
        except OSError as exc:
            log.error("error reading config file %s: %s", path, exc)
            return
        except ProxyError as exc:
            log.error("error reading config file %s: %s", path, exc.message)
            return
        async with self.collection.lock:
            done, err = await self.collection.populate(entries)
        if err is not None:
            log.error("failed to populate proxies from file %s: %s", path, err.message)
        else:
            log.info("populated %d proxies from file %s", len(done), path)

    async def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
        self.collection.clear()


async def serve(host: str, port: int, config: str | None = None, ready=None, stop: asyncio.Event | None = None) -> None:
    """Run until SIGTERM/SIGINT (or `stop` is set); call `ready(server)` once the API listens."""
    server = ToxiproxyServer(host, port)
    if config:
        await server.populate_file(config)
    await server.start()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (RuntimeError, ValueError):  # not the main thread: the owner sets `stop`
            pass
    if ready is not None:
        ready(server)
    try:
        await stop.wait()
    finally:
        await server.close()


class ServerThread:
    """Our server on a daemon thread of this process; `with ServerThread() as s: s.api_url`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.host, self.port = host, port
        self.server: ToxiproxyServer | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="toxiproxy-py", daemon=True)

    def _run(self) -> None:
        async def main():
            self.loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def ready(server):
                self.server, self.port = server, server.port
                self._ready.set()

            await serve(self.host, self.port, ready=ready, stop=self._stop)

        try:
            asyncio.run(main())
        except BaseException as exc:  # surfaced by start()
            self._error = exc
            self._ready.set()

    def start(self, timeout_s: float = 5.0) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(timeout_s) or self._error is not None:
            raise RuntimeError(f"toxiproxy server thread did not start: {self._error!r}")
        return self

    @property
    def api_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.loop is not None and self._stop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout_s)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


__all__ = ["ToxiproxyServer", "ServerThread", "serve", "VERSION"]
