"""The policy server (`policy-server`): serves torch checkpoints to many robots over Zenoh.

Owns everything on the far side of the wire: the manifest (`manifest.py`: the pydantic schema,
file:line errors, the JSON Schema editors use), the process and its models (`process.py`,
`service.py`), sessions, mailbox and scheduling (`sessions.py`, `mailbox.py`, `scheduling.py`),
the batched inference path (`runtime.py`, `processors.py`, `policies/`), per-session protection
(`guard.py`), health, metrics and audit (`health.py`, `metrics.py`, `audit.py`), debug capture and
replay (`capture.py`). Invariants: it imports only `wire` from this tree (never the edge, the chaos
proxy or the twin); a user error (bad manifest, missing checkpoint) ends the process with exit 2
and one line, and no client's traffic can crash a server other clients depend on.
"""
