"""Per-session protection of one replica: identity proofs, size and rate limits, denial accounting.

    obs sample ──► key uuid ──► peek(session_id, auth) ──► session of that uuid? ──► tag ok? ──► size ok?
                                 (no full decode)          no: silent drop          no: drop   no: TOO_LARGE
                   ──► token bucket ok? ──► full decode ──► mailbox
                        no: RATE_LIMITED (to that session only, at most max_request_rate_hz answers/s)

Owns `Guard` (the manifest's `security` block applied), `TokenBucket` and `peek_identity`.

Invariants:
- Nothing unauthenticated is ever answered on a key whose client holds a live session: an answer
  there (UNKNOWN_SESSION, IDENTITY_MISMATCH, MALFORMED) would let anyone make an honest robot
  re-handshake or give up. Such traffic is dropped, counted in `security_denials{reason}` and
  written to the audit log (at most one line per client and reason per second, with the count).
- A limit charged to a session is charged only after its proof checked out, so forged traffic on
  a robot's key can never use up that robot's rate budget.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import msgpack

from wire import auth as wauth

AUDIT_EVERY_S = 1.0
TOKEN_LOSS_CONFIRM_S = 1.0  # a client token gone this long with no observation since: the client left


@dataclass
class TokenBucket:
    """`burst` requests at once, then `rate_hz` per second; rate 0 = no limit."""

    rate_hz: float
    burst: float
    tokens: float = 0.0
    stamp: float | None = None

    def take(self, now: float | None = None) -> bool:
        if self.rate_hz <= 0:
            return True
        now = time.monotonic() if now is None else now
        if self.stamp is None:
            self.tokens, self.stamp = self.burst, now
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.stamp) * self.rate_hz)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


def peek_identity(raw: bytes, max_entries: int = 64) -> tuple[str | None, str | None]:
    """(session_id, auth) of an observation body without decoding its tensors or images.

    Walks the top-level msgpack map and skips every other value; returns (None, None) on anything
    that is not a map of string keys. Cost: a few microseconds whatever the frame size."""
    try:
        up = msgpack.Unpacker(raw=False, max_buffer_size=max(len(raw), 1), max_ext_len=0)
        up.feed(raw)
        n = up.read_map_header()
        if n > max_entries:
            return None, None
        sid = tag = None
        for _ in range(n):
            k = up.unpack()
            if k == "session_id" or k == "auth":
                v = up.unpack()
                if isinstance(v, str):
                    if k == "session_id":
                        sid = v
                    else:
                        tag = v
            else:
                up.skip()
        return sid, tag
    except Exception:  # msgpack raises many types on garbage; garbage has no identity
        return None, None


class Guard:
    """The `security` manifest block of one replica, plus the denial counters and audit throttle."""

    def __init__(self, cfg, metrics, audit, replica_id: str, default_max_bytes: int):
        def g(key: str, default):
            v = cfg.get(key) if isinstance(cfg, dict) else getattr(cfg, key, None)
            return default if v is None else v

        self.require_session_auth = bool(g("require_session_auth", True))
        self.max_observation_bytes = int(g("max_observation_bytes", None) or default_max_bytes)
        self.max_request_rate_hz = float(g("max_request_rate_hz", 100.0))
        self.request_burst = float(g("request_burst", 0) or max(1.0, self.max_request_rate_hz))
        self.max_sessions_per_client = int(g("max_sessions_per_client", 4) or 4)
        self.reopen_idle_s = float(g("reopen_idle_s", 5.0))
        self.metrics = metrics
        self.audit = audit
        self.replica_id = replica_id
        self._lock = threading.Lock()
        self._last_audit: dict[tuple[str, str], tuple[float, int]] = {}
        self._last_answer: dict[tuple[str, str], float] = {}

    def new_bucket(self) -> TokenBucket:
        return TokenBucket(self.max_request_rate_hz, self.request_burst)

    def obs_ok(self, session, session_id: str | None, tag: str | None, header: bytes) -> bool:
        if not self.require_session_auth or not getattr(session, "session_key", None):
            return True
        return wauth.verify(wauth.obs_tag(session.session_key, session_id or "", header), tag)

    def reset_ok(self, session, req) -> bool:
        if not self.require_session_auth or not getattr(session, "session_key", None):
            return True
        return wauth.verify(wauth.reset_tag(session.session_key, session.session_id, req.episode_id), req.auth)

    def reopen_ok(self, old, req) -> bool:
        if not old.session_key or req.previous_session_id != old.session_id:
            return False
        return wauth.verify(wauth.reopen_tag(old.session_key, old.session_id, req.client_uuid), req.previous_auth)

    def session_live(self, s, now: float | None = None) -> bool:
        """May another open replace `s` without its proof? Not while it is live: it spoke within
        reopen_idle_s, unless its client token went away at least TOKEN_LOSS_CONFIRM_S ago and it has been
        silent since (a restarted robot). A token loss followed by observations was not the client leaving:
        on a router without access rules anyone can declare and drop a token on someone else's key."""
        now = time.monotonic() if now is None else now
        if now - s.last_seen_mono >= self.reopen_idle_s:
            return False
        lost = s.alive_lost_mono
        return not (lost is not None and s.last_seen_mono < lost and now - lost >= TOKEN_LOSS_CONFIRM_S)

    def should_answer(self, client: str, reason: str, now: float | None = None) -> bool:
        """At most one error answer per client and reason per second (a flood must not become a reply flood)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            last = self._last_answer.get((client, reason), -1e9)
            if now - last < AUDIT_EVERY_S:
                return False
            self._last_answer[(client, reason)] = now
            return True

    def deny(
        self, reason: str, client: str, *, session_id: str | None = None, seq_id: int | None = None, detail: str = ""
    ) -> None:
        """Count one denial; write an audit line naming the client identity (throttled per client+reason)."""
        self.metrics.inc("security_denials", reason=reason)
        now = time.monotonic()
        with self._lock:
            if len(self._last_audit) > 10000:  # fabricated identities must not grow this without bound
                self._last_audit.clear()
            last, pending = self._last_audit.get((client, reason), (-1e9, 0))
            pending += 1
            if now - last < AUDIT_EVERY_S:
                self._last_audit[(client, reason)] = (last, pending)
                return
            self._last_audit[(client, reason)] = (now, 0)
        self.audit.write(
            {
                "session_id": session_id,
                "client_uuid": client,
                "seq_id": seq_id,
                "outcome": f"denied:{reason}",
                "denied_count": pending,
                "detail": detail,
                "replica_id": self.replica_id,
            }
        )
