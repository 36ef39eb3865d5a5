"""The policy-server process: every model of the manifest served on one Zenoh session.

    manifest (model + extra_models) ──► ServerProcess
        ├── PolicyServer per model: keys, sessions, mailbox, dispatch loop(s) started by its first request
        └── shared: the Zenoh session, metrics + health endpoint (/healthz /readyz /metrics /sessions), audit log

Owns: start-up order across models (every model loaded and warmed up before any liveliness token is
declared), the process's health endpoint, and drain/stop of all models.

Invariants: a model's failure to load fails the start-up (no half-served manifest); the process is
ready only when every model is and its Zenoh session has a router; SIGTERM drains every model at once, within the largest drain bound.
"""

from __future__ import annotations

import logging
import threading

from server.audit import AuditLog
from server.health import HealthServer
from server.metrics import Metrics
from server.router import RouterLink, StartCancelled, open_manifest_session
from server.service import READY_TEXT, PolicyServer, Shared, as_manifest, create_output

log = logging.getLogger("policy_server")


class ServerProcess:
    def __init__(self, manifest):
        """`manifest` is a server.manifest.Manifest (plain data is validated as one)."""
        self.m = manifest = as_manifest(manifest)
        audit_path = manifest.audit_path
        self.shared = Shared(None, Metrics(), create_output("audit_path", audit_path, lambda: AuditLog(audit_path)))
        self.metrics = self.shared.metrics
        self.models: dict[str, PolicyServer] = {
            mid: PolicyServer(manifest.for_model(mid), shared=self.shared) for mid in manifest.model_ids
        }
        self.health = None
        self.router: RouterLink | None = None
        self.stopped = threading.Event()

    def load(self) -> None:
        for server in self.models.values():
            server.load()

    def start(self) -> ServerProcess:
        """Raises StartCancelled when stop() comes while it still waits for a router."""
        self.shared.z = open_manifest_session(self.m, stopped=self.stopped)
        if self.stopped.is_set():  # stop() ran while the session opened, before it could see it
            self.shared.z.close()
            raise StartCancelled("stopped while the Zenoh session opened")
        self.router = RouterLink(self.shared.z)
        for server in self.models.values():
            server.start()
        port = self.m.health_port
        if port is not None and port >= 0:
            self.health = HealthServer(
                port,
                self.metrics,
                self._ready_reason,
                lambda: not self.stopped.is_set(),
                host=self.m.health_host,
                sessions_fn=self.session_report,
            ).start()
        health = f" health http://127.0.0.1:{self.health.port}" if self.health else ""
        print(f"{READY_TEXT}: {'; '.join(s.describe() for s in self.models.values())}{health}", flush=True)
        return self

    def session_report(self, client: str | None = None) -> dict:
        """/sessions: every model's sessions (server.service.PolicyServer.session_report)."""
        return {"models": {mid: server.session_report(client) for mid, server in self.models.items()}}

    def _ready_reason(self):
        for mid, server in self.models.items():
            ok, why = server._ready_reason()
            if not ok:
                return False, f"{mid}: {why}" if len(self.models) > 1 else why
        if self.router is not None and not self.router.connected():
            return False, "no router"
        return True, "ready"

    def drain(self, reason: str = "SIGTERM") -> None:
        """Every model drains at once (each tells its clients and finishes its batch in flight), then stop."""
        threads = [
            threading.Thread(target=s.drain, args=(reason,), name=f"drain-{mid}", daemon=True)
            for mid, s in self.models.items()
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.stop()

    def stop(self) -> None:
        if self.stopped.is_set():
            return
        self.stopped.set()
        for server in self.models.values():
            server.stop()
        if self.router is not None:
            self.router.close()
        if self.shared.z is not None:
            try:
                self.shared.z.close()
            except Exception:
                pass
        if self.health is not None:
            self.health.stop()
        self.shared.audit.close()
