"""msgpack bodies: round trips for every kind, validation, and fuzzing that only WireError escapes."""

import dataclasses

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from wire import ErrorCode, Header, MsgType, WireError, decode_message, unpack_header
from wire.golden import golden_messages, load_vectors
from wire.messages import REGISTRY, ActionChunk, Observation, SessionOpen

GOLDEN = golden_messages()


def _same(a, b):
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and not isinstance(a, str):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def assert_messages_equal(a, b):
    assert type(a) is type(b)
    for f in dataclasses.fields(a):
        assert _same(getattr(a, f.name), getattr(b, f.name)), f.name


def test_every_registered_kind_has_a_golden_vector():
    assert set(REGISTRY) == set(GOLDEN) == set(load_vectors())


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_vectors_are_byte_exact(name):
    header, msg = GOLDEN[name]
    vec = load_vectors()[name]
    assert header.pack().hex() == vec["header"], "header encoding changed: a schema decision (see wire/golden)"
    assert msg.encode().hex() == vec["body"], "body encoding changed: a schema decision (see wire/golden)"
    assert unpack_header(bytes.fromhex(vec["header"])) == header
    assert_messages_equal(decode_message(bytes.fromhex(vec["body"])), msg)


f32 = hnp.arrays(
    np.float32, hnp.array_shapes(min_dims=1, max_dims=2, max_side=6), elements=st.floats(-1e6, 1e6, width=32)
)
names = st.text(st.characters(codec="utf-8"), max_size=12)


@given(
    state=f32,
    prefix=st.none() | f32,
    task=names,
    delay=st.integers(0, 10_000),
    urgency=st.floats(0, 1),
    priority=st.integers(0, 255),
    steps=st.none() | st.integers(0, 10**6),
    meta=st.dictionaries(names, names, max_size=4),
    start=st.booleans(),
)
def test_observation_round_trips(state, prefix, task, delay, urgency, priority, steps, meta, start):
    m = Observation(
        "s",
        state,
        task=task,
        inference_delay_steps=delay,
        prefix_model=prefix,
        prefix_robot=prefix,
        episode_start=start,
        urgency=urgency,
        priority=priority,
        steps_remaining=steps,
        metadata=meta,
        tensors={"extra": state.astype(np.int64)},
    )
    assert_messages_equal(decode_message(m.encode(), expect=Observation), m)


@given(
    chunk=f32,
    seq=st.integers(0, 2**64 - 1),
    mono=st.integers(-(2**63), 2**63 - 1),
    wait=st.floats(0, 1e6),
    sup=st.integers(0, 2**32),
)
def test_action_chunk_round_trips(chunk, seq, mono, wait, sup):
    m = ActionChunk("s", seq, mono, chunk, chunk * 2, queue_wait_ms=wait, inference_ms=wait, superseded_seqs=sup)
    assert_messages_equal(decode_message(m.encode(), expect=ActionChunk), m)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_unknown_keys_are_ignored(name):
    _, msg = GOLDEN[name]
    obj = msg.to_wire()
    obj["from_the_future"] = {"nested": [1, 2, 3]}
    assert_messages_equal(decode_message(msgpack.packb(obj, use_bin_type=True)), msg)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_missing_required_keys_are_rejected_by_name(name):
    _, msg = GOLDEN[name]
    for f in msg.FIELDS:
        if not f.required:
            continue
        obj = msg.to_wire()
        del obj[f.name]
        with pytest.raises(WireError, match=f.name):
            decode_message(msgpack.packb(obj, use_bin_type=True))


def test_out_of_range_urgency_is_rejected():
    obj = GOLDEN["observation"][1].to_wire()
    obj["urgency"] = 1.5
    with pytest.raises(WireError, match="urgency"):
        decode_message(msgpack.packb(obj, use_bin_type=True))


def test_expect_refuses_another_kind():
    with pytest.raises(WireError, match="expected Observation"):
        decode_message(GOLDEN["status"][1].encode(), expect=Observation)


def test_oversize_body_is_refused_before_parsing():
    from wire.tensors import Limits

    with pytest.raises(WireError) as exc:
        decode_message(GOLDEN["observation"][1].encode(), limits=Limits(max_message_bytes=64))
    assert exc.value.code == ErrorCode.TOO_LARGE


# ---- fuzzing: only WireError may come out -----------------------------------------------------


def _only_wire_errors(raw):
    try:
        decode_message(raw)
    except WireError:
        pass


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_random_bytes(raw):
    _only_wire_errors(raw)


@settings(max_examples=200)
@given(st.sampled_from(sorted(GOLDEN)), st.data())
def test_truncated_and_bit_flipped_golden_messages(name, data):
    raw = bytearray(GOLDEN[name][1].encode())
    cut = data.draw(st.integers(0, len(raw)))
    _only_wire_errors(bytes(raw[:cut]))
    pos = data.draw(st.integers(0, len(raw) - 1))
    raw[pos] ^= 1 << data.draw(st.integers(0, 7))
    _only_wire_errors(bytes(raw))


plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=16),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(GOLDEN)), st.data())
def test_type_confused_fields(name, data):
    obj = GOLDEN[name][1].to_wire()
    for key in data.draw(st.lists(st.sampled_from(sorted(obj)), min_size=1, max_size=3)):
        obj[key] = data.draw(plain)
    _only_wire_errors(msgpack.packb(obj, use_bin_type=True))


@settings(max_examples=100)
@given(st.sampled_from(["state", "prefix_model", "chunk_model", "images"]), plain)
def test_type_confused_nested_structures(field, value):
    for name in ("observation", "action_chunk"):
        obj = GOLDEN[name][1].to_wire()
        if field in obj:
            target = obj[field]
            if isinstance(target, dict) and target:
                target[next(iter(target))] = value
            obj[field] = target
            _only_wire_errors(msgpack.packb(obj, use_bin_type=True))


def test_non_bytes_body_is_a_wire_error():
    with pytest.raises(WireError):
        decode_message(12345)


def test_session_open_rejects_bool_as_int():
    obj = GOLDEN["session_open"][1].to_wire()
    obj["state_dim"] = True
    with pytest.raises(WireError, match="state_dim"):
        decode_message(msgpack.packb(obj, use_bin_type=True), expect=SessionOpen)
