"""check_toxic: every registered toxic keeps the toxic contract, and the check fails, naming the fault, on toxics
that break it (a dropped chunk, state shared between directions, a stream never closed, data dropped on cancel)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import ClassVar

import pytest

from chaos.toxiproxy.toxics import REGISTRY, Toxic, ToxicStub
from chaos.toxiproxy.toxics.check import check_toxic
from chaos.toxiproxy.toxics.latency import LatencyToxic

# attributes that make each type act (hold, slice, lose, cut), and whether losing data is its purpose
ACTING = {
    "noop": ({}, False),
    "latency": ({"latency": 20, "jitter": 5}, False),
    "bandwidth": ({"rate": 100}, False),
    "slow_close": ({"delay": 20}, False),
    "timeout": ({"timeout": 0}, True),
    "reset_peer": ({"timeout": 10}, True),
    "slicer": ({"average_size": 37, "size_variation": 10, "delay": 100}, False),
    "limit_data": ({"bytes": 1000}, True),
    "loss": ({"probability": 0.3, "rto_ms": 2, "max_rto_ms": 8, "segment_size": 64}, False),
}


def test_every_registered_toxic_has_acting_attributes_here():
    assert set(REGISTRY) == set(ACTING), "a new toxic needs its line in ACTING (and so its check_toxic run)"


@pytest.mark.parametrize("word", sorted(ACTING))
def test_every_registered_toxic_keeps_the_toxic_contract(word):
    attributes, drops = ACTING[word]
    check_toxic(REGISTRY[word], attributes, drops=drops)
    check_toxic(REGISTRY[word], drops=drops)  # its defaults too (what the API creates before an update)
    check_toxic(REGISTRY[word](), attributes, drops=drops)  # an instance is copied, never changed


@dataclass
class _DropsEveryThird(Toxic):
    type_name: ClassVar[str] = "test_drops_every_third"

    async def pipe(self, stub: ToxicStub) -> None:
        k = 0
        while (chunk := await stub.recv()) is not None:
            k += 1
            if k % 3:
                stub.send(chunk)
        stub.close()


@dataclass
class _CountsOnSelf(Toxic):
    """limit_data with its count on the instance: one direction's bytes eat the other's."""

    type_name: ClassVar[str] = "test_counts_on_self"
    bytes: int = 1000
    transmitted: int = 0

    async def pipe(self, stub: ToxicStub) -> None:
        while (chunk := await stub.recv()) is not None:
            if self.transmitted < self.bytes:
                stub.send(chunk)
                self.transmitted += len(chunk.data)
            await asyncio.sleep(0)
        stub.close()


@dataclass
class _NeverCloses(Toxic):
    type_name: ClassVar[str] = "test_never_closes"

    async def pipe(self, stub: ToxicStub) -> None:
        while (chunk := await stub.recv()) is not None:
            stub.send(chunk)


@dataclass
class _DropsWhatItHolds(LatencyToxic):
    """latency that sleeps with a chunk in hand and loses it when cancelled (no sleep_or_flush)."""

    type_name: ClassVar[str] = "test_drops_what_it_holds"

    async def pipe(self, stub: ToxicStub) -> None:
        while (chunk := await stub.recv()) is not None:
            await asyncio.sleep(self.latency / 1000)
            stub.send(chunk)
        stub.close()


@dataclass
class _TakesTheLatencyWord(Toxic):
    type_name: ClassVar[str] = "latency"


def test_a_toxic_that_drops_a_chunk_fails_naming_the_lost_bytes():
    with pytest.raises(
        AssertionError,
        match=r"2400 bytes came and 1600 left; every chunk handed to the stub leaves "
        r"it exactly once",
    ):
        check_toxic(_DropsEveryThird)


def test_a_toxic_whose_state_is_shared_between_its_directions_fails():
    with pytest.raises(
        AssertionError,
        match=r"second connection other bytes .* per-connection state belongs on the "
        r"stub \(new_state\)",
    ):
        check_toxic(_CountsOnSelf, drops=True)


def test_a_toxic_that_never_closes_its_stub_fails():
    with pytest.raises(AssertionError, match=r"returned without closing its stub; call stub.close\(\)"):
        check_toxic(_NeverCloses)


def test_a_toxic_that_drops_the_chunk_it_holds_when_cancelled_fails():
    check_toxic(_DropsWhatItHolds)  # with no latency it never holds a chunk: nothing to lose
    with pytest.raises(AssertionError, match=r"cancelled mid-stream .*: 600 bytes came and 400 left"):
        check_toxic(_DropsWhatItHolds, {"latency": 50})


def test_a_toxic_whose_type_word_is_registered_to_another_class_fails():
    with pytest.raises(
        AssertionError, match=r"type_name 'latency' of _TakesTheLatencyWord is registered to LatencyToxic"
    ):
        check_toxic(_TakesTheLatencyWord)
