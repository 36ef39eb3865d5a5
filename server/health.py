"""HTTP probes and the Prometheus scrape endpoint of one policy-server replica.

    GET /healthz  200 "ok"                     while live_fn() is true, else 503   (restart me)
    GET /readyz   200 {"ready": true, ...}     while ready_fn() is true, else 503  (send me sessions)
    GET /metrics  200 text 0.0.4, or OpenMetrics  Metrics.render() (`Accept` picks; `?name[]=` restricts)
    GET /sessions 200 {"models": {...}}          sessions_fn(client): each session's counters and latency
                                                 percentiles, the per-robot detail /metrics never labels
    HEAD          the same status and headers, no body
    anything else 404

Owns one `ThreadingHTTPServer` on a daemon thread; it never touches the inference path except by
calling the functions it was given. Invariant: a probe answers from the functions' value at
the moment of the request, a probe function that raises is answered 503 (never a crash or a 200),
and no request is ever logged to stderr. No client can hold it: a connection silent for
`timeout_s` is closed; a request whose line and headers have not arrived whole `head_deadline_s` after
the server began waiting for it (however steadily it drips) is answered 408 and closed, or closed
unanswered if not one byte of it came; one beyond `max_connections` open at once is closed unanswered.
Every connection's slot is free again before its client sees the close.
"""

from __future__ import annotations

import io
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

from server.metrics import Metrics

log = logging.getLogger(__name__)

# ready_fn may answer a bare bool, or (ready, reason) to say why in the /readyz body.
ReadyFn = Callable[[], "bool | tuple[bool, str]"]


TIMEOUT_S = 5.0  # a connection silent this long (a half-sent request, an idle keep-alive) is closed
HEAD_DEADLINE_S = 5.0  # a request line and headers not whole this long after the wait began: 408, closed
MAX_CONNECTIONS = 32  # connections served at once (a thread each); more are closed unanswered

_REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class HealthBindError(OSError):
    """The health server cannot listen on its host and port (taken, or not an address of this host)."""


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, handler, max_connections: int):
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):  # every slot held (slow or idle clients): refuse, never grow
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: its slot is free again
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        # ThreadingMixIn's, with the slot released before the close: a client that sees its connection
        # end can count on the slot being free for the next one.
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self._slots.release()
            self.shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        # A prober hanging up mid-response is routine; the default prints a traceback to stderr.
        log.debug("health request from %s failed", client_address, exc_info=True)


class _HeadReader(io.RawIOBase):
    """A handler's socket as a raw stream; while a deadline is armed, no read waits past it.

    The socket's own timeout bounds one read, so a client sending a byte just inside it every time
    would hold the connection forever: each read here waits only for what is left of the deadline."""

    def __init__(self, sock: socket.socket, timeout_s: float | None):
        self._sock = sock
        self._timeout_s = timeout_s
        self._deadline: float | None = None
        self.received = 0  # bytes read since arm(): any, and an expired deadline is a 408 rather than silence
        self.expired = False

    def readable(self) -> bool:
        return True

    def arm(self, seconds: float) -> None:
        self._deadline = time.monotonic() + seconds
        self.received = 0
        self.expired = False

    def disarm(self) -> None:
        self._deadline = None
        self._sock.settimeout(self._timeout_s)  # the response is written under the plain timeout

    def readinto(self, buffer) -> int:
        if self._deadline is not None:
            left = self._deadline - time.monotonic()
            if left <= 0:
                self.expired = True
                raise TimeoutError("request line and headers not whole by their deadline")
            self._sock.settimeout(left if self._timeout_s is None else min(left, self._timeout_s))
        try:
            n = self._sock.recv_into(buffer)
        except TimeoutError:
            self.expired = self._deadline is not None and time.monotonic() >= self._deadline
            raise
        self.received += n
        return n


class HealthServer:
    """Serves /healthz, /readyz, /metrics and /sessions on `host:port` (port 0 picks a free one; read `.port`)."""

    def __init__(
        self,
        port: int,
        metrics: Metrics | None,
        ready_fn: ReadyFn,
        live_fn: Callable[[], bool] = lambda: True,
        host: str = "127.0.0.1",
        sessions_fn: Callable[[str | None], dict] | None = None,
        timeout_s: float = TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
        head_deadline_s: float = HEAD_DEADLINE_S,
    ):
        self.host = host
        self.timeout_s = timeout_s
        self.head_deadline_s = head_deadline_s
        self.max_connections = max_connections
        self.sessions_fn = sessions_fn
        self.port = port
        self.metrics = metrics
        self.ready_fn = ready_fn
        self.live_fn = live_fn
        self._httpd: _QuietServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> HealthServer:
        """Bind (raising HealthBindError if the port is taken) and serve on a daemon thread; returns self."""
        if self._httpd is not None:
            raise RuntimeError("HealthServer already started")
        try:
            self._httpd = _QuietServer((self.host, self.port), self._handler_class(), self.max_connections)
        except OSError as exc:
            raise HealthBindError(f"cannot listen on {self.host}:{self.port}: {exc.strerror or exc}") from None
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"health-http:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port; idempotent."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def __enter__(self) -> HealthServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- the three answers, as (status, content type, body) -------------------------------------

    def _healthz(self) -> tuple[int, str, bytes]:
        try:
            live = bool(self.live_fn())
        except Exception as e:
            log.warning("live_fn raised; answering /healthz 503", exc_info=True)
            return 503, "text/plain; charset=utf-8", f"not live: live_fn raised {type(e).__name__}: {e}\n".encode()
        return (
            (200, "text/plain; charset=utf-8", b"ok\n") if live else (503, "text/plain; charset=utf-8", b"not live\n")
        )

    def _readyz(self) -> tuple[int, str, bytes]:
        try:
            answer = self.ready_fn()
            if isinstance(answer, tuple):
                ready, reason = bool(answer[0]), str(answer[1])
            else:
                ready = bool(answer)
                reason = "ready" if ready else "not ready"
        except Exception as e:
            log.warning("ready_fn raised; answering /readyz 503", exc_info=True)
            ready, reason = False, f"ready_fn raised {type(e).__name__}: {e}"
        body = json.dumps({"ready": ready, "reason": reason}).encode() + b"\n"
        return (200 if ready else 503), "application/json", body

    def _metrics(self, query: str = "", accept: str = "") -> tuple[int, str, bytes]:
        """`/metrics?name[]=policy_server_load&name[]=...` renders only those families (a cheap scrape)."""
        if self.metrics is None:
            return 404, "text/plain; charset=utf-8", b"no metrics registry\n"
        params = parse_qs(query)
        names = set(params.get("name[]", []) + params.get("name", [])) or None
        try:
            body, ctype = self.metrics.render(accept, names)
            return 200, ctype, body
        except Exception as e:
            log.exception("metrics render failed")
            return 500, "text/plain; charset=utf-8", f"metrics render failed: {type(e).__name__}: {e}\n".encode()

    def _sessions(self, query: str = "", accept: str = "") -> tuple[int, str, bytes]:
        """`/sessions?client=<uuid>` answers that robot's sessions only."""
        if self.sessions_fn is None:
            return 404, "text/plain; charset=utf-8", b"no session status on this endpoint\n"
        client = (parse_qs(query).get("client") or [None])[0]
        try:
            return 200, "application/json", json.dumps(self.sessions_fn(client)).encode() + b"\n"
        except Exception as e:
            log.exception("session status failed")
            return 500, "text/plain; charset=utf-8", f"session status failed: {type(e).__name__}: {e}\n".encode()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        routes = {"/healthz": self._healthz, "/readyz": self._readyz}
        with_query = {"/metrics": self._metrics, "/sessions": self._sessions}
        timeout_s, head_deadline_s = self.timeout_s, self.head_deadline_s

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = timeout_s  # the socket's: a read that waits longer ends the connection

            def setup(self) -> None:
                super().setup()
                self.rfile.close()  # the socket's own reader, replaced by one that keeps the head's deadline
                self.head_reader = _HeadReader(self.connection, timeout_s)
                self.rfile = io.BufferedReader(self.head_reader)

            def handle_one_request(self) -> None:
                self.head_reader.arm(head_deadline_s)  # from the wait's start: an idle keep-alive counts too
                super().handle_one_request()  # a TimeoutError inside ends the connection there
                if self.head_reader.expired:
                    self.close_connection = True
                    if self.head_reader.received:  # a request begun and never finished: say why it ends
                        self.head_reader.disarm()
                        try:
                            self.wfile.write(_REQUEST_TIMEOUT)
                        except OSError:
                            pass

            def parse_request(self) -> bool:
                try:
                    return super().parse_request()  # reads the headers, under the deadline
                finally:
                    self.head_reader.disarm()

            def do_HEAD(self) -> None:
                self.do_GET(send_body=False)

            def do_GET(self, send_body: bool = True) -> None:
                path, _, query = self.path.partition("?")
                if path in with_query:
                    status, ctype, body = with_query[path](query, self.headers.get("Accept", ""))
                elif path in routes:
                    status, ctype, body = routes[path]()
                else:
                    status, ctype, body = 404, "text/plain; charset=utf-8", b"not found\n"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                if send_body:
                    self.wfile.write(body)

            def log_message(self, format: str, *args) -> None:
                pass  # probes arrive every few seconds; per-request lines would drown the server log

        return Handler
