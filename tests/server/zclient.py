"""A bare protocol client for server tests: raw Zenoh calls, no edge engine, every byte visible."""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np

from wire import (
    SCHEMA_VERSION,
    Header,
    MsgType,
    Observation,
    ReplicaKeys,
    SessionOpen,
    decode_message,
    unpack_header,
)
from wire import auth as wauth
from wire.messages import Reset
from wire.qos import declare_publisher
from wire.transport import open_session


class RawClient:
    def __init__(self, endpoint: str, keys: ReplicaKeys, uuid: str, task: str = "", session=None):
        self.z = session or open_session(connect=[endpoint], what="test client")
        self.own_session = session is None
        self.rk = keys
        self.uuid = uuid
        self.task = task
        self.keys = keys.client(task or "default", uuid)
        self.inbox: deque = deque()
        self.cv = threading.Condition()
        self.sub = self.z.declare_subscriber(self.keys.action, self._on)
        self.pub = declare_publisher(self.z, self.keys.obs, "obs")
        self.token = self.z.liveliness().declare_token(self.keys.alive)
        self.session_id = ""
        self.seq = 0
        self.ack = None
        self.last_header = None

    def _on(self, sample):
        h = unpack_header(sample.attachment.to_bytes())
        msg = decode_message(sample.payload.to_bytes())
        with self.cv:
            self.inbox.append((h, msg, time.monotonic_ns()))
            self.cv.notify_all()

    def query(self, key: str, body, timeout=3.0, attachment: bytes | None | str = "header"):
        """One control query; `attachment` overrides the CONTROL header (None sends none). The reply's header
        is kept in `last_header`."""
        if isinstance(attachment, str):
            attachment = Header(SCHEMA_VERSION, MsgType.CONTROL).pack()
        kw = {} if attachment is None else {"attachment": attachment}
        replies = list(self.z.get(key, payload=body.encode(), timeout=timeout, **kw))
        for r in replies:
            if r.ok is not None:
                att = r.ok.attachment
                self.last_header = unpack_header(att.to_bytes()) if att is not None else None
                return decode_message(r.ok.payload.to_bytes())
        raise TimeoutError(f"no reply on {key}")

    def status(self):
        replies = list(self.z.get(self.rk.status, timeout=3.0))
        return decode_message(replies[0].ok.payload.to_bytes())

    def open(self, key: str | None = None, attachment: bytes | None | str = "header", **kw):
        """Open on the client's own `session` key (or `key`)."""
        body = dict(
            client_uuid=self.uuid,
            schema_version=SCHEMA_VERSION,
            fps=30.0,
            action_names=["x", "y", "grip"],
            state_dim=4,
            task=self.task,
            rtc_enabled=True,
        )
        body.update(kw)
        reply = self.query(key or self.keys.session, SessionOpen(**body), attachment=attachment)
        if getattr(reply, "session_id", None):
            self.session_id = reply.session_id
            self.ack = reply
        return reply

    def reopen(self, **kw):
        """A re-handshake that proves it owned the current session (previous_auth)."""
        prev = self.ack
        return self.open(
            previous_session_id=prev.session_id,
            previous_auth=wauth.reopen_tag(prev.session_key, prev.session_id, self.uuid),
            **kw,
        )

    def send(
        self,
        state,
        seq=None,
        episode=0,
        epoch=0,
        session_id=None,
        raw_body: bytes | None = None,
        raw_header: bytes | None = None,
        sign: bool = True,
        **kw,
    ) -> int:
        """Publish an observation; signed with this client's session key unless `sign` is False."""
        self.seq = seq if seq is not None else self.seq + 1
        header = (
            raw_header
            if raw_header is not None
            else Header(SCHEMA_VERSION, MsgType.OBS, self.seq, episode, time.monotonic_ns(), epoch).pack()
        )
        if raw_body is None:
            sid = session_id or self.session_id
            if sign and self.ack is not None and self.ack.session_key and "auth" not in kw:
                kw["auth"] = wauth.obs_tag(self.ack.session_key, sid, header)
            raw_body = Observation(sid, np.asarray(state, np.float32), **kw).encode()
        self.pub.put(raw_body, attachment=header)
        return self.seq

    def wait_for(self, pred, timeout=5.0):
        """The first inbox message (header, body) with pred(header, body) true; None on timeout."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                for i, (h, m, _t) in enumerate(self.inbox):
                    if pred(h, m):
                        del self.inbox[i]
                        return h, m
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cv.wait(left)

    def chunk_for(self, seq, timeout=5.0):
        return self.wait_for(lambda h, m: h.seq_id == seq and h.msg_type == MsgType.CHUNK, timeout)

    def reset(
        self,
        episode_id: int,
        session_id: str | None = None,
        sign: bool = True,
        attachment: bytes | None | str = "header",
    ):
        sid = session_id or self.session_id
        tag = None
        if sign and self.ack is not None and self.ack.session_key:
            tag = wauth.reset_tag(self.ack.session_key, sid, episode_id)
        return self.query(self.keys.reset, Reset(sid, episode_id, auth=tag), timeout=2.0, attachment=attachment)

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self):
        for d in (self.token, self.sub, self.pub):
            try:
                d.undeclare()
            except Exception:
                pass
        if self.own_session:
            self.z.close()
