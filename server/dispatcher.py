"""The dispatch plane of one served model: its dispatch loops and the forward passes they run.

Each loop takes micro-batches from the mailbox, runs them through the model runtime and hands each result to the
replies.

    Mailbox.take(max_batch) ──► per request: the session's lock (else requeued), reset on episode_start
                            ──► ModelRuntime.infer(items) ──► Replies.answer (every reply) ──► Replies.book

Owns: `Dispatcher` (the loops, started by the model's first request; the in-flight count a drain waits on).
Invariants: a session has at most one request in a forward pass (its lock); a batch's replies all go out before
any of their bookkeeping; a failed batch is counted (`dispatch_errors`), never raised out of the loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from server.priority import DISPATCH_FIFO_PRIORITY, DISPATCH_PRIORITY_LOG_TEXT
from server.replies import Replies
from server.runtime import InferItem, set_torch_threads
from server.served import Pending, Served
from wire.procs import raise_priority

log = logging.getLogger("policy_server")


class Dispatcher:
    """The dispatch loops of one served model (`max_inflight` of them) and the forward passes they run."""

    def __init__(self, srv: Served, replies: Replies, stopped: threading.Event, spawn: Callable[..., None]):
        self.srv, self.replies, self.stopped, self.spawn = srv, replies, stopped, spawn
        self.inflight = 0  # batches in a forward pass now
        self.inflight_cv = threading.Condition()
        self._lock = threading.Lock()
        self._started = False  # dispatch loops start with this model's first request (design 003)

    def start(self) -> None:
        """This model's dispatch loops, `max_inflight` of them (models.known.<id> or models.default_max_inflight),
        started by its first request."""
        if self._started:
            return
        with self._lock:
            if self._started or self.stopped.is_set():
                return
            srv = self.srv
            models = srv.m.models
            known = models.known.get(srv.info.model_id)
            inflight = known.max_inflight if known is not None else models.default_max_inflight
            for i in range(inflight):
                self.spawn(self.loop, f"dispatch-{srv.info.model_id}-{i}")
            self._started = True
            log.info("dispatch of %s started (%d loops)", srv.info.model_id, inflight)

    def close(self) -> None:
        """No dispatch loop starts after this (the server is stopping)."""
        with self._lock:
            self._started = True

    def wait_idle(self, deadline: float) -> None:
        """Until no batch is in a forward pass, or the monotonic `deadline`."""
        with self.inflight_cv:
            while self.inflight and time.monotonic() < deadline:
                self.inflight_cv.wait(max(0.0, deadline - time.monotonic()))

    def loop(self) -> None:
        srv = self.srv
        set_torch_threads(srv.m.torch_threads)  # per thread: see server.runtime.set_torch_threads
        want = srv.m.dispatch_priority
        log.info(
            "%s%s (asked: %s)",
            DISPATCH_PRIORITY_LOG_TEXT,
            raise_priority(want, DISPATCH_FIFO_PRIORITY, threading.get_native_id()),
            want,
        )
        max_batch = srv.m.scheduling.max_batch
        while not self.stopped.is_set():
            batch = srv.mailbox.take(max_batch, 0.25)  # the micro-batch window is the mailbox's
            if batch.closed:
                return
            self.replies.expired(batch.expired)
            reqs = list(batch.requests)
            if not reqs:
                continue
            with self.inflight_cv:
                self.inflight += 1
                self.inflight_cv.notify_all()  # a drain waits for none in flight; a test for one
            try:
                self.run_batch(reqs, batch.queue_depth)
            except Exception:
                log.exception("dispatch failed for a batch of %d", len(reqs))
                for _ in reqs:
                    srv.metrics.inc("dispatch_errors", model=srv.info.model_id, error="internal")
            finally:
                with self.inflight_cv:
                    self.inflight -= 1
                    self.inflight_cv.notify_all()

    def run_batch(self, reqs: list, queue_depth: int) -> None:
        srv = self.srv
        t_pick = time.monotonic()
        model = srv.info.model_id
        srv.metrics.set("queue_depth", queue_depth, model=model)
        srv.metrics.observe("batch_size", len(reqs), model=model)
        locked: list = []
        items: list[InferItem] = []
        for req in reqs:
            p: Pending = req.payload
            s = p.session
            if not s.lock.acquire(blocking=False):  # this session's previous request is still in flight
                if not srv.mailbox.requeue(req).requeued:
                    srv.metrics.inc("superseded_requests", model=model)
                continue
            locked.append(req)
            obs = p.obs
            if obs.episode_start or s.reset_pending:
                s.reset_pending = False
                s.pipeline.reset()
                if srv.info.serving_mode == "exclusive":
                    with srv.runtime.forward_lock:
                        srv.runtime.reset_policy()
            images = {name: obs.images[name] for name in srv.info.cameras if name in obs.images}
            items.append(
                InferItem(
                    s.pipeline,
                    obs.state,
                    images,
                    obs.inference_delay_steps,
                    obs.prefix_model,
                    obs.prefix_robot,
                    rtc=s.rtc_enabled,
                )
            )
        try:
            if not items:
                return
            results = srv.runtime.infer(items)
            captured, sent = [], []
            for req, res in zip(locked, results):  # every reply first: none waits for its neighbours' bookkeeping
                body = self.replies.answer(req, res, t_pick, sent)
                if body is not None and srv.capture is not None and req.payload.raw is not None:
                    p = req.payload
                    captured.append((p.session, p.header, p.raw, body))
            for args in sent:
                self.replies.book(*args)
            if srv.capture is not None:
                srv.capture.record_batch(captured)
        finally:
            for req in locked:
                req.payload.session.lock.release()
