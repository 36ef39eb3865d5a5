"""HTTP probes and the Prometheus scrape endpoint of one policy-server replica.

    GET /healthz  200 "ok"                     while live_fn() is true, else 503   (restart me)
    GET /readyz   200 {"ready": true, ...}     while ready_fn() is true, else 503  (send me sessions)
    GET /metrics  200 text/plain; version=0.0.4  Metrics.render_prometheus()
    anything else 404

Owns one `ThreadingHTTPServer` on a daemon thread; it never touches the inference path except by
calling the three functions it was given. Invariant: a probe answers from the functions' value at
the moment of the request, a probe function that raises is answered 503 (never a crash or a 200),
and no request is ever logged to stderr.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from server.metrics import Metrics

log = logging.getLogger(__name__)

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# ready_fn may answer a bare bool, or (ready, reason) to say why in the /readyz body.
ReadyFn = Callable[[], "bool | tuple[bool, str]"]


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        # A prober hanging up mid-response is routine; the default prints a traceback to stderr.
        log.debug("health request from %s failed", client_address, exc_info=True)


class HealthServer:
    """Serves /healthz, /readyz and /metrics on `host:port` (port 0 picks a free one; read `.port`)."""

    def __init__(self, port: int, metrics: Metrics | None, ready_fn: ReadyFn, live_fn: Callable[[], bool] = lambda: True,
                 host: str = "127.0.0.1"):
        self.host = host
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

    def _metrics(self, query: str = "") -> tuple[int, str, bytes]:
        """`/metrics?name[]=policy_server_load&name[]=...` renders only those families (a cheap scrape)."""
        if self.metrics is None:
            return 404, "text/plain; charset=utf-8", b"no metrics registry\n"
        from urllib.parse import parse_qs

        params = parse_qs(query)
        names = set(params.get("name[]", []) + params.get("name", [])) or None
        try:
            return 200, PROMETHEUS_CONTENT_TYPE, self.metrics.render_prometheus(names).encode("utf-8")
        except Exception as e:
            log.exception("render_prometheus failed")
            return 500, "text/plain; charset=utf-8", f"render_prometheus failed: {type(e).__name__}: {e}\n".encode()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        routes = {"/healthz": self._healthz, "/readyz": self._readyz, "/metrics": self._metrics}
        metrics_route = self._metrics

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                path, _, query = self.path.partition("?")
                route = routes.get(path)
                if route is None:
                    status, ctype, body = 404, "text/plain; charset=utf-8", b"not found\n"
                else:
                    status, ctype, body = route(query) if route == metrics_route else route()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args) -> None:
                pass  # probes arrive every few seconds; per-request lines would drown the server log

        return Handler
