"""A conformance run against any policy server: `python3 -m wire.conformance --router ENDPOINT --model ID`.

It speaks only docs/wire-protocol.md (raw Zenoh, this package's codecs; no edge engine, no server
code), sends every client message kind, the error cases a client can provoke and hostile traffic,
and prints one PASS/FAIL/SKIP line per numbered spec clause. Exit 0 when nothing failed, 1 when a
clause failed, 2 when the server cannot be reached or discovered.

Invariant: each check uses its own client uuid where an answer is expected, so the server's cap of
one error per client and code per second (spec 5.4) never hides an answer; hostile traffic that the
spec says is dropped is judged by silence followed by a served observation of the same session.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid as uuidlib
from collections import deque

import msgpack
import numpy as np

from wire import auth as wauth
from wire.errors import WireError
from wire.header import Header, MsgType, unpack_header
from wire.images import EncodedImage, encode_image
from wire.keys import DEFAULT_ROOT, ReplicaKeys, task_slug
from wire.messages import (
    ActionChunk,
    Observation,
    Reset,
    ResetAck,
    SessionAck,
    SessionOpen,
    Status,
    StatusRequest,
    decode_message,
)
from wire.qos import declare_publisher
from wire.version import SCHEMA_VERSION

CONTROL = Header(SCHEMA_VERSION, MsgType.CONTROL).pack()


class _Robot:
    """One client uuid: its keys, action subscriber, obs publisher, liveliness token."""

    def __init__(self, z, rk: ReplicaKeys, task: str, uuid: str):
        self.z, self.rk, self.uuid = z, rk, uuid
        self.keys = rk.client(task, uuid)
        self.inbox: deque = deque()
        self.cv = threading.Condition()
        self.sub = z.declare_subscriber(self.keys.action, self._on)
        self.pub = declare_publisher(z, self.keys.obs, "obs")
        self.token = z.liveliness().declare_token(self.keys.alive)
        self.ack: SessionAck | None = None
        self.seq = 0
        self.images: dict = {}

    def _on(self, sample):
        try:
            h = unpack_header(sample.attachment.to_bytes() if sample.attachment is not None else None)
            m = decode_message(sample.payload.to_bytes())
        except WireError as exc:
            h, m = None, exc
        with self.cv:
            self.inbox.append((h, m))
            self.cv.notify_all()

    def query(self, key, body: bytes, attachment: bytes | None = CONTROL, timeout=3.0):
        kw = {} if attachment is None else {"attachment": attachment}
        for r in self.z.get(key, payload=body, timeout=timeout, **kw):
            if r.ok is not None:
                att = r.ok.attachment
                return (unpack_header(att.to_bytes()) if att is not None else None), decode_message(
                    r.ok.payload.to_bytes()
                )
        return None, None

    def obs(self, state, header: Header | None = None, body: bytes | None = None, sign=True, session_id=None, **kw):
        self.seq += 1
        h = header or Header(SCHEMA_VERSION, MsgType.OBS, self.seq, 0, time.monotonic_ns(), 0)
        raw_h = h.pack()
        if body is None:
            sid = session_id if session_id is not None else (self.ack.session_id if self.ack else "none")
            if sign and self.ack is not None:
                kw["auth"] = wauth.obs_tag(self.ack.session_key, sid, raw_h)
            kw.setdefault("images", self.images)  # a camera policy refuses an observation without its frames
            a = np.asarray(state)
            body = Observation(sid, a if a.dtype == np.float64 else a.astype(np.float32), **kw).encode()
        self.pub.put(body, attachment=raw_h)
        return h.seq_id

    def answer(self, seq, timeout):
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                for i, (h, m) in enumerate(self.inbox):
                    if h is not None and h.seq_id == seq:
                        del self.inbox[i]
                        return h, m
                left = deadline - time.monotonic()
                if left <= 0:
                    return None, None
                self.cv.wait(left)

    def close(self):
        for d in (self.token, self.sub, self.pub):
            try:
                d.undeclare()
            except Exception:
                pass


class Run:
    def __init__(self, args):
        self.args = args
        self.results: list[tuple[str, str, str]] = []

    def check(self, clause: str, what: str, ok: bool | None, detail: str = "") -> None:
        verdict = "SKIP" if ok is None else "PASS" if ok else "FAIL"
        self.results.append((clause, what, verdict))
        print(f"{verdict}  {clause:<5} {what}" + (f"  ({detail})" if detail and verdict != "PASS" else ""), flush=True)


def _code(m) -> str:
    return getattr(m, "code", type(m).__name__ if m is not None else "no answer")


def run(args) -> int:
    from wire.transport import open_session

    r = Run(args)
    try:
        z = open_session(connect=[args.router], what="conformance client")
    except Exception as exc:
        print(f"cannot connect to router {args.router}: {exc}", file=sys.stderr)
        return 2
    robots: list[_Robot] = []
    try:
        key = f"{args.root}/{args.model}/*/*/status"
        replies = [
            rep
            for rep in z.get(
                key, payload=StatusRequest("conformance").encode(), attachment=CONTROL, timeout=args.timeout
            )
            if rep.ok is not None
        ]
        statuses = []
        for rep in replies:
            try:
                statuses.append((str(rep.ok.key_expr), decode_message(rep.ok.payload.to_bytes())))
            except WireError:
                pass
        st = next(
            (s for k, s in statuses if isinstance(s, Status) and (not args.replica or s.replica_id == args.replica)),
            None,
        )
        if st is None:
            print(f"no replica of model {args.model!r} answered {key} within {args.timeout:g} s", file=sys.stderr)
            return 2
        rk = ReplicaKeys(st.model_id, st.revision, st.replica_id, root=args.root)
        r.check(
            "2",
            "discovery with the revision wildcard: a status on the replica's own key",
            any(k == rk.status for k, s in statuses if isinstance(s, Status) and s.replica_id == st.replica_id),
        )
        bare = list(z.get(rk.status, timeout=args.timeout))
        r.check(
            "1",
            "a status query without body or header is answered",
            any(b.ok is not None and isinstance(decode_message(b.ok.payload.to_bytes()), Status) for b in bare),
        )
        task = st.default_task
        state = np.zeros(st.state_dim, np.float32)

        def robot():
            b = _Robot(z, rk, task_slug(task), f"conf-{uuidlib.uuid4().hex[:12]}")
            robots.append(b)
            return b

        def open_body(b, **kw):
            body = dict(
                client_uuid=b.uuid,
                schema_version=SCHEMA_VERSION,
                fps=st.trained_fps,
                action_names=list(st.action_names),
                state_dim=st.state_dim,
                cameras=dict(st.cameras),
                task=task,
            )
            body.update(kw)
            return SessionOpen(**body).encode()

        # --- session open: control header (1, 3) and the validation matrix (6)
        b = robot()
        for att, what in (
            (None, "no attachment"),
            (b"\x01" * 11, "an 11-byte header"),
            (Header(SCHEMA_VERSION, MsgType.OBS).pack(), "msg_type OBS"),
        ):
            _, m = b.query(b.keys.session, open_body(b), attachment=att, timeout=args.timeout)
            r.check("1", f"session open with {what} -> MALFORMED", _code(m) == "MALFORMED", _code(m))
        for clause, what, kw, code in (
            ("8", "schema_version 99", dict(schema_version=99), "SCHEMA_VERSION"),
            ("6", "state_dim + 1", dict(state_dim=st.state_dim + 1), "STATE_DIM_MISMATCH"),
            ("6", "action names reversed", dict(action_names=list(reversed(st.action_names))), "ACTION_MISMATCH"),
            ("6", "another checkpoint pinned", dict(expected_checkpoint_hash="0" * 64), "WRONG_MODEL"),
            ("5.5", "another uuid in the body", dict(client_uuid="someone-else"), "IDENTITY_MISMATCH"),
            ("6", "a camera missing", dict(cameras={}), "CAMERA_MISMATCH"),
        ):
            if code == "ACTION_MISMATCH" and len(st.action_names) < 2 or code == "CAMERA_MISMATCH" and not st.cameras:
                r.check(clause, f"session open with {what} -> {code}", None, "not applicable to this policy")
                continue
            _, m = b.query(b.keys.session, open_body(b, **kw), timeout=args.timeout)
            r.check(clause, f"session open with {what} -> {code}", _code(m) == code, _code(m))
        h, ack = b.query(b.keys.session, open_body(b), timeout=args.timeout)
        ok = isinstance(ack, SessionAck)
        r.check(
            "5.1",
            "session open -> session_ack with a 64-hex session_key and the effective task",
            ok and len(ack.session_key or "") == 64 and ack.task == task and ack.checkpoint_hash == st.checkpoint_hash,
            _code(ack),
        )
        if not ok:
            return 1
        b.ack = ack

        # --- streaming (5.1, 3, 4.2)
        images = {n: encode_image(np.full((s[0], s[1], s[2]), 128, np.uint8)) for n, s in st.cameras.items()}
        b.images = images
        t0 = time.monotonic_ns()
        seq = b.obs(state, header=Header(SCHEMA_VERSION, MsgType.OBS, 1, 0, t0, 5), images=images, episode_start=True)
        b.seq = 1
        h, m = b.answer(seq, args.timeout)
        ok = (
            isinstance(m, ActionChunk)
            and h.msg_type == MsgType.CHUNK
            and (h.seq_id, h.client_mono_ns, h.session_epoch) == (1, t0, 5)
            and m.seq_id_echo == 1
            and m.chunk_robot.shape == (st.chunk_size, len(st.action_names))
            and m.chunk_robot.dtype == np.float32
        )
        r.check(
            "5.1",
            "observation -> action_chunk echoing seq_id, client_mono_ns, session_epoch; (T, A) float32",
            ok,
            _code(m),
        )
        r.check(
            "4.2",
            "JPEG frames of every camera the policy consumes are served",
            ok if st.cameras else None,
            "the policy uses no camera",
        )
        if st.cameras:
            bad = {n: EncodedImage("jpeg", b"\xff\xd8\xff\xe0 not a jpeg", tuple(s)) for n, s in st.cameras.items()}
            seq = b.obs(state, images=bad)
            h, m = b.answer(seq, args.timeout)
            r.check(
                "4.2",
                "a corrupt JPEG -> BAD_IMAGE",
                _code(m) == "BAD_IMAGE",
                f"{_code(m)}: {getattr(m, 'message', '')}",
            )
        seq = b.obs(state.astype(np.float64))
        h, m = b.answer(seq, args.timeout)
        r.check("4.1", "a float64 state is served", isinstance(m, ActionChunk), _code(m))

        # --- refused observations, each answered once (4.1, 4.3, 8)
        seq = b.obs(np.zeros(st.state_dim + 1, np.float32))
        _, m = b.answer(seq, args.timeout)
        r.check("4.1", "a state of the wrong length -> STATE_DIM_MISMATCH", _code(m) == "STATE_DIM_MISMATCH", _code(m))
        b.seq += 1
        hv = Header(99, MsgType.OBS, b.seq, 0, time.monotonic_ns(), 0)
        seq = b.obs(state, header=hv)
        h, m = b.answer(seq, args.timeout)
        r.check(
            "8",
            "an observation header with schema_version 99 -> SCHEMA_VERSION, never served",
            _code(m) == "SCHEMA_VERSION" and h.schema_version == SCHEMA_VERSION,
            _code(m),
        )
        b.seq += 1
        hb = Header(SCHEMA_VERSION, MsgType.OBS, b.seq, 0, time.monotonic_ns(), 0)
        body = msgpack.unpackb(
            Observation(ack.session_id, state, auth=wauth.obs_tag(ack.session_key, ack.session_id, hb.pack())).encode()
        )
        body["state"]["data"] = body["state"]["data"][:-1]
        seq = b.obs(None, header=hb, body=msgpack.packb(body))
        _, m = b.answer(seq, args.timeout)
        r.check(
            "4.1", "tensor bytes that do not match dtype and shape -> BAD_TENSOR", _code(m) == "BAD_TENSOR", _code(m)
        )
        if args.max_observation_bytes:
            seq = b.obs(state, tensors={"pad": np.zeros(args.max_observation_bytes // 4 + 16, np.float32)})
            _, m = b.answer(seq, args.timeout)
            r.check(
                "4.3",
                f"an observation over {args.max_observation_bytes} bytes -> TOO_LARGE",
                _code(m) == "TOO_LARGE",
                _code(m),
            )
        else:
            r.check("4.3", "an oversized observation -> TOO_LARGE", None, "pass --max-observation-bytes")

        # --- hostile traffic on a key with a session: dropped unanswered, the session unharmed (5.5)
        silent = []
        for what, kw in (
            ("unsigned", dict(sign=False)),
            ("a wrong tag", dict(sign=False, auth="0" * 32)),
            ("another session id", dict(session_id="not-" + ack.session_id)),
        ):
            seq = b.obs(state, **kw)
            silent.append((what, b.answer(seq, 0.5)[1]))
        b.seq += 1
        b.pub.put(b"\x93\x01\x02\x03", attachment=Header(SCHEMA_VERSION, MsgType.OBS, b.seq).pack())
        silent.append(("garbage body", b.answer(b.seq, 0.5)[1]))
        seq = b.obs(state)
        _, m = b.answer(seq, args.timeout)
        loud = [w for w, a in silent if a is not None]
        r.check(
            "5.5",
            "unproven observations on a session's key are dropped unanswered; the session is still served",
            not loud and isinstance(m, ActionChunk),
            f"answered: {loud}; then {_code(m)}",
        )

        # --- reset (5.2)
        _, m = b.query(
            b.keys.reset,
            Reset(ack.session_id, 4, auth=wauth.reset_tag(ack.session_key, ack.session_id, 4)).encode(),
            attachment=None,
            timeout=args.timeout,
        )
        r.check("1", "reset without a header -> MALFORMED", _code(m) == "MALFORMED", _code(m))
        _, m = b.query(
            b.keys.reset,
            Reset(ack.session_id, 4, auth="0" * 32).encode(),
            attachment=Header(SCHEMA_VERSION, MsgType.CONTROL, 0, 4).pack(),
            timeout=args.timeout,
        )
        r.check("5.5", "reset with a wrong tag -> IDENTITY_MISMATCH", _code(m) == "IDENTITY_MISMATCH", _code(m))
        h, m = b.query(
            b.keys.reset,
            Reset(ack.session_id, 4, auth=wauth.reset_tag(ack.session_key, ack.session_id, 4)).encode(),
            attachment=Header(SCHEMA_VERSION, MsgType.CONTROL, 0, 4).pack(),
            timeout=args.timeout,
        )
        r.check(
            "5.2",
            "reset -> reset_ack; header and body carry the new episode",
            isinstance(m, ResetAck) and m.episode_id == 4 and h is not None and h.episode_id == 4,
            _code(m),
        )

        # --- another client (5.4, 5.5)
        c = robot()
        seq = c.obs(state, session_id="no-such-session", sign=False)
        _, m = c.answer(seq, args.timeout)
        r.check("5.4", "an unknown session id -> UNKNOWN_SESSION", _code(m) == "UNKNOWN_SESSION", _code(m))
        seq = c.obs(state, session_id=ack.session_id, sign=False)
        _, m = c.answer(seq, args.timeout)
        r.check(
            "5.5",
            "another client's session id on a key without a session -> IDENTITY_MISMATCH",
            _code(m) == "IDENTITY_MISMATCH",
            _code(m),
        )
        d = robot()
        seq = d.obs(None, body=b"\x93\x01\x02\x03")
        _, m = d.answer(seq, args.timeout)
        r.check(
            "6",
            "a body that is not an observation (key without a session) -> MALFORMED",
            _code(m) == "MALFORMED",
            _code(m),
        )
        _, m = b.query(b.keys.session, open_body(b), timeout=args.timeout)
        r.check(
            "5.5",
            "a second open of a live session without its proof -> SESSION_LIVE",
            _code(m) == "SESSION_LIVE",
            _code(m),
        )
        _, m = b.query(
            b.keys.session,
            open_body(
                b,
                previous_session_id=ack.session_id,
                previous_auth=wauth.reopen_tag(ack.session_key, ack.session_id, b.uuid),
            ),
            timeout=args.timeout,
        )
        r.check("5.5", "a re-handshake with previous_auth -> session_ack", isinstance(m, SessionAck), _code(m))
        r.check("5.3", "drain notice", None, "needs the server stopped; not sent by a client")
    finally:
        for b in robots:
            b.close()
        z.close()
    failed = [x for x in r.results if x[2] == "FAIL"]
    print(
        f"{sum(x[2] == 'PASS' for x in r.results)} passed, {len(failed)} failed, "
        f"{sum(x[2] == 'SKIP' for x in r.results)} skipped"
    )
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m wire.conformance", description=__doc__.split("\n\n")[0])
    p.add_argument("--router", required=True, help="Zenoh router endpoint, e.g. tcp/127.0.0.1:7447")
    p.add_argument("--model", required=True, help="model_id to discover")
    p.add_argument("--replica", default="", help="replica_id (default: the first that answers)")
    p.add_argument("--root", default=DEFAULT_ROOT)
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for each answer")
    p.add_argument(
        "--max-observation-bytes",
        type=int,
        default=0,
        help="the server's security.max_observation_bytes, to check TOO_LARGE (0 = skip)",
    )
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
