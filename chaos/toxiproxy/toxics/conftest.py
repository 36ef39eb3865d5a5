"""Fixtures for the per-toxic tests beside each toxic (shared with tests/chaos/)."""

from tests.chaos.harness import api, echo, proxy_server  # noqa: F401
