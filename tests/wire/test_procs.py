"""wire.procs.start_router: a port picked for the router and taken by another process before the router binds it
costs a retry on a new port, not a failed start; a port the caller gave is not swapped behind its back."""

from __future__ import annotations

import socket

import pytest

import wire.procs as procs


@pytest.fixture
def taken_port():
    """A port another process holds (here: a listening socket of this one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_picked_port_taken_before_the_router_binds_it_is_picked_again(tmp_path, taken_port, monkeypatch):
    picks = iter([taken_port])  # the first pick loses the race; the next is a real free one
    real_free_port = procs.free_port
    monkeypatch.setattr(procs, "free_port", lambda: next(picks, None) or real_free_port())
    child, endpoint = procs.start_router(None, tmp_path / "router.log")
    try:
        assert child.alive() and endpoint != f"tcp/127.0.0.1:{taken_port}"
        assert "Address already in use" in (tmp_path / "router.log").read_text()  # the first try did lose
    finally:
        child.stop()


def test_a_port_the_caller_gave_is_not_swapped_when_taken(tmp_path, taken_port):
    with pytest.raises(RuntimeError, match="Address already in use"):
        procs.start_router(taken_port, tmp_path / "router.log")
