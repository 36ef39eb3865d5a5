"""Fault injection: a Toxiproxy-compatible TCP fault proxy and process faults.

- `chaos.toxiproxy`: the proxy server (Toxiproxy's HTTP API, toxics one module each).
- `chaos.client`: `ChaosClient`, our wrapper over the `toxiproxy-python` client.
- `chaos.launch`: start the proxy server as a process (the real `toxiproxy-server` if on PATH).
- `chaos.faults`: process faults (kill, term, pause, restart, restart_with) on a `ManagedProcess`.
- `chaos.profiles`: named network profiles as lists of toxics.
- `chaos.timeline`: the YAML fault timeline, its strict parser and its executor.

See docs/chaos.md.
"""
