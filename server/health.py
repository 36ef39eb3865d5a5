"""HTTP probes and the Prometheus scrape endpoint of one policy-server replica.

    GET /healthz  200 "ok"                     while live_fn() is true, else 503   (restart me)
    GET /readyz   200 {"ready": true, ...}     while ready_fn() is true, else 503  (send me sessions)
    GET /metrics  200 text 0.0.4, or OpenMetrics  Metrics.render() (`Accept` picks; `?name[]=` restricts)
    GET /sessions 200 {"models": {...}}          sessions_fn(client): each session's counters and latency
                                                 percentiles, the per-robot detail /metrics never labels
    anything else 404

Owns one `ThreadingHTTPServer` on a daemon thread; it never touches the inference path except by
calling the functions it was given. Invariant: a probe answers from the functions' value at
the moment of the request, a probe function that raises is answered 503 (never a crash or a 200),
and no request is ever logged to stderr.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import parse_qs

from server.metrics import Metrics

log = logging.getLogger(__name__)

# ready_fn may answer a bare bool, or (ready, reason) to say why in the /readyz body.
ReadyFn = Callable[[], "bool | tuple[bool, str]"]


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        # A prober hanging up mid-response is routine; the default prints a traceback to stderr.
        log.debug("health request from %s failed", client_address, exc_info=True)


class HealthServer:
    """Serves /healthz, /readyz, /metrics and /sessions on `host:port` (port 0 picks a free one; read `.port`)."""

    def __init__(self, port: int, metrics: Metrics | None, ready_fn: ReadyFn, live_fn: Callable[[], bool] = lambda: True,
                 host: str = "127.0.0.1", sessions_fn: Callable[[str | None], dict] | None = None):
        self.host = host
        self.sessions_fn = sessions_fn
        self.port = port
        self.metrics = metrics
        self.ready_fn = ready_fn
        self.live_fn = live_fn
        self._httpd: _QuietServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> "HealthServer":
        """Bind (raising OSError if the port is taken) and serve on a daemon thread; returns self."""
        if self._httpd is not None:
            raise RuntimeError("HealthServer already started")
        self._httpd = _QuietServer((self.host, self.port), self._handler_class())
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"health-http:{self.port}", daemon=True)
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

    def __enter__(self) -> "HealthServer":
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
        return (200, "text/plain; charset=utf-8", b"ok\n") if live else (503, "text/plain; charset=utf-8", b"not live\n")

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

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
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
                self.wfile.write(body)

            def log_message(self, format: str, *args) -> None:
                pass  # probes arrive every few seconds; per-request lines would drown the server log

        return Handler
