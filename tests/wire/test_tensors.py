"""Tensors: every dtype round-trips bit for bit; decoding is a zero-copy read-only view."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from wire import WireError, decode_tensor, encode_tensor
from wire.tensors import DTYPES, Limits, bfloat16_bits_to_float32, float32_to_bfloat16_bits

NATIVE = [d for d in DTYPES if d != "bfloat16"]
shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)


@pytest.mark.parametrize("word", NATIVE)
@given(data=st.data())
def test_every_dtype_round_trips_bitwise(word, data):
    a = data.draw(hnp.arrays(np.dtype(DTYPES[word]).newbyteorder("="), shapes))
    wire_obj = encode_tensor(a)
    assert wire_obj["dtype"] == word
    b = decode_tensor(wire_obj)
    assert b.shape == a.shape and b.dtype.newbyteorder("=") == a.dtype
    assert b.tobytes() == np.ascontiguousarray(a).astype(DTYPES[word]).tobytes()


@given(hnp.arrays(np.uint16, shapes))
def test_bfloat16_bit_patterns_round_trip(bits):
    obj = encode_tensor(bits, dtype="bfloat16")
    assert decode_tensor(obj, bf16="raw").tobytes() == bits.astype("<u2").tobytes()
    widened = decode_tensor(obj)
    assert widened.dtype == np.float32
    assert np.array_equal(float32_to_bfloat16_bits(widened), bits.astype("<u2")) or np.isnan(widened).any()


def test_bfloat16_from_float_rounds_to_nearest():
    x = np.array([1.0, 3.140625, -2.5], dtype=np.float32)
    back = bfloat16_bits_to_float32(float32_to_bfloat16_bits(x))
    assert np.array_equal(back, x)  # all three are exactly representable in bfloat16


def test_decoded_tensor_is_a_read_only_view_of_the_payload():
    payload = encode_tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    out = decode_tensor(payload)
    assert not out.flags.writeable
    assert np.shares_memory(out, np.frombuffer(payload["data"], dtype=np.uint8))


@pytest.mark.parametrize(
    "obj,match",
    [
        ({"dtype": "float32", "shape": [2], "data": b"\0" * 7}, "needs 8 bytes"),
        ({"dtype": "complex64", "shape": [1], "data": b"\0" * 8}, "unknown"),
        ({"dtype": "float32", "shape": [-1], "data": b""}, "non-negative"),
        ({"dtype": "float32", "shape": [1] * 9, "data": b"\0" * 4}, "rank"),
        ({"dtype": "float32", "shape": "3", "data": b""}, "shape"),
        ({"dtype": "float32", "shape": [1], "data": "abcd"}, "bin"),
        ([1, 2], "map"),
    ],
)
def test_malformed_tensors_raise_wire_error(obj, match):
    with pytest.raises(WireError, match=match):
        decode_tensor(obj)


def test_element_limit_applies_before_allocation():
    with pytest.raises(WireError) as exc:
        decode_tensor({"dtype": "uint8", "shape": [10**6, 10**6], "data": b""}, limits=Limits(max_elements=1000))
    assert exc.value.code == "TOO_LARGE"


def test_unsupported_numpy_dtype_is_refused_with_the_list():
    with pytest.raises(WireError, match="float32"):
        encode_tensor(np.zeros(2, dtype=np.complex64))
