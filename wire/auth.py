"""Session proofs: what ties every observation and reset to the client that opened the session.

    session open (query, per-client key) ──► SessionAck.session_key  (32 random bytes, hex; only in the
                                              reply, which Zenoh routes to the querier alone)
    every observation  Observation.auth = tag(key, "obs"   | session_id | the 27-byte attachment header)
    every reset        Reset.auth       = tag(key, "reset" | session_id | episode_id)
    a re-handshake     SessionOpen.previous_auth = tag(old key, "reopen" | old session_id | client_uuid)

A tag is HMAC-SHA256 truncated to 128 bits, hex. The key itself never travels on the pub/sub data
plane, so a party that can read observations (a router without access rules) still cannot forge an
observation with another sequence number, episode or epoch, nor a reset, nor take a live session
over. The tag does not cover the observation body (that would cost a hash of every frame and a
second encoding pass); the router's access rules are what keep a third party off another robot's
`obs` key (docs/security.md, threat model).

Invariant: verification is constant-time (`hmac.compare_digest`) and any malformed tag is simply
a mismatch, never an exception.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets

TAG_BYTES = 16
KEY_BYTES = 32


def new_session_key() -> str:
    return secrets.token_hex(KEY_BYTES)


@functools.lru_cache(maxsize=4096)
def _keyed(key_hex: str):
    """The HMAC-SHA256 state keyed with `key_hex` (an unparsable key is the empty key): each tag copies it
    instead of re-deriving the key pads, one per session key (the cache holds at most 4096 of them)."""
    try:
        key = bytes.fromhex(key_hex)
    except (TypeError, ValueError):
        key = b""
    return hmac.new(key, digestmod=hashlib.sha256)


def _tag(key_hex: str, *parts: bytes) -> str:
    try:
        mac = _keyed(key_hex).copy()
    except TypeError:  # an unhashable key is no hex string: the empty key, as bytes.fromhex refusing it
        mac = hmac.new(b"", digestmod=hashlib.sha256)
    # length-prefixed: no two part lists give the same input (one update of the whole input, the same MAC)
    mac.update(b"".join(len(p).to_bytes(4, "little") + p for p in parts))
    return mac.hexdigest()[: 2 * TAG_BYTES]


def obs_tag(key_hex: str, session_id: str, header: bytes) -> str:
    return _tag(key_hex, b"obs", session_id.encode(), bytes(header))


def reset_tag(key_hex: str, session_id: str, episode_id: int) -> str:
    return _tag(key_hex, b"reset", session_id.encode(), int(episode_id).to_bytes(8, "little"))


def reopen_tag(key_hex: str, session_id: str, client_uuid: str) -> str:
    return _tag(key_hex, b"reopen", session_id.encode(), client_uuid.encode())


def verify(expected: str, given: object) -> bool:
    return isinstance(given, str) and len(given) == len(expected) and hmac.compare_digest(expected, given)
