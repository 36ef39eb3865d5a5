"""The attachment header: a fixed 27-byte packed little-endian record beside every message.

Routing and correlation read only this header, never the msgpack body. Layout (offsets in bytes):

    0  u16 schema_version
    2  u8  msg_type        (MsgType)
    3  u64 seq_id          per-session monotonic, echoed in the chunk
    11 u32 episode_id      bumped by reset()
    15 i64 client_mono_ns  client monotonic clock; opaque to the server, echoed back
    23 u32 session_epoch   bumped per (re)connect; chunks of a stale epoch are dropped
    27 (end)

Invariant: `unpack(pack(h)) == h` for every in-range header; anything else raises `WireError`.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from wire.errors import WireError

_STRUCT = struct.Struct("<HBQIqI")
HEADER_SIZE = _STRUCT.size  # 27
MSG_TYPE_OFFSET = struct.calcsize("<H")  # 2: msg_type follows schema_version (a reader can route without unpacking)

_U16, _U32, _U64 = (1 << 16) - 1, (1 << 32) - 1, (1 << 64) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


class MsgType(enum.IntEnum):
    OBS = 1  # observation, client -> server, data plane
    CHUNK = 2  # action chunk, server -> client, data plane
    EVENT = 3  # server-initiated notice (drain, error) on a client's action topic
    CONTROL = 4  # query or reply on a control queryable (status, session, reset)


_MSG_TYPES = {int(m): m for m in MsgType}  # a header's byte -> its type (a dict lookup; MsgType(b) costs ~1 us)


@dataclass(frozen=True, slots=True)
class Header:
    schema_version: int
    msg_type: MsgType
    seq_id: int = 0
    episode_id: int = 0
    client_mono_ns: int = 0
    session_epoch: int = 0

    def pack(self) -> bytes:
        return pack_header(self)


def pack_header(h: Header) -> bytes:
    version, seq, episode, mono, epoch = h.schema_version, h.seq_id, h.episode_id, h.client_mono_ns, h.session_epoch
    # every field a plain int (not a bool): the struct's own formats are the ranges checked below, exactly
    if type(version) is int and type(seq) is int and type(episode) is int and type(mono) is int and type(epoch) is int:
        try:
            return _STRUCT.pack(version, int(h.msg_type), seq, episode, mono, epoch)
        except struct.error:
            pass  # out of range: the checks below name the field
    checks = (
        ("schema_version", h.schema_version, 0, _U16),
        ("msg_type", int(h.msg_type), 0, 255),
        ("seq_id", h.seq_id, 0, _U64),
        ("episode_id", h.episode_id, 0, _U32),
        ("client_mono_ns", h.client_mono_ns, _I64_MIN, _I64_MAX),
        ("session_epoch", h.session_epoch, 0, _U32),
    )
    for name, value, lo, hi in checks:
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            raise WireError("MALFORMED", f"header field {name}={value!r} is outside [{lo}, {hi}]", name)
    return _STRUCT.pack(h.schema_version, int(h.msg_type), h.seq_id, h.episode_id, h.client_mono_ns, h.session_epoch)


def unpack_header(data: bytes | bytearray | memoryview | None) -> Header:
    if data is None:
        raise WireError("MALFORMED", "message has no attachment header; every message must carry one")
    try:
        raw = bytes(data)
    except (TypeError, ValueError) as exc:
        raise WireError("MALFORMED", f"attachment is not bytes: {exc}") from None
    if len(raw) != HEADER_SIZE:
        raise WireError("MALFORMED", f"attachment header is {len(raw)} bytes, expected exactly {HEADER_SIZE}")
    version, mtype, seq, episode, mono, epoch = _STRUCT.unpack(raw)
    msg_type = _MSG_TYPES.get(mtype)
    if msg_type is None:
        raise WireError("MALFORMED", f"unknown msg_type {mtype}; known: {[int(m) for m in MsgType]}", "msg_type")
    return Header(version, msg_type, seq, episode, mono, epoch)
