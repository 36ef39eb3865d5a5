"""Zenoh key expressions: the only place key strings are built.

Tree (one verbatim root chunk, default ``@fleet``; `@` chunks are matched only by identical chunks,
so a third party's ``**`` subscriber on a shared router never scrapes it):

    <root>/<model_id>/<revision>/<replica_id>/status                   server queryable
    <root>/<model_id>/<revision>/<replica_id>/session                  server queryable
    <root>/<model_id>/<revision>/<replica_id>/alive                    server liveliness token
    <root>/<model_id>/<revision>/<replica_id>/<task>/<client>/obs      client -> server (pub/sub)
    <root>/<model_id>/<revision>/<replica_id>/<task>/<client>/action   server -> client (pub/sub)
    <root>/<model_id>/<revision>/<replica_id>/<task>/<client>/reset    server queryable
    <root>/<model_id>/<revision>/<replica_id>/<task>/<client>/session  server queryable (the session open;
                                                                       on the client's own key, so router
                                                                       access rules can bind it to its uuid)
    <root>/<model_id>/<revision>/<replica_id>/<task>/<client>/alive    client liveliness token

The replica segment binds each session to exactly one replica: several replicas of one model share
a router without ever seeing each other's traffic, and clients discover them with one
single-depth wildcard query on ``<root>/<model_id>/<revision>/*/status``. Server and client keys
differ in depth, so the server's single-depth wildcards (``.../*/*/obs``) never match its own keys.

Invariant: every user-supplied segment passes `sanitize` before it becomes a key chunk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from wire.errors import WireError

DEFAULT_ROOT = "@fleet"
CLIENT_TOPICS = ("obs", "action", "reset", "alive", "session")
SERVER_TOPICS = ("status", "session", "alive")

_FORBIDDEN = set("*$?#/")
_MAX_SEGMENT = 128
_SLUG_RE = re.compile(r"[^a-z0-9._-]+")


def sanitize(segment: object, what: str = "segment", *, slugify: bool = False) -> str:
    """Return `segment` as a safe single key chunk, or raise `WireError`.

    With `slugify`, free text (a task such as "Fold the towel / left") becomes a slug
    ("fold-the-towel-left"); without it, anything unsafe is rejected with a message naming it.
    """
    if not isinstance(segment, str):
        raise WireError("BAD_KEY", f"{what} must be a string, got {type(segment).__name__}", what)
    if slugify:
        slug = _SLUG_RE.sub("-", segment.strip().lower()).strip("-.")
        slug = re.sub(r"-{2,}", "-", slug)[:_MAX_SEGMENT].strip("-.")
        if not slug:
            raise WireError("BAD_KEY", f"{what} {segment!r} has no letters or digits to build a key from", what)
        return slug
    if not segment:
        raise WireError("BAD_KEY", f"{what} is empty; give a non-empty name", what)
    bad = sorted(set(segment) & _FORBIDDEN)
    if bad:
        raise WireError(
            "BAD_KEY",
            f"{what} {segment!r} contains {''.join(bad)!r}; key chunks may not contain * $ ? # /",
            what,
        )
    if segment.startswith("@"):
        raise WireError("BAD_KEY", f"{what} {segment!r} may not start with '@' (verbatim chunk)", what)
    if any(c.isspace() or ord(c) < 32 for c in segment):
        raise WireError("BAD_KEY", f"{what} {segment!r} contains whitespace or control characters", what)
    if len(segment) > _MAX_SEGMENT:
        raise WireError("BAD_KEY", f"{what} is {len(segment)} chars; the limit is {_MAX_SEGMENT}", what)
    return segment


def sanitize_root(root: str) -> str:
    if not isinstance(root, str) or not root.startswith("@") or len(root) < 2:
        raise WireError("BAD_KEY", f"root {root!r} must be one verbatim chunk starting with '@'", "root")
    sanitize(root[1:], "root")
    return root


def task_slug(task: str | None) -> str:
    """The key chunk for a task string; an empty task maps to ``default``."""
    if not task:
        return "default"
    return sanitize(task, "task", slugify=True)


@dataclass(frozen=True, slots=True)
class ReplicaKeys:
    """Keys of one server replica of one model revision."""

    model_id: str
    revision: str
    replica_id: str
    root: str = DEFAULT_ROOT

    def __post_init__(self) -> None:
        sanitize_root(self.root)
        sanitize(self.model_id, "model_id")
        sanitize(self.revision, "revision")
        sanitize(self.replica_id, "replica_id")

    @property
    def prefix(self) -> str:
        return f"{self.root}/{self.model_id}/{self.revision}/{self.replica_id}"

    @property
    def status(self) -> str:
        return f"{self.prefix}/status"

    @property
    def session(self) -> str:
        return f"{self.prefix}/session"

    @property
    def alive(self) -> str:
        return f"{self.prefix}/alive"

    # Wildcards the server declares: single-depth `*` only, never `**`.
    @property
    def all_obs(self) -> str:
        return f"{self.prefix}/*/*/obs"

    @property
    def all_reset(self) -> str:
        return f"{self.prefix}/*/*/reset"

    @property
    def all_client_session(self) -> str:
        return f"{self.prefix}/*/*/session"

    @property
    def all_client_alive(self) -> str:
        return f"{self.prefix}/*/*/alive"

    def client(self, task: str, client_uuid: str) -> ClientKeys:
        return ClientKeys(self, task_slug(task), sanitize(client_uuid, "client_uuid"))


@dataclass(frozen=True, slots=True)
class ClientKeys:
    replica: ReplicaKeys
    task_slug: str
    client_uuid: str

    @property
    def prefix(self) -> str:
        return f"{self.replica.prefix}/{self.task_slug}/{self.client_uuid}"

    @property
    def obs(self) -> str:
        return f"{self.prefix}/obs"

    @property
    def action(self) -> str:
        return f"{self.prefix}/action"

    @property
    def reset(self) -> str:
        return f"{self.prefix}/reset"

    @property
    def alive(self) -> str:
        return f"{self.prefix}/alive"

    @property
    def session(self) -> str:
        return f"{self.prefix}/session"


def discovery_key(model_id: str, revision: str, root: str = DEFAULT_ROOT) -> str:
    """Single-depth wildcard over replicas: query it to find every replica's status."""
    sanitize_root(root)
    return f"{root}/{sanitize(model_id, 'model_id')}/{sanitize(revision, 'revision')}/*/status"


def replicas_alive_key(model_id: str, revision: str, root: str = DEFAULT_ROOT) -> str:
    """Single-depth wildcard over replicas' liveliness tokens (client tokens sit deeper and do not match)."""
    sanitize_root(root)
    return f"{root}/{sanitize(model_id, 'model_id')}/{sanitize(revision, 'revision')}/*/alive"


@dataclass(frozen=True, slots=True)
class ParsedClientKey:
    model_id: str
    revision: str
    replica_id: str
    task_slug: str
    client_uuid: str
    topic: str


def parse_client_key(key: str, root: str = DEFAULT_ROOT) -> ParsedClientKey:
    """Split a per-client key back into its segments (the server uses it on wildcard samples)."""
    parts = str(key).split("/")
    if len(parts) != 7 or parts[0] != root or parts[6] not in CLIENT_TOPICS or not all(parts):
        raise WireError("BAD_KEY", f"{key!r} is not a per-client key under {root!r}")
    return ParsedClientKey(*parts[1:])
