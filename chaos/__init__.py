"""Fault injection: a Toxiproxy-compatible TCP fault proxy and process faults.

- `chaos.toxiproxy`: the proxy server (Toxiproxy's HTTP API, toxics one module each).
- `chaos.client`: `ChaosClient`, our wrapper over the `toxiproxy-python` client.
- `chaos.launch`: start the proxy server as a process (the real `toxiproxy-server` if on PATH).
- `chaos.faults`: process faults (kill, term, pause, restart, restart_with) on a `ManagedProcess`.
- `chaos.profiles`: named network profiles as lists of toxics.
- `chaos.grammar`: the YAML fault timeline's events, actions and strict parser.
- `chaos.timeline`: the fault timeline's executor (re-exports the grammar).

See docs/chaos.md.
"""
