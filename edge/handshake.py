"""The handshake: opening a session, replica after replica, and the verdicts it can end in.

edge.client.Model drives it; docs/protocol-contract.md is the contract.

On one replica: liveliness token on the client's own `alive` key, action subscriber, liveliness subscriber on
the replica's token and obs publisher are declared (`declare`), then the session-open query goes to the
client's own `session` key. A re-handshake on the same replica proves it owned the session it replaces
(previous_auth, keyed by the last SessionAck.session_key).

The ladder (`open_ladder`): CAPACITY, EXCLUSIVE_BUSY, DRAINING, NOT_READY, SESSION_LIVE, a replica that does
not answer its session query and one that answers neither an ack nor an error (`BrokenReplica`) move on to
the next replica; any other refusal raises `SessionRefused` (never run an incompatible model), and so does
an ack that promises another model than the one asked for (`ack_disagreement`); nothing left raises
`NoReplica`. `ControlTimeouts` says how long each round's queries wait.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from wire import (
    SCHEMA_VERSION,
    Error,
    ErrorCode,
    Header,
    MsgType,
    Reset,
    SessionAck,
    SessionOpen,
    Status,
    WireError,
    decode_message,
)
from wire import auth as wauth
from wire.qos import CONTROL_TIMEOUTS_S, declare_publisher

RETRY_ELSEWHERE = {
    ErrorCode.CAPACITY,
    ErrorCode.EXCLUSIVE_BUSY,
    ErrorCode.DRAINING,
    ErrorCode.NOT_READY,
    ErrorCode.SESSION_LIVE,
}  # SESSION_LIVE: our previous process's session is not gone yet


class SessionRefused(Exception):
    """The server refused the session for a reason another replica would not fix."""

    def __init__(self, code: str, message: str, details: dict | None = None):
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.details = code, message, dict(details or {})


class BrokenReplica(Exception):
    """A replica answered the session open with something that is neither an ack nor a refusal (undecodable,
    another message): a broken replica, not a verdict on the model, so `open` moves on to the next one."""


class NoReplica(ConnectionError):
    """No replica answered, or every replica refused for capacity/draining reasons. `unanswered`: no replica
    answered in time at all (discovery waited out its timeout with nothing, or every session query did): the
    link, or every replica, is slower than the timeouts. A refusal in words (CAPACITY, NOT_READY...) is an
    answer; so is an empty discovery that came back at once (the router knows no replica to ask)."""

    def __init__(self, message: str, unanswered: bool = False):
        super().__init__(message)
        self.unanswered = unanswered


class ControlTimeouts:
    """How long the next handshake round waits for replies, per control query (`CONTROL_TIMEOUTS_S` names).

    With fixed timeouts a link whose round trip is over them fails every round the same way until the robot
    goes DEAD (docs/bench.md, "1,000 robots on this host"). So: after a round in which no replica answered in
    time (`grow`), the status and session timeouts double, up to `max_s`; a session opened (`settle`) brings
    them back to the base (a refusal in words changes nothing: it came in time, at the timeouts it had). Every
    timeout is also at least twice the link's measured round trip plus `MARGIN_S` (`seed`: a robot that lost its
    session on a slow link reopens without a failing round first).

    Invariant: base <= timeout_s(name) <= max(max_s, base), whatever was grown or seeded."""

    GROWING = ("status", "session")  # the handshake's queries; reset is seeded, never grown (it is not awaited)
    MARGIN_S = 0.5

    def __init__(self, max_s: float, base: dict[str, float] | None = None):
        self.base = dict(CONTROL_TIMEOUTS_S if base is None else base)
        self.max_s = float(max_s)
        self.grown_s = 0.0  # the growing queries' timeout after rounds no replica answered; 0: none since an answer
        self.rtt_s = 0.0

    def timeout_s(self, name: str) -> float:
        base = self.base[name]
        grown = self.grown_s if name in self.GROWING else 0.0
        seeded = 2.0 * self.rtt_s + self.MARGIN_S if self.rtt_s > 0 else 0.0
        return max(base, min(max(grown, seeded), self.max_s))

    def grow(self) -> None:
        """No replica answered in time this round: wait twice as long next round (at most max_s)."""
        self.grown_s = min(2.0 * max(self.timeout_s(n) for n in self.GROWING), self.max_s)

    def settle(self) -> None:
        """A session opened: back to the base (and the seed)."""
        self.grown_s = 0.0

    def seed(self, rtt_s: float) -> None:
        """The link's measured round trip (0: none known)."""
        v = float(rtt_s)
        self.rtt_s = v if math.isfinite(v) and v > 0 else 0.0


def camera_shapes(cameras: dict[str, list[int]] | list[str] | tuple | None) -> dict[str, list[int]]:
    """Camera name -> [h, w, c] for the session open. Names alone get a placeholder shape [1, 1, 3]: the
    server checks names (coverage) and only warns about aspect ratios, so shapes are advisory."""
    if not cameras:
        return {}
    if isinstance(cameras, dict):
        return {str(k): [int(d) for d in v] for k, v in cameras.items()}
    return {str(name): [1, 1, 3] for name in cameras}


def open_ladder(
    discover: Callable[[float], list[Status]],
    open_on: Callable[[Status, float], SessionAck],
    *,
    model_id: str,
    revision: str,
    root: str,
    exclude: set[str] | frozenset,
    replica_order: list[str],
    status_timeout_s: float,
    session_timeout_s: float,
    deadline: float | None,
) -> SessionAck:
    """Discover (`discover(timeout_s)`) and open a session (`open_on(status, timeout_s)`) on the best replica
    not in `exclude`; see the module docstring for which outcomes move on. `deadline` (monotonic s): no query
    waits past it (the caller's offline budget)."""

    def wait_s(timeout_s: float) -> float:
        return timeout_s if deadline is None else max(min(timeout_s, deadline - time.monotonic()), 0.01)

    waited, t0 = wait_s(status_timeout_s), time.monotonic()
    found = discover(waited)
    replicas = [s for s in found if s.replica_id not in exclude]
    if replica_order:
        replicas = [s for s in replicas if s.replica_id in replica_order] or replicas
    if not replicas:
        elapsed = time.monotonic() - t0
        # ran out of time, not "the router knows no replica" (that answer comes at once, and waiting longer
        # would not change it)
        timed_out = not found and elapsed >= 0.9 * waited
        wait = f"waited {elapsed:.1f} s, timeout {waited:.1f} s; excluded: {sorted(exclude) or 'none'}"
        if found:  # they answered, and each is excluded (drained, or tried this round)
            raise NoReplica(
                f"no replica of {model_id}@{revision} under {root} is left to "
                f"try: {sorted(s.replica_id for s in found)} answered and all are excluded ({wait})"
            )
        if timed_out:
            raise NoReplica(
                f"no replica of {model_id}@{revision} answered under {root} "
                f"({wait}); is the server running and connected to the router, and is the round "
                f"trip of the link under the timeout?",
                unanswered=True,
            )
        # empty before the timeout: the router knows no server of this model id and revision (a typo in
        # either, or the server is not running or not on this router)
        raise NoReplica(
            f"no server serves model_id {model_id!r} revision {revision!r} under "
            f"{root} on this router ({wait}: the router answered, and knows no replica "
            f"of it); check model_id and revision against the server's manifest "
            f"(model_id, model.revision, root) and that the server is running and connected to the "
            f"same router"
        )
    refusals, timeouts = [], 0
    for st in replicas:
        if not st.ready or st.draining:
            refusals.append(f"{st.replica_id}: {'DRAINING' if st.draining else 'NOT_READY'}")
            continue
        waited, t0 = wait_s(session_timeout_s), time.monotonic()
        try:
            return open_on(st, waited)
        except SessionRefused as exc:
            if exc.code not in RETRY_ELSEWHERE:
                raise
            refusals.append(f"{st.replica_id}: {exc.code}")
        except BrokenReplica as exc:
            refusals.append(str(exc))
        except TimeoutError:
            elapsed = time.monotonic() - t0
            timeouts += elapsed >= 0.9 * waited  # at once: the replica's queryable is gone (it died), not slow
            refusals.append(
                f"{st.replica_id}: no answer to the session query (waited {elapsed:.1f} s, timeout "
                f"{waited:.1f} s: a dead or hung replica, or a link slower than the timeout)"
            )
    unanswered = timeouts == len(refusals)
    raise NoReplica(
        f"{'no replica' if unanswered else 'every replica'} of {model_id} "
        f"{'answered its session query' if unanswered else 'refused'}: {'; '.join(refusals)}",
        unanswered=unanswered,
    )


def declare(z, keys, rk, on_action: Callable, on_server_alive: Callable, into: list):
    """Declare one session's entities on Zenoh session `z`: the client's liveliness token, the action subscriber,
    the subscriber on the replica's token (appended to `into` as each is declared, so a failure part way leaves
    them for the caller to undeclare), and the obs publisher, returned. indirect=False: the callbacks run on
    Zenoh's own thread, no Python thread per subscriber."""
    import zenoh

    into.append(z.liveliness().declare_token(keys.alive))
    into.append(z.declare_subscriber(keys.action, zenoh.handlers.Callback(on_action, indirect=False)))
    into.append(
        z.liveliness().declare_subscriber(
            rk.alive, zenoh.handlers.Callback(on_server_alive, indirect=False), history=True
        )
    )
    return declare_publisher(z, keys.obs, "obs")


def open_body(
    client_id: str, client_type: str, open_args: dict, task: str, replica_id: str, prev: SessionAck | None
) -> SessionOpen:
    """The SessionOpen for `replica_id`; with the previous session's proof when `prev` was on the same replica."""
    body = SessionOpen(
        client_uuid=client_id, schema_version=SCHEMA_VERSION, client_type=client_type, **{**open_args, "task": task}
    )
    if prev is not None and prev.replica_id == replica_id and prev.session_key:
        # a re-handshake proves it owns the session it replaces (server.guard: a live session is never hijacked)
        body.previous_session_id = prev.session_id
        body.previous_auth = wauth.reopen_tag(prev.session_key, prev.session_id, client_id)
    return body


def accept(reply, replica_id: str, model_id: str, revision: str, open_args: dict) -> SessionAck:
    """The SessionAck `reply` when it is one that promises what was asked; else raises SessionRefused (a refusal,
    or an ack that disagrees) or BrokenReplica (neither an ack nor an error)."""
    if isinstance(reply, Error):
        raise SessionRefused(reply.code, reply.message, reply.details)
    if not isinstance(reply, SessionAck):
        # before, a SessionRefused(MALFORMED): the robot went DEAD though a sound replica served the model
        what = f"undecodable reply ({reply})" if isinstance(reply, WireError) else type(reply).__name__
        raise BrokenReplica(f"{replica_id}: session open answered with {what}")
    disagreement = ack_disagreement(reply, replica_id, model_id, revision, open_args)
    if disagreement is not None:
        raise SessionRefused(*disagreement)  # the caller undeclares: the replica forgets it after its grace period
    return reply


def ack_disagreement(
    ack: SessionAck, replica_id: str, model_id: str, revision: str, open_args: dict
) -> tuple[str, str] | None:
    """(code, message) when the ack promises another model than the one asked for, else None.

    A replica acknowledges only what it serves (it refuses any mismatch in words), so an ack that disagrees
    with the request is a broken or hostile replica: before, the engine streamed from it and executed
    chunks of its width (a 5-column chunk on a 3-action robot)."""
    a = open_args
    if ack.model_id != model_id or ack.revision != revision:
        return ErrorCode.WRONG_MODEL, (
            f"replica {replica_id} acknowledged {ack.model_id}@{ack.revision}; this "
            f"client asked for {model_id}@{revision}"
        )
    if a["action_names"] and list(ack.action_names) != a["action_names"]:
        return ErrorCode.ACTION_MISMATCH, (
            f"replica {replica_id} acknowledged action_names "
            f"{list(ack.action_names)}; this client drives {a['action_names']}"
        )
    if a["state_dim"] and ack.state_dim != a["state_dim"]:
        return ErrorCode.STATE_DIM_MISMATCH, (
            f"replica {replica_id} acknowledged state_dim {ack.state_dim}; this client sends {a['state_dim']}"
        )
    if a["expected_checkpoint_hash"] and ack.checkpoint_hash != a["expected_checkpoint_hash"]:
        return ErrorCode.WRONG_MODEL, (
            f"replica {replica_id} acknowledged checkpoint {ack.checkpoint_hash!r}; "
            f"this client pinned {a['expected_checkpoint_hash']!r}"
        )
    if a["policy_type"] and ack.policy_type != a["policy_type"]:
        return ErrorCode.WRONG_MODEL, (
            f"replica {replica_id} acknowledged policy_type {ack.policy_type!r}; this "
            f"client asked for {a['policy_type']!r}"
        )
    if ack.chunk_size < 1:
        return ErrorCode.MALFORMED, f"replica {replica_id} acknowledged chunk_size {ack.chunk_size}; it must be >= 1"
    return None


def control_query(z, key: str, body, timeout_s: float, episode_id: int = 0):
    """One control query (session open, reset): the first reply decoded, a WireError for one that does not
    decode (neither an answer nor a refusal), TimeoutError for none within `timeout_s`."""
    header = Header(SCHEMA_VERSION, MsgType.CONTROL, 0, episode_id).pack()
    for reply in z.get(key, payload=body.encode(), attachment=header, timeout=timeout_s):
        if reply.ok is None:
            continue
        try:
            return decode_message(reply.ok.payload.to_bytes())
        except WireError as exc:
            return exc  # undecodable: neither an answer nor a refusal (a reset is not acknowledged by it)
    raise TimeoutError(f"no reply on {key} within {timeout_s} s")


def reset_body(ack: SessionAck, episode_id: int) -> Reset:
    """The Reset of `ack`'s session to `episode_id`, tagged with the session key when the session has one."""
    tag = wauth.reset_tag(ack.session_key, ack.session_id, int(episode_id)) if ack.session_key else None
    return Reset(ack.session_id, int(episode_id), auth=tag)
