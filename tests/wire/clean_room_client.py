"""A robot client written from docs/wire-protocol.md alone: the proof that the document is enough.

It owns nothing the project ships: it imports only Zenoh, msgpack, numpy, simplejpeg and the standard
library, never `wire`, `edge`, `server`, `bench` or `chaos` (tests/wire/test_clean_room_client.py checks
that with `ast`), and was written without reading their source, as a Rust or C++ client would be. Every
constant below is the document's; the section it comes from is named beside it.

Invariant: one observation in flight per session (5.1 step 4), and every chunk or error it accepts is
checked against the request it answers (header seq, episode, clock, epoch, agreed schema version; chunk
shapes) before the caller sees it.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import queue
import re
import struct
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import numpy as np
import zenoh

SCHEMA_VERSION = 1  # section 8: this client speaks 1..1
HEADER = struct.Struct("<HBQIqI")  # section 3: u16 u8 u64 u32 i64 u32, little-endian, packed: 27 bytes
OBS, CHUNK, EVENT, CONTROL = 1, 2, 3, 4  # section 3 msg_type
STATUS_TIMEOUT_S, SESSION_TIMEOUT_S, RESET_TIMEOUT_S = 2.0, 2.0, 1.0  # section 7: control queries' timeouts
DTYPES = {
    "float16": "<f2",
    "float32": "<f4",
    "float64": "<f8",
    "uint8": "u1",
    "int32": "<i4",
    "int64": "<i8",
    "bool": "?",
}  # section 4.1 (bfloat16 is receive-only here: widened by hand in `from_tensor`)
assert HEADER.size == 27


@dataclass(frozen=True)
class Header:
    schema_version: int
    msg_type: int
    seq_id: int = 0
    episode_id: int = 0
    client_mono_ns: int = 0
    session_epoch: int = 0

    def pack(self) -> bytes:
        return HEADER.pack(
            self.schema_version, self.msg_type, self.seq_id, self.episode_id, self.client_mono_ns, self.session_epoch
        )

    @classmethod
    def unpack(cls, data: bytes | None) -> Header | None:
        if data is None or len(data) != HEADER.size:
            return None
        return cls(*HEADER.unpack(data))


class ProtocolViolation(AssertionError):
    """The server sent something docs/wire-protocol.md does not allow."""


def encode(kind: str, **fields) -> bytes:
    """Section 4: a msgpack map with string keys and `kind`; binary as msgpack bin, strings as msgpack str."""
    return msgpack.packb({"kind": kind, **fields}, use_bin_type=True)


def decode(data: bytes) -> dict:
    body = msgpack.unpackb(data, raw=False)
    if not isinstance(body, dict) or not isinstance(body.get("kind"), str):
        raise ProtocolViolation(f"body is not a map with a kind: {body!r:.200}")
    return body


def to_tensor(array: np.ndarray, dtype: str = "float32") -> dict:
    """Section 4.1: elements in C order, little-endian; the client sends state and prefixes as float32."""
    a = np.ascontiguousarray(array, dtype=np.dtype(DTYPES[dtype]))
    return {"dtype": dtype, "shape": list(a.shape), "data": a.tobytes()}


def from_tensor(t: dict) -> np.ndarray:
    dtype, shape, data = t["dtype"], [int(n) for n in t["shape"]], t["data"]
    if dtype == "bfloat16":  # upper 16 bits of a float32 (section 4.1)
        raw = np.frombuffer(data, dtype="<u2")
        if raw.size != math.prod(shape):
            raise ProtocolViolation(f"tensor bytes {len(data)} do not match shape {shape} of {dtype}")
        return (raw.astype("<u4") << 16).view("<f4").reshape(shape)
    np_dtype = np.dtype(DTYPES[dtype])
    if len(data) != math.prod(shape) * np_dtype.itemsize:
        raise ProtocolViolation(f"tensor bytes {len(data)} do not match shape {shape} of {dtype}")
    return np.frombuffer(data, dtype=np_dtype).reshape(shape)


def tag(key_hex: str, *parts: bytes) -> str:
    """Section 5.5: HMAC-SHA256 keyed by the 32 raw key bytes over each part prefixed by its u32 LE length,
    truncated to 16 bytes, lower-case hex."""
    mac = hmac.new(bytes.fromhex(key_hex), digestmod=hashlib.sha256)
    for p in parts:
        mac.update(struct.pack("<I", len(p)) + p)
    return mac.digest()[:16].hex()


def task_slug(task: str) -> str:
    """Section 2, step by step: strip, lower-case, runs outside [a-z0-9._-] -> '-', strip '-'/'.', collapse
    runs of '-', cut to 128 and strip again. Empty task: `default`; a task whose slug is empty: ValueError (the
    server refuses it BAD_KEY)."""
    if not task:
        return "default"
    slug = re.sub(r"[^a-z0-9._-]+", "-", task.strip().lower()).strip("-.")
    slug = re.sub(r"-{2,}", "-", slug)[:128].strip("-.")
    if not slug:
        raise ValueError(f"task {task!r} has no key characters (the server answers BAD_KEY)")
    return slug


def checkpoint_hash(directory: str | Path) -> str:
    """Section 5.6: SHA-256 over config.json, model.safetensors, stats.json: name, NUL, u64 LE length, bytes."""
    h = hashlib.sha256()
    for name in ("config.json", "model.safetensors", "stats.json"):
        data = (Path(directory) / name).read_bytes()
        h.update(name.encode() + b"\0" + struct.pack("<Q", len(data)) + data)
    return h.hexdigest()


def jpeg(frame: np.ndarray, quality: int = 90) -> bytes:
    """Section 4.2: a JPEG is written from RGB samples (or grey)."""
    import simplejpeg

    grey = frame.shape[2] == 1
    return simplejpeg.encode_jpeg(np.ascontiguousarray(frame), quality=quality, colorspace="GRAY" if grey else "RGB")


@dataclass
class Reply:
    """One answer to a control query: its header (None: none or not 27 bytes), its body, and whether Zenoh
    carried it as a reply error rather than a sample."""

    header: Header | None
    body: dict
    zenoh_error: bool = False
    key: str = ""


@dataclass
class Answer:
    """What came back for one observation: a checked chunk, a checked error event, or nothing in time."""

    seq_id: int
    chunk: dict | None = None
    chunk_robot: np.ndarray | None = None
    chunk_model: np.ndarray | None = None
    error: dict | None = None
    rtt_ms: float | None = None
    late_or_foreign: list = field(default_factory=list)  # messages on the action topic not answering this request


class CleanRoomClient:
    """One robot: a Zenoh session, discovery, one session with one replica, observations, resets, close."""

    def __init__(
        self,
        router: str,
        model_id: str,
        revision: str = "*",
        root: str = "@fleet",
        client_uuid: str | None = None,
        lease_ms: int = 1000,
    ):
        self.model_id, self.revision, self.root = model_id, revision, root
        self.client_uuid = client_uuid or f"cleanroom-{uuid.uuid4().hex[:12]}"
        conf = zenoh.Config()
        conf.insert_json5("mode", '"client"')  # section 1: client mode, to a router endpoint
        conf.insert_json5("connect/endpoints", f'["{router}"]')
        conf.insert_json5("scouting/multicast/enabled", "false")
        conf.insert_json5("transport/shared_memory/enabled", "false")
        conf.insert_json5("transport/link/tx/lease", str(lease_ms))
        # Section 7: the settings that go with DROP, on every session.
        conf.insert_json5("transport/link/tx/queue/congestion_control/drop/wait_before_drop", "20000")
        conf.insert_json5("transport/link/tx/queue/size/interactive_high", "16")
        self.z = zenoh.open(conf)
        self.replica: dict | None = None
        self.ack: dict | None = None
        self.seq_id = 0
        self.episode_id = 0
        self.session_epoch = 0
        self._episode_start = True
        self._actions: queue.Queue = queue.Queue()
        self.replica_alive = threading.Event()
        self.replica_gone = threading.Event()
        self._declared: list = []

    # -- keys (section 2) -------------------------------------------------------------------------------
    def replica_prefix(self, status: dict) -> str:
        return f"{self.root}/{status['model_id']}/{status['revision']}/{status['replica_id']}"

    def client_prefix(self, status: dict, task: str) -> str:
        return f"{self.replica_prefix(status)}/{task_slug(task)}/{self.client_uuid}"

    # -- control queries --------------------------------------------------------------------------------
    def _query(self, key: str, kind: str, fields: dict | None, header: Header | None, timeout_s: float) -> list[Reply]:
        payload = encode(kind, **fields) if fields is not None else None
        replies = self.z.get(
            key,
            payload=payload,
            attachment=header.pack() if header else None,
            target=zenoh.QueryTarget.ALL,
            timeout=timeout_s,
        )
        out = []
        for r in replies:  # the handler ends when every queryable answered or the timeout passed
            if r.ok is not None:
                s = r.ok
                att = s.attachment.to_bytes() if s.attachment is not None else None
                out.append(Reply(Header.unpack(att), decode(s.payload.to_bytes()), key=str(s.key_expr)))
            else:
                e = r.err
                try:
                    body = decode(e.payload.to_bytes())
                except Exception:  # noqa: BLE001 - a reply error need not be one of our bodies
                    body = {"kind": "zenoh_reply_error", "text": e.payload.to_bytes().decode(errors="replace")}
                out.append(Reply(None, body, zenoh_error=True))
        return out

    def discover(self) -> list[dict]:
        """5.1 step 1: every replica answers a status query on the single-depth wildcard with its status."""
        key = f"{self.root}/{self.model_id}/{self.revision}/*/status"
        replies = self._query(
            key, "status_request", {"client_uuid": self.client_uuid}, Header(SCHEMA_VERSION, CONTROL), STATUS_TIMEOUT_S
        )
        statuses = []
        for r in replies:
            if r.body.get("kind") != "status":
                raise ProtocolViolation(f"status query answered {r.body!r:.300}")
            if r.header is None or r.header.msg_type != CONTROL:
                raise ProtocolViolation(f"status reply header {r.header}")
            if r.key != f"{self.replica_prefix(r.body)}/status":
                raise ProtocolViolation(f"status of {r.body['replica_id']} arrived on {r.key}, not its own key")
            statuses.append(r.body)
        return statuses

    @staticmethod
    def pick(statuses: list[dict]) -> dict:
        """5.1 step 1: ready, not draining, lowest load."""
        ok = [s for s in statuses if s["ready"] and not s.get("draining", False)]
        if not ok:
            raise LookupError(f"no ready replica among {len(statuses)}")
        return min(ok, key=lambda s: s["load"])

    def open(
        self,
        status: dict,
        *,
        action_names: list[str],
        state_dim: int,
        fps: float,
        cameras: dict | None = None,
        task: str = "",
        expected_checkpoint_hash: str = "",
    ) -> Reply:
        """5.1 steps 2-3: declare the session's keys, then the open on the client's own session key. Returns
        the reply; on a `session_ack` the client is streaming-ready."""
        self.close_session()
        self.replica, self.ack = status, None
        # A client that sends an empty task declares its keys with the status's default_task (section 2).
        effective = task or status.get("default_task", "")
        prefix = self.client_prefix(status, effective)
        live = self.z.liveliness()
        self._declared.append(live.declare_token(f"{prefix}/alive"))
        self._declared.append(self.z.declare_subscriber(f"{prefix}/action", self._on_action))
        self._obs_pub = self.z.declare_publisher(  # section 7: obs QoS
            f"{prefix}/obs",
            congestion_control=zenoh.CongestionControl.DROP,
            priority=zenoh.Priority.DATA,
            express=False,
        )
        self._declared.append(self._obs_pub)
        self._declared.append(
            live.declare_subscriber(f"{self.replica_prefix(status)}/alive", self._on_replica_alive, history=True)
        )
        self.session_epoch += 1  # this (re)connect
        fields = {
            "client_uuid": self.client_uuid,
            "schema_version": SCHEMA_VERSION,
            "fps": float(fps),
            "action_names": list(action_names),
            "state_dim": int(state_dim),
            "cameras": {k: list(v) for k, v in (cameras or {}).items()},
            "task": task,
            "expected_checkpoint_hash": expected_checkpoint_hash,
            "client_type": "clean-room",
        }
        replies = self._query(
            f"{prefix}/session", "session_open", fields, Header(SCHEMA_VERSION, CONTROL), SESSION_TIMEOUT_S
        )
        if len(replies) != 1:
            raise ProtocolViolation(f"session open got {len(replies)} replies, want exactly 1")
        reply = replies[0]
        if reply.zenoh_error or reply.key != f"{prefix}/session":  # section 1: one reply sample on the query's key
            raise ProtocolViolation(f"open answered on {reply.key!r} (reply error: {reply.zenoh_error})")
        if reply.body.get("kind") == "session_ack":
            ack = reply.body
            if list(ack["action_names"]) != list(action_names):
                raise ProtocolViolation(f"ack action_names {ack['action_names']} != ours {action_names}")
            if ack["checkpoint_hash"] != status["checkpoint_hash"]:
                raise ProtocolViolation("ack checkpoint_hash differs from the replica's status")
            if reply.header is None or reply.header.msg_type != CONTROL:
                raise ProtocolViolation(f"ack header {reply.header}")
            if task_slug(ack.get("task", "")) != task_slug(effective):
                raise ProtocolViolation(f"ack task {ack.get('task')!r} is not the key's task {effective!r}")
            self.ack, self.seq_id, self._episode_start = ack, 0, True
        return reply

    # -- data plane ---------------------------------------------------------------------------------------
    def _on_action(self, sample) -> None:
        att = sample.attachment.to_bytes() if sample.attachment is not None else None
        try:
            body = decode(sample.payload.to_bytes())
        except Exception as exc:  # noqa: BLE001 - surfaced to the waiting caller, not raised in Zenoh's thread
            body = {"kind": "undecodable", "why": repr(exc)}
        self._actions.put((Header.unpack(att), body))

    def _on_replica_alive(self, sample) -> None:
        (self.replica_alive if sample.kind == zenoh.SampleKind.PUT else self.replica_gone).set()

    def observe(self, state: np.ndarray, images: dict | None = None, timeout_s: float = 5.0, **extra_fields) -> Answer:
        """5.1 step 4: publish one observation and wait for the chunk or error event that answers it."""
        if self.ack is None:
            raise RuntimeError("no open session")
        self.seq_id += 1
        mono = time.monotonic_ns()
        hdr = Header(self.ack["schema_version"], OBS, self.seq_id, self.episode_id, mono, self.session_epoch)
        raw = hdr.pack()
        sid = self.ack["session_id"]
        fields = {"session_id": sid, "state": to_tensor(state), "episode_start": self._episode_start}
        if images:
            fields["images"] = images
        if self.ack.get("session_key"):
            fields["auth"] = tag(self.ack["session_key"], b"obs", sid.encode(), raw)
        fields.update(extra_fields)
        self._obs_pub.put(encode("observation", **fields), attachment=raw)
        answer = Answer(self.seq_id)
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                h, body = self._actions.get(timeout=left)
            except queue.Empty:
                break
            if self._answers(h, body, hdr):
                self._check(h, body, hdr, answer)
                answer.rtt_ms = (time.monotonic_ns() - mono) / 1e6
                if answer.chunk is not None:
                    self._episode_start = False
                return answer
            answer.late_or_foreign.append((h, body))
        return answer

    @staticmethod
    def _answers(h: Header | None, body: dict, sent: Header) -> bool:
        """5.1 step 4: a message answers this request only if it is of this epoch and echoes this seq."""
        if h is None or h.session_epoch != sent.session_epoch:
            return False
        if body.get("kind") == "action_chunk":
            return h.seq_id == sent.seq_id
        if body.get("kind") == "error":
            return body.get("seq_id") == sent.seq_id
        return False

    def _check(self, h: Header, body: dict, sent: Header, answer: Answer) -> None:
        agreed = self.ack["schema_version"]
        echo = (h.seq_id, h.episode_id, h.client_mono_ns, h.session_epoch)
        want = (sent.seq_id, sent.episode_id, sent.client_mono_ns, sent.session_epoch)
        if body["kind"] == "error":  # 5.3: EVENT header echoing the observation's header fields
            if h.msg_type != EVENT or echo != want:
                raise ProtocolViolation(f"error event header {h} does not echo {sent}")
            if not isinstance(body.get("code"), str) or not isinstance(body.get("message"), str):
                raise ProtocolViolation(f"error without code/message: {body}")
            answer.error = body
            return
        if h.msg_type != CHUNK or h.schema_version != agreed or echo != want:
            raise ProtocolViolation(f"chunk header {h} does not echo {sent} (agreed version {agreed})")
        if body["session_id"] != self.ack["session_id"]:
            raise ProtocolViolation(f"chunk of session {body['session_id']}")
        if body["seq_id_echo"] != sent.seq_id or body["client_mono_ns_echo"] != sent.client_mono_ns:
            raise ProtocolViolation(f"chunk body echoes {body['seq_id_echo']}, {body['client_mono_ns_echo']}")
        want_shape = (self.ack["chunk_size"], len(self.ack["action_names"]))
        for name in ("chunk_model", "chunk_robot"):
            t = body[name]
            if t["dtype"] != "float32":  # section 4.1: chunks are always float32
                raise ProtocolViolation(f"{name} dtype {t['dtype']}")
            a = from_tensor(t)
            if a.shape != want_shape or not np.isfinite(a).all():
                raise ProtocolViolation(f"{name} shape {a.shape}, want {want_shape}, finite {np.isfinite(a).all()}")
            setattr(answer, name, a)
        for name in ("queue_wait_ms", "inference_ms"):
            if not isinstance(body[name], (int, float)) or body[name] < 0:
                raise ProtocolViolation(f"{name} = {body[name]!r}")
        answer.chunk = body

    def reset(self, episode_id: int | None = None, *, auth: str | None = None) -> Reply:
        """5.2: the reset query on the client's own key; the new episode in the body and the header."""
        if self.ack is None:
            raise RuntimeError("no open session")
        new = self.episode_id + 1 if episode_id is None else episode_id
        sid = self.ack["session_id"]
        fields = {"session_id": sid, "episode_id": new}
        if auth is not None:
            fields["auth"] = auth
        elif self.ack.get("session_key"):
            fields["auth"] = tag(self.ack["session_key"], b"reset", sid.encode(), struct.pack("<Q", new))
        prefix = self.client_prefix(self.replica, self.ack.get("task", ""))
        replies = self._query(
            f"{prefix}/reset", "reset", fields, Header(SCHEMA_VERSION, CONTROL, episode_id=new), RESET_TIMEOUT_S
        )
        if len(replies) != 1:
            raise ProtocolViolation(f"reset got {len(replies)} replies, want exactly 1")
        reply = replies[0]
        if reply.zenoh_error or reply.key != f"{prefix}/reset":
            raise ProtocolViolation(f"reset answered on {reply.key!r} (reply error: {reply.zenoh_error})")
        if reply.body.get("kind") == "reset_ack":
            if reply.body["episode_id"] != new or reply.body["session_id"] != sid:
                raise ProtocolViolation(f"reset_ack {reply.body} for episode {new}")
            if reply.header is None or reply.header.msg_type != CONTROL or reply.header.episode_id != new:
                raise ProtocolViolation(f"reset_ack header {reply.header}")
            self.episode_id, self._episode_start = new, True
        return reply

    # -- close (5.1 step 5) ---------------------------------------------------------------------------------
    def close_session(self) -> None:
        """Undeclare the liveliness token (the server forgets the session after its grace period) and the rest."""
        while self._declared:
            self._declared.pop(0).undeclare()  # the token first: it is what tells the server
        self.ack = None
        while not self._actions.empty():
            self._actions.get_nowait()

    def close(self) -> None:
        self.close_session()
        self.z.close()
