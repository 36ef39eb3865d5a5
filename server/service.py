"""The policy server process: Zenoh control and data planes around the model runtime.

    zenoh callbacks (deposit only)                      dispatch thread(s) per model
    .../<task>/<client>/obs ──► header+body decode ──►  Mailbox (latest-only per session,
                                 session lookup          scheduler, TTL, overflow)
                                                        ──► take(max_batch) ──► ModelRuntime.infer
    status / session / reset queryables: validate,      ──► ActionChunk (header echoed) ──► .../action
      mutate the registry, reply                         ──► metrics, audit line, debug capture
    client liveliness ──► mark lost ──► housekeeping thread garbage-collects after the grace period

Owns: `PolicyServer` (start-up order, threads, housekeeping, drain). Its planes are cut
along their pipelines: server/intake.py (the observation admission chain), server/control.py (status,
session open, reset, liveliness), server/dispatcher.py (the dispatch loops and their forward passes),
server/replies.py (chunks, error events, audit lines),
server/router.py (the Zenoh session and its router); the planes see it through server/served.py
(`Served`), never this module. Settings are read from the typed manifest
(server.manifest.Manifest), whose defaults are the only ones.

Invariants:
- Callbacks never run inference and never wait on the worker; bad input from one client becomes an
  Error event to THAT client plus an `observation_errors` count, never an exception in the server.
- Start-up order: load -> warm up -> declare queryables/subscribers -> declare the liveliness token
  and answer `ready`. A client that sees the token finds a warmed-up replica.
- Every chunk echoes seq_id, episode_id, client_mono_ns and session_epoch of the observation it
  answers (the client's only clock is its own).
- Drain (SIGTERM): refuse new sessions and observations, notify every client, finish the batch in
  flight, exit within `drain.timeout_s`. Nothing a client needs lives only here (statelessness, 7).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from server.audit import AuditLog
from server.control import ControlPlane, _control_header  # noqa: F401 - _control_header: its old import path
from server.dispatcher import DISPATCH_FIFO_PRIORITY, DISPATCH_PRIORITY_LOG_TEXT, Dispatcher  # noqa: F401
from server.guard import Guard
from server.health import HealthServer
from server.intake import Intake, state_shape_error  # noqa: F401 - state_shape_error: re-exported
from server.manifest import Manifest
from server.metrics import Metrics, WindowedSketch
from server.replies import Replies
from server.router import RouterLink, StartCancelled, open_manifest_session  # noqa: F401 - re-exported
from server.runtime import EmulatedLatency, ModelRuntime
from server.sessions import ReplicaInfo, Session, SessionRegistry
from wire import DrainNotice, Header, MsgType, ReplicaKeys
from wire.tensors import Limits

log = logging.getLogger("policy_server")

READY_TEXT = "policy-server ready"


class OutputPathError(ValueError):
    """An output path of the manifest (`audit_path`, `debug.capture_dir`) this process cannot create: a user error
    whose message names the key, raised before any model loads."""


def create_output(key: str, path, make):
    """`make()` (which creates `path`), an OSError of it an OutputPathError naming `key`."""
    try:
        return make()
    except OSError as exc:
        above = next((p for p in Path(path).parents if p.exists()), None)
        why = f"{str(above)!r} is a file" if above is not None and not above.is_dir() else exc.strerror or exc
        raise OutputPathError(
            f"{key}: cannot create {str(path)!r}: {why}; give a path in a directory this process "
            f"can write, or leave {key} unset"
        ) from None


@dataclass
class Shared:
    """What the served models of one process share: its Zenoh session, metrics and audit log (the process
    owns them; a model's `stop` leaves them open)."""

    z: Any
    metrics: Metrics
    audit: AuditLog


def as_manifest(manifest: Manifest | Mapping) -> Manifest:
    """A Manifest, or plain data validated as one (ManifestError names the key), as `load_manifest` would."""
    return manifest if isinstance(manifest, Manifest) else Manifest.from_dict(manifest)


def replica_info(m: Manifest, keys: ReplicaKeys, loaded, runtime: ModelRuntime, mode: str, horizon: int) -> ReplicaInfo:
    """What the session open and the status say of this replica: the manifest's settings over the checkpoint's."""
    c = m.clients
    return ReplicaInfo(
        replica_id=keys.replica_id,
        model_id=keys.model_id,
        revision=keys.revision,
        checkpoint_hash=loaded.checkpoint_hash,
        policy_type=loaded.config.type,
        action_names=list(loaded.config.action_names),
        state_dim=loaded.config.state_dim,
        cameras=runtime.cameras,
        chunk_size=loaded.config.chunk_size,
        trained_fps=float(m.trained_fps or loaded.config.fps),
        supports_rtc=runtime.supports_rtc,
        rtc_unsupported_reason=getattr(loaded.policy, "rtc_unsupported_reason", ""),
        serving_mode=mode,
        max_sessions=m.max_sessions,
        execution_horizon=int(horizon),
        default_task=m.default_task,
        pin_task=m.pin_task,
        allow_resampling=m.allow_resampling,
        inference_emulated=runtime.emulated is not None,
        allowlist=tuple(c.allowlist),
        known_clients={k.id: k for k in c.known},
        accept_unknown=c.accept_unknown,
    )


class PolicyServer:
    """One served model: its sessions, mailbox, dispatch loop(s) and keys. Alone (the tests, a one-model
    manifest) it owns the Zenoh session, health server and audit log; inside `ServerProcess` it shares them."""

    def __init__(self, manifest: Manifest | Mapping, loaded=None, shared: Shared | None = None):
        """`manifest` is a server.manifest.Manifest (plain data is validated as one); `loaded` an already loaded
        checkpoint (tests)."""
        self.m = m = as_manifest(manifest)
        self._shared = shared
        self.metrics = shared.metrics if shared else Metrics()
        self.audit = (
            shared.audit if shared else create_output("audit_path", m.audit_path, lambda: AuditLog(m.audit_path))
        )
        self.sessions = SessionRegistry()
        self.recent_queue_wait_ms = WindowedSketch()  # the replica's last 1-2 minutes, for the status
        self.recent_inference_ms = WindowedSketch()
        self.ready = False
        self.warmed_up = False
        self.draining = False
        self.stopped = threading.Event()
        self.drain_requested = threading.Event()
        self.z = None
        self._router_link: RouterLink | None = None  # alone only; inside a ServerProcess the process watches
        self._decl: list[Any] = []
        self._threads: list[threading.Thread] = []
        self.limits = Limits(**m.limits.to_dict())
        self.capture = None
        if m.debug.capture_dir:  # created here, before the model loads, so a path that cannot be is refused at once
            from server.capture import CaptureWriter

            self.capture = create_output(
                "debug.capture_dir",
                m.debug.capture_dir,
                lambda: CaptureWriter(m.debug.capture_dir, m.debug.capture_max, self),
            )
        self.replies = Replies(self)  # the planes see this server as a server.served.Served
        self.intake, self.control = Intake(self, self.replies), ControlPlane(self)
        self.dispatcher = Dispatcher(self, self.replies, self.stopped, self._spawn)
        self._loaded = loaded
        self.health = None

    # --- start-up ----------------------------------------------------------------------------------

    def load(self) -> None:
        from server.policies.base import classify
        from server.policies.checkpoint import load_checkpoint

        m = self.m
        remote_forward = m.dispatch.backend != "local"
        # forward passes on Ray Serve: the copy here only gives config, processors and stats, so it stays on the CPU
        device = "cpu" if remote_forward else m.model.device
        loaded = self._loaded or load_checkpoint(
            m.model.repo_or_path,
            device=device,
            dtype=m.model.dtype,
            trained_fps=m.trained_fps,
            action_names=m.model.action_names,
        )
        overrides = dict(m.model.hyper_params)
        if overrides:  # the manifest's sampling hyper-parameters (before the runtime reads rtc_mode)
            loaded.policy.override_hyper_params(overrides)
        self.loaded = loaded
        emulated = EmulatedLatency.from_manifest(m.emulated_latency)
        horizon = m.execution_horizon or loaded.config.execution_horizon
        self.runtime = ModelRuntime(loaded, emulated, horizon)
        model_id = m.model_id or Path(m.model.repo_or_path).name
        if remote_forward:
            from server.dispatch import make_forward

            self.runtime.forward = make_forward(loaded.policy, m, model_id, m.replica_id)
        else:  # refused here, with the reason, rather than as a failed warm-up pass
            loaded.policy.prepare_serving()
        mode = m.serving_mode
        if classify(loaded.policy) == "stateful" and mode != "exclusive":
            log.warning(
                "policy type %r is chunk-stateful: serving_mode forced to exclusive (one session)", loaded.config.type
            )
            mode = "exclusive"
        revision = m.model.revision or loaded.revision_info.get("revision") or "main"
        self.keys = ReplicaKeys(model_id, revision, m.replica_id, m.root)
        self.info = replica_info(m, self.keys, loaded, self.runtime, mode, horizon)
        self.default_latency_budget_ms = m.clients.defaults.latency_budget_ms
        self.guard = Guard(m.security, self.metrics, self.audit, self.keys.replica_id, self.limits.max_message_bytes)
        n = m.warmup_inferences
        ms = self.runtime.warmup(n)
        self.warmed_up = True
        log.info(
            "loaded %s (%s, rtc_mode %s, hash %s...%s), %d warm-up passes, %.1f ms each",
            model_id,
            loaded.config.type,
            self.runtime.rtc_mode,
            loaded.checkpoint_hash[:12],
            f", hyper_params {json.dumps(overrides, sort_keys=True)}" if overrides else "",
            n,
            ms,
        )
        if n > 0:
            max_batch = m.scheduling.max_batch
            # a compiling policy's every bucket and signature, built before the replica says it is ready
            t0 = time.perf_counter()
            warmed = self.runtime.warm_buckets(max_batch)
            if warmed:
                log.info(
                    "compiled buckets %s with and without an RTC prefix in %.1f s", warmed, time.perf_counter() - t0
                )
            # the replica's own unloaded forward time: the bench reads starvation against it
            sizes = self.runtime.unloaded_forward_ms(max_batch)
            log.info("unloaded forward ms by batch size: %s", json.dumps(sizes))

    def start(self) -> PolicyServer:
        from server.mailbox import Mailbox
        from server.scheduling import make_scheduler

        if not hasattr(self, "runtime"):
            self.load()
        m = self.m
        sched = m.scheduling
        opts: dict[str, Any] = {}
        if sched.scoring:
            opts["scoring"] = sched.scoring
        if sched.strategy == "batch_optimized":  # it holds partial batches itself: the window is its own
            opts["batch_window_ms"] = sched.batch_window_ms
        self.max_batch = sched.max_batch
        self.mailbox = Mailbox(
            make_scheduler(sched.strategy, **opts),
            model=self.info.model_id,
            max_queue_size=sched.max_queue_size,
            overflow_policy=sched.overflow_policy,
            request_ttl_ms=sched.request_ttl_ms,
            max_retries=sched.max_retries,
            batch_window_ms=sched.batch_window_ms,
            senders=self.sessions.__len__,
        )
        if self._shared is None:
            self.z = open_manifest_session(m, stopped=self.stopped)
            self._router_link = RouterLink(self.z)
        else:
            self.z = self._shared.z
        k, z, control = self.keys, self.z, self.control
        self._decl.append(z.declare_queryable(k.status, control.on_status))
        self._decl.append(z.declare_queryable(k.session, control.on_session_open))
        self._decl.append(z.declare_queryable(k.all_client_session, control.on_session_open))  # per-client open key
        self._decl.append(z.declare_queryable(k.all_reset, control.on_reset))
        self._decl.append(z.declare_subscriber(k.all_obs, self.intake.on_obs))
        self._decl.append(z.liveliness().declare_subscriber(k.all_client_alive, control.on_client_alive, history=False))
        self._spawn(self._housekeeping, f"housekeeping-{self.info.model_id}")
        port = m.health_port
        if self._shared is None and port is not None and port >= 0:
            self.health = HealthServer(
                port,
                self.metrics,
                self._ready_reason,
                lambda: not self.stopped.is_set(),
                host=m.health_host,
                sessions_fn=lambda c: {"models": {self.info.model_id: self.session_report(c)}},
            ).start()
        self._token = z.liveliness().declare_token(k.alive)
        self.ready = True
        self.set_load()
        if self._shared is None:
            health = f" health http://127.0.0.1:{self.health.port}" if self.health else ""
            print(f"{READY_TEXT}: {self.describe()}{health}", flush=True)
        return self

    def describe(self) -> str:
        return (
            f"{self.info.model_id}@{self.info.revision} replica {self.keys.replica_id} ({self.info.policy_type}, "
            f"{self.info.serving_mode}, max_sessions {self.info.effective_max_sessions})"
        )

    def start_dispatch(self) -> None:
        """This model's dispatch loops (server.dispatcher), started by its first request."""
        self.dispatcher.start()

    def _spawn(self, fn, name: str) -> None:
        t = threading.Thread(target=fn, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _ready_reason(self):
        if self.draining:
            return False, "draining"
        if not self.ready:
            return False, "warming up"
        if self._router_link is not None and not self._router_link.connected():
            return False, "no router"
        return True, "ready"

    # --- sessions ----------------------------------------------------------------------------------

    def active_sessions(self) -> int:
        return len(self.sessions)

    def close_session(self, s: Session, why: str, count: bool = True) -> None:
        self.sessions.remove(s.session_id)
        self.mailbox.remove_session(s.session_id)
        try:
            s.publisher.undeclare()
        except Exception:
            pass
        if count:
            self.metrics.inc("client_disconnected", model=self.info.model_id)
        self.set_load()
        log.info("session %s of %s closed: %s", s.session_id, s.client_uuid, why)

    def session_report(self, client: str | None = None) -> dict:
        """The per-robot detail that metrics never label: each session's counters and latency percentiles
        (fixed-size sketches), plus the replica's recent percentiles. `client` keeps that robot's only."""
        now = time.monotonic()
        rows = [
            {
                "session_id": s.session_id,
                "client_uuid": s.client_uuid,
                "task": s.task,
                "client_type": s.client_type,
                "open_s": round(now - s.opened_mono, 3),
                "idle_s": round(now - s.last_seen_mono, 3),
                "requests": s.requests,
                "outcomes": dict(s.outcomes),
                "queue_wait_ms": s.queue_wait_ms.summary(),
                "inference_ms": s.inference_ms.summary(),
            }
            for s in self.sessions.all()
            if client is None or s.client_uuid == client
        ]
        return {
            "replica_id": self.info.replica_id,
            "active_sessions": self.active_sessions(),
            "max_sessions": self.info.effective_max_sessions,
            "recent": {
                "window_s": self.recent_queue_wait_ms.window_s,
                "queue_wait_ms": self.recent_queue_wait_ms.recent().summary(),
                "inference_ms": self.recent_inference_ms.recent().summary(),
            },
            "sessions": sorted(rows, key=lambda r: r["client_uuid"]),
        }

    def set_load(self) -> None:
        active = self.active_sessions()
        cap = self.info.effective_max_sessions
        model = self.info.model_id
        self.metrics.set("active_sessions", active, model=model)
        self.metrics.set("active_clients", active, model=model)
        self.metrics.set("load", active / cap if cap else 1.0, model=model)

    # --- housekeeping, drain, stop -----------------------------------------------------------------

    def _housekeeping(self) -> None:
        grace = self.m.session.gc_grace_s
        idle = self.m.response_tracking.disconnect_timeout_s
        while not self.stopped.wait(0.2):
            now = time.monotonic()
            for s in self.sessions.all():
                if s.alive_lost_mono is not None and s.last_seen_mono > s.alive_lost_mono:
                    s.alive_lost_mono = None  # it kept speaking: the token drop was not the client leaving (spoofed)
                elif s.alive_lost_mono is not None and now - s.alive_lost_mono >= grace:
                    self.close_session(s, f"client liveliness lost for {grace:g} s")
                elif idle > 0 and now - s.last_seen_mono > idle:
                    # a paused robot loses nothing: its next observation gets UNKNOWN_SESSION and it re-handshakes
                    self.close_session(s, f"no observation for {idle:g} s (response_tracking.disconnect_timeout_s)")
            self.metrics.set("queue_depth", self.mailbox.depth(), model=self.info.model_id)
            self.recent_queue_wait_ms.tick()
            self.recent_inference_ms.tick()

    def drain(self, reason: str = "SIGTERM") -> None:
        """Refuse new work, tell every client, wait for the batch in flight, then stop."""
        if self.draining:
            return
        timeout = self.m.drain.timeout_s
        self.draining = True
        self.ready = False
        deadline = time.monotonic() + timeout
        notice = DrainNotice(self.info.replica_id, reason, deadline_ms=timeout * 1e3)
        for s in self.sessions.all():
            try:
                s.publisher.put(notice.encode(), attachment=Header(1, MsgType.EVENT, 0, s.episode_id).pack())
            except Exception:
                self.metrics.inc("send_errors", model=self.info.model_id)
        self.dispatcher.wait_idle(deadline)
        log.info("drained (%s): %d sessions notified", reason, len(self.sessions))
        self.stop()

    def stop(self) -> None:
        if self.stopped.is_set():
            return
        self.stopped.set()
        if hasattr(self, "mailbox"):
            self.mailbox.close()
        self.dispatcher.close()  # no dispatch loop starts after this
        threads = list(self._threads)
        for t in threads:
            t.join(timeout=5)
        tok = getattr(self, "_token", None)
        for d in [tok, *reversed(self._decl)]:
            try:
                if d is not None:
                    d.undeclare()
            except Exception:
                pass
        for s in self.sessions.all():
            try:
                s.publisher.undeclare()
            except Exception:
                pass
        if getattr(self, "runtime", None) is not None:
            self.runtime.forward.close()  # a Ray Serve app of this replica goes with it
        if self._shared is not None:
            return  # the process closes its Zenoh session and audit log
        if self._router_link is not None:
            self._router_link.close()
        if self.z is not None:
            try:
                self.z.close()
            except Exception:
                pass
        if getattr(self, "health", None) is not None:
            self.health.stop()
        self.audit.close()
