"""Fixtures for the per-toxic tests (shared with tests/chaos/)."""

from tests.chaos.harness import api, echo, proxy_server  # noqa: F401
