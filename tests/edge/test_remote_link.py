"""The remote engine's link state machine is its table: DEAD is final, a row says where an event leads, an event
without a row leaves the state, and a word that is no event is refused. No network here."""

from __future__ import annotations

import threading

import pytest

from edge import EngineState
from edge.remote.link import ANY, TRANSITIONS, Link, next_state

S = EngineState
EVENTS = sorted({event for _, event in TRANSITIONS})


@pytest.mark.parametrize("event", EVENTS)
def test_dead_is_final_whatever_happens(event):
    assert next_state(S.DEAD, event) is None


@pytest.mark.parametrize("state", [s for s in S if s != S.DEAD])
@pytest.mark.parametrize("event", EVENTS)
def test_an_explicit_row_wins_over_any_and_no_row_keeps_the_state(state, event):
    if (state, event) in TRANSITIONS:
        expected = TRANSITIONS[(state, event)]
    else:
        expected = TRANSITIONS.get((ANY, event))
    assert next_state(state, event) is expected


def test_a_request_failing_degrades_only_a_streaming_link():
    assert next_state(S.STREAMING, "request_failed") == S.DEGRADED
    assert next_state(S.RECONNECTING, "request_failed") is None and next_state(S.PAUSED, "request_failed") is None


def test_a_word_that_is_no_event_is_refused():
    with pytest.raises(KeyError, match="no link event 'degrade'"):
        next_state(S.STREAMING, "degrade")


def test_fatal_says_the_reason_before_the_shutdown_event_and_nothing_moves_after():
    seen = []

    class Watched(threading.Event):
        def set(self):
            seen.append((link.visible, link.dead_reason))
            super().set()

    link = Link("robot", Watched())
    link.fire("start", "start")
    link.fire("fatal", "refused")
    link.fire("session", "too late")
    assert seen == [(S.DEAD, "refused")] and link.state == S.DEAD
    assert [t[1:] for t in link.transitions] == [("STOPPED", "CONNECTING", "start"), ("CONNECTING", "DEAD", "refused")]


def test_a_stalled_live_link_shows_stalled_and_a_paused_one_does_not():
    link = Link("robot")
    link.fire("start", "start")
    link.fire("session", "open")
    link.set_stalled(True, "queue empty")
    assert link.visible == S.STALLED
    link.fire("pause", "pause")
    assert link.visible == S.PAUSED
