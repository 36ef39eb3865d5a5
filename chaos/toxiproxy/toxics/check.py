"""`check_toxic`: the toxic contract of `toxic.py` as a check anyone can run on a toxic (theirs or ours).

    check_toxic(MyToxic, attributes={"latency": 20})   # raises AssertionError naming what broke

It runs the toxic's `pipe()` on real `ToxicStub`s and `ChunkQueue`s in a fresh event loop, as a proxy's
link does, and checks what the module docstring of `toxic.py` promises: the type word and the registry
agree, the JSON attributes round-trip (all or nothing on a bad value), every byte handed to the stub leaves
it once and in order (or, for a toxic whose purpose is to drop, `drops=True`: what leaves is a prefix of
what came, never reordered, duplicated or invented), end of stream closes or resets the stub exactly once,
a cancelled pipe forwards what it holds, and one instance serves many connections and both directions at
once with its per-connection state on the stub (`new_state`), never on itself. Stream and toxicity are the
proxy's (`proxy.ToxicWrapper`), not the toxic's: a toxic never knows which direction it runs on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
from collections.abc import Mapping
from typing import Any

from chaos.toxiproxy.toxics.toxic import RESET, BadAttribute, Chunk, ChunkQueue, Toxic, ToxicStub

__all__ = ["check_toxic"]

_END = {None: "close", RESET: "reset"}


class _Recorder:
    """A stub's output that keeps everything put into it (what the next stage or the sink would get)."""

    def __init__(self):
        self.items: list = []

    def put(self, item) -> None:
        self.items.append(item)


def _payload(direction: int, n: int = 12, size: int = 200) -> list[bytes]:
    """`n` reads of `size` bytes, each byte sequence unique to its direction and position."""
    return [bytes((direction * 97 + i * 31 + j) % 251 for j in range(size)) for i in range(n)]


def check_toxic(
    toxic: type[Toxic] | Toxic,
    attributes: Mapping[str, Any] | None = None,
    *,
    drops: bool = False,
    timeout_s: float = 5.0,
) -> None:
    """Assert the toxic contract (chaos/toxiproxy/toxics/toxic.py) on `toxic`, a Toxic class or instance.

    attributes: set with `update_attributes` first (e.g. a latency that holds chunks, so cancellation is tested
    while it holds one). drops: the toxic's purpose is to lose data (timeout, reset_peer, limit_data); then what
    leaves must be a prefix of what came. timeout_s bounds each run of `pipe()`. Raises AssertionError."""
    cls = toxic if inspect.isclass(toxic) else type(toxic)
    name = cls.__name__
    assert issubclass(cls, Toxic), f"check_toxic: {name} is not a chaos.toxiproxy.toxics.Toxic subclass"
    assert dataclasses.is_dataclass(cls), (
        f"check_toxic: {name} must be a @dataclass (its fields are its JSON attributes)"
    )
    word = cls.type_name
    assert isinstance(word, str) and word, (
        f"check_toxic: {name}.type_name is {word!r}; set the JSON API's type word "
        f"(type_name: ClassVar[str] = \"my_fault\")"
    )
    from chaos.toxiproxy.toxics import REGISTRY

    assert REGISTRY.get(word, cls) is cls, (
        f"check_toxic: type_name {word!r} of {name} is registered to "
        f"{REGISTRY[word].__name__}; the API word and the class must be one"
    )
    assert inspect.iscoroutinefunction(cls.pipe), f"check_toxic: {name}.pipe must be `async def pipe(self, stub)`"

    def make() -> Toxic:
        try:
            t = cls() if inspect.isclass(toxic) else dataclasses.replace(toxic)
        except TypeError as exc:
            raise AssertionError(
                f"check_toxic: {name}() failed ({exc}): the API creates a toxic with no arguments "
                f"(new_toxic), so every attribute needs a default"
            ) from None
        if attributes is not None:
            t.update_attributes(dict(attributes))
        return t

    t = make()
    _check_attributes(t, name)
    asyncio.run(_check_pipe(t, name, drops, timeout_s))


def _check_attributes(t: Toxic, name: str) -> None:
    attrs = t.attributes()
    assert isinstance(attrs, dict) and tuple(attrs) == t.attribute_names(), (
        f"check_toxic: {name}.attributes() must map every field to its value, got {attrs!r}"
    )
    try:
        json.dumps(attrs)
    except (TypeError, ValueError) as exc:
        raise AssertionError(
            f"check_toxic: {name}.attributes() is not JSON ({exc}); the API returns it as is"
        ) from None
    for raw in (None, {}, {"no_such_attribute": 1}, dict(attrs)):
        t.update_attributes(raw)
        assert t.attributes() == attrs, (
            f"check_toxic: {name}.update_attributes({raw!r}) changed the attributes to "
            f"{t.attributes()!r}; unknown keys are ignored and setting the same values "
            f"twice changes nothing"
        )
    for f in dataclasses.fields(t):
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        if kind not in ("int", "float"):
            continue
        try:
            t.update_attributes({**attrs, f.name: "not a number"})
        except BadAttribute as exc:
            assert f.name in str(exc), f"check_toxic: the BadAttribute for {name}.{f.name} must name it: {exc}"
        else:
            raise AssertionError(
                f"check_toxic: {name}.update_attributes accepted a string for {f.name} ({kind}); "
                f"it must raise BadAttribute"
            )
        assert t.attributes() == attrs, (
            f"check_toxic: a bad {name}.{f.name} changed other attributes; an update is all or nothing"
        )


async def _run(
    toxic: Toxic, reads: list[bytes], timeout_s: float, name: str, what: str, end: bool = True
) -> tuple[_Recorder, ToxicStub]:
    """Feed `reads` (and end of stream when `end`) to `toxic.pipe` on a fresh stub; wait for it to return."""
    out = _Recorder()
    stub = ToxicStub(ChunkQueue(), out, toxic.new_state())
    t0 = stub.now()
    for k, data in enumerate(reads):
        stub.input.put(Chunk(data, t0 + k * 1e-6))
    if end:
        stub.input.put(None)
    task = asyncio.ensure_future(toxic.pipe(stub))
    try:
        await asyncio.wait_for(asyncio.shield(task), timeout_s)
    except TimeoutError:
        task.cancel()
        raise AssertionError(
            f"check_toxic: {name}.pipe() {what} did not return within {timeout_s:g} s of end of stream; "
            f"on recv() -> None a toxic calls stub.close() (or stub.reset()) and returns"
        ) from None
    except Exception as exc:
        raise AssertionError(f"check_toxic: {name}.pipe() {what} raised {type(exc).__name__}: {exc}") from None
    return out, stub


def _stream(out: _Recorder, name: str, what: str) -> tuple[bytes, str]:
    """The bytes the stub sent and how the stream ended ("close", "reset" or "" if it never did)."""
    data, ending = [], ""
    for item in out.items:
        assert not ending, f"check_toxic: {name} {what}: {item!r} was sent after the stream's {ending}"
        if item is None or item is RESET:
            ending = _END[item]
            continue
        assert isinstance(item, Chunk) and isinstance(item.data, bytes), (
            f"check_toxic: {name} {what}: sent {item!r}; a toxic sends Chunk objects with bytes data"
        )
        assert item.asked >= 0, f"check_toxic: {name} {what}: a chunk's asked delay went negative ({item.asked})"
        data.append(item.data)
    return b"".join(data), ending


def _conserved(sent: bytes, came: bytes, drops: bool, name: str, what: str) -> None:
    if drops:
        assert came.startswith(sent), (
            f"check_toxic: {name} {what}: the {len(sent)} bytes it sent are not a prefix of "
            f"the {len(came)} that came: a dropping toxic may lose the rest of a stream, but "
            f"never reorder, duplicate or invent bytes"
        )
    else:
        assert sent == came, (
            f"check_toxic: {name} {what}: {len(came)} bytes came and {len(sent)} left"
            f"{', in another order' if len(sent) == len(came) else ''}; every chunk handed to the "
            f"stub leaves it exactly once, in order (pass drops=True only if losing data is the "
            f"toxic's purpose)"
        )


async def _check_pipe(t: Toxic, name: str, drops: bool, timeout_s: float) -> None:
    reads = _payload(0)
    came = b"".join(reads)
    # one connection, one direction: the stream and its end
    out, stub = await _run(t, reads, timeout_s, name, "on one stream")
    sent, ending = _stream(out, name, "on one stream")
    _conserved(sent, came, drops, name, "on one stream")
    assert ending, (
        f"check_toxic: {name}.pipe() returned without closing its stub; call stub.close() on end of stream "
        f"(or stub.reset()), or the destination is never closed"
    )
    assert stub.closed
    t.cleanup(stub)
    # the same instance, a second connection: nothing it did on the first may carry over (state lives on the stub)
    again, _ = await _run(t, reads, timeout_s, name, "on a second connection")
    assert _stream(again, name, "on a second connection") == (sent, ending), (
        f"check_toxic: {name} gave a second connection other bytes or another ending than the first; the same "
        f"instance serves every connection, so per-connection state belongs on the stub (new_state), not on self"
    )
    # both directions at once on one instance: each sees only its own stream
    s1, s2 = t.new_state(), t.new_state()
    assert s1 is None or s1 is not s2, (
        f"check_toxic: {name}.new_state() returned the same object twice; each connection direction needs its own"
    )
    other = _payload(1)
    (o1, _), (o2, _) = await asyncio.gather(
        _run(t, reads, timeout_s, name, "upstream, beside downstream"),
        _run(t, other, timeout_s, name, "downstream, beside upstream"),
    )
    b1, e1 = _stream(o1, name, "upstream, beside downstream")
    b2, e2 = _stream(o2, name, "downstream, beside upstream")
    _conserved(b2, b"".join(other), drops, name, "downstream, beside upstream")
    assert (b1, e1) == (sent, ending) and len(b2) == len(sent) and e2 == ending, (
        f"check_toxic: {name} running on two directions at once gave {len(b1)} and {len(b2)} bytes ({e1}, {e2}), "
        f"alone {len(sent)} ({ending}); one direction's stream must not change the other's: keep per-direction "
        f"state on the stub (new_state), not on self"
    )
    # cancelled while it runs (the toxic removed or updated): what it holds is forwarded, never dropped
    rec = _Recorder()
    stub = ToxicStub(ChunkQueue(), rec, t.new_state())
    for k, data in enumerate(reads[:3]):
        stub.input.put(Chunk(data, stub.now() + k * 1e-6))
    task = asyncio.ensure_future(t.pipe(stub))
    for _ in range(100):  # let it take what it can (a holding toxic sleeps with a chunk in hand)
        if not len(stub.input) or task.done():
            break
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    except Exception as exc:
        raise AssertionError(f"check_toxic: {name}.pipe() raised {type(exc).__name__} when cancelled: {exc}") from None
    t.cleanup(stub)
    held, _ = _stream(rec, name, "cancelled mid-stream")
    left = b"".join(c.data for c in stub.input.drain() if isinstance(c, Chunk))
    # a dropping toxic may have dropped what it took; any other must account for every byte
    _conserved(
        held if drops else held + left,
        b"".join(reads[:3]),
        drops,
        name,
        "cancelled mid-stream (what it sent, then what it had not taken)",
    )
