"""Discovery: which replicas of a model answer, best first, and the watch on their liveliness tokens.

edge.client.Model uses both before it opens a session; the watch says when a replica's token appears.

One discovery query on `<root>/<model>/<revision>/status` collects every replica's Status; they come back
ready-and-not-draining first, then in the caller's `replica_order`, then by a draw weighted by free
capacity (`spread_key`), so a herd of robots that read the same loads spreads over the replicas.

Invariant: a Status that does not decode, whose replica id is no key chunk, or that names another model or
revision never reaches the caller (it has no keys to open this model's session on).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from wire import ReplicaKeys, Status, WireError, decode_message, discovery_key, replicas_alive_key


def spread_key(load: float, rng: random.Random) -> float:
    """A replica's place in discovery's order, drawn with weight = its free capacity (1 - load): sorting by
    it descending is a weighted random permutation (Efraimidis-Spirakis, u ** (1 / w)).

    Robots that start or fail over together all read the same Status (say load 0 everywhere) before any of
    them has opened a session; ordering by load, then replica id, sends every one of them to the same
    replica until it is full. A draw spreads such a herd evenly (the 300-robot headline: 99 / 99 / 102
    sessions on three replicas), and still favours the replica with the most room."""
    weight = max(0.0, 1.0 - float(load))
    if weight <= 0.0:
        return -math.inf  # full: last, still tried (its CAPACITY refusal moves on)
    return rng.random() ** (1.0 / weight)


def discover(
    z, model_id: str, revision: str, root: str, timeout_s: float, replica_order: list[str], rng: random.Random
) -> list[Status]:
    """Every replica's Status on Zenoh session `z`, best first: ready and not draining, then `replica_order`,
    then a draw weighted by free capacity (`spread_key`). A Status that does not decode, names no key chunk
    as its replica id, or names another model or revision is left out."""
    key = discovery_key(model_id, revision, root)
    found: dict[str, Status] = {}
    for reply in z.get(key, timeout=timeout_s):
        if reply.ok is None:
            continue
        try:
            st = decode_message(reply.ok.payload.to_bytes(), expect=Status)
            # a replica id that is no key chunk has no keys to open a session on: its WireError, raised in
            # open(), ended the whole round before any sound replica was tried (every round it sorted first)
            ReplicaKeys(model_id, revision, st.replica_id, root)
        except WireError:
            continue
        if (st.model_id, st.revision) != (model_id, revision):
            continue  # it says it serves another model: not one to open this model's session on
        found[st.replica_id] = st
    order = {r: i for i, r in enumerate(replica_order)}
    return sorted(
        found.values(),
        key=lambda s: (
            not s.ready or s.draining,
            order.get(s.replica_id, len(order)),
            -spread_key(s.load, rng),
            s.replica_id,
        ),
    )


def watch_replicas(z, model_id: str, revision: str, root: str, on_appear: Callable[[], None]):
    """A liveliness subscriber on every replica token of this model (`<root>/<model>/<revision>/*/alive`;
    client tokens sit deeper and do not match); `on_appear()` runs on Zenoh's thread when one appears (a
    server started, or the link to the router healed). Returns the subscriber (the caller undeclares it)."""
    import zenoh

    def on_token(sample) -> None:  # deposit only, on Zenoh's thread
        if sample.kind == zenoh.SampleKind.PUT:
            on_appear()

    key = replicas_alive_key(model_id, revision, root)
    return z.liveliness().declare_subscriber(key, zenoh.handlers.Callback(on_token, indirect=False))
