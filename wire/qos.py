"""QoS per topic (design 6.3), defined once and applied by both sides.

    topic     reliability  congestion  express  priority
    obs       default      DROP        no       DATA
    action    RELIABLE     DROP        yes      INTERACTIVE_HIGH   (never BLOCK: one dead robot
                                                                  uplink must not stall the server)
    control   RELIABLE     default     -        -                  (queryables, explicit timeouts)

Invariant: nothing in the project declares a publisher on these topics except through
`declare_publisher` below, so the table above is the whole truth.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Qos:
    congestion_control: str  # "drop" | "block"
    priority: str  # zenoh Priority member name
    express: bool
    reliable: bool | None  # None = session default


OBS = Qos("drop", "DATA", False, None)
ACTION = Qos("drop", "INTERACTIVE_HIGH", True, True)
EVENT = ACTION  # drain/error events travel on the action topic
CONTROL = Qos("drop", "DATA", False, True)
CONTROL_TIMEOUTS_S = {"status": 2.0, "session": 2.0, "reset": 1.0}

BY_TOPIC = {"obs": OBS, "action": ACTION, "control": CONTROL}


def publisher_kwargs(q: Qos) -> dict:
    import zenoh

    kwargs = {
        "congestion_control": zenoh.CongestionControl.DROP
        if q.congestion_control == "drop"
        else zenoh.CongestionControl.BLOCK,
        "priority": getattr(zenoh.Priority, q.priority),
        "express": q.express,
    }
    if q.reliable is not None and hasattr(zenoh, "Reliability"):
        kwargs["reliability"] = zenoh.Reliability.RELIABLE if q.reliable else zenoh.Reliability.BEST_EFFORT
    return kwargs


def declare_publisher(session, key: str, topic: str):
    """Declare a publisher on `key` with the QoS of `topic` ("obs" or "action")."""
    return session.declare_publisher(key, **publisher_kwargs(BY_TOPIC[topic]))


def wait_matched(publisher, timeout_s: float) -> bool:
    """Wait until `publisher` has a matching subscriber (Zenoh propagates a new subscriber's interest
    asynchronously; a put before it arrives is dropped by the router). True when matched in time."""
    import threading

    matched = threading.Event()
    listener = publisher.declare_matching_listener(lambda status: status.matching and matched.set())
    try:
        return publisher.matching_status.matching or matched.wait(timeout_s)
    finally:
        listener.undeclare()
