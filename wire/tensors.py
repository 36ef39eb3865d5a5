"""Tensors on the wire: raw little-endian bytes + dtype word + shape, as a msgpack map.

    {"dtype": "float32", "shape": [50, 7], "data": <bin 1400 bytes>}

Invariants: `decode_tensor(encode_tensor(a))` equals `a` bit for bit (dtype and shape included);
decoding returns a read-only numpy *view* of the payload bytes (no copy) for every dtype numpy
represents natively; `bfloat16`, which numpy lacks, decodes to float32 (one widening copy) or, with
``bf16="raw"``, to a uint16 view of the bit patterns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wire.errors import WireError

# dtype word on the wire -> little-endian numpy dtype holding the bytes
DTYPES: dict[str, np.dtype] = {
    "float16": np.dtype("<f2"),
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "bfloat16": np.dtype("<u2"),  # bit patterns; numpy has no bfloat16
    "uint8": np.dtype("u1"),
    "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"),
    "bool": np.dtype("?"),
}
_NUMPY_TO_WIRE = {np.dtype(v).newbyteorder("="): k for k, v in DTYPES.items() if k != "bfloat16"}


@dataclass(frozen=True, slots=True)
class Limits:
    """Decoder size limits. Defaults fit 3 cameras of 1080p PNG with room to spare."""

    max_message_bytes: int = 32 * 1024 * 1024
    max_tensors: int = 64
    max_rank: int = 8
    max_elements: int = 64 * 1024 * 1024
    max_images: int = 16
    max_image_pixels: int = 4096 * 4096
    max_string_chars: int = 4096
    max_map_entries: int = 256
    max_list_items: int = 4096


DEFAULT_LIMITS = Limits()


def float32_to_bfloat16_bits(a: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (nearest-even) and return the uint16 bit patterns."""
    f = np.asarray(a, dtype="<f4")
    bits = np.ascontiguousarray(f).reshape(-1).view("<u4").astype(np.uint64)
    rounding = ((bits >> 16) & 1) + 0x7FFF
    out = ((bits + rounding) >> 16).astype("<u2")
    out[np.isnan(f.reshape(-1))] = 0x7FC0
    return out.reshape(f.shape)


def bfloat16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype("<u4") << 16).view("<f4")


def encode_tensor(array: np.ndarray, dtype: str | None = None) -> dict:
    """Encode `array`. `dtype="bfloat16"` rounds a float array (or takes uint16 bit patterns)."""
    a = np.asarray(array)
    if dtype == "bfloat16":
        bits = a.astype("<u2") if a.dtype == np.uint16 else float32_to_bfloat16_bits(a.astype(np.float32))
        return {"dtype": "bfloat16", "shape": list(a.shape), "data": np.ascontiguousarray(bits).tobytes()}
    word = dtype or _NUMPY_TO_WIRE.get(a.dtype.newbyteorder("="))
    if word not in DTYPES:
        raise WireError(
            "BAD_TENSOR",
            f"dtype {a.dtype} is not on the wire; use one of {sorted(DTYPES)}",
            "dtype",
        )
    data = np.ascontiguousarray(a, dtype=DTYPES[word]).tobytes()
    return {"dtype": word, "shape": list(a.shape), "data": data}


def decode_tensor(
    obj: object, field: str = "tensor", limits: Limits = DEFAULT_LIMITS, bf16: str = "float32"
) -> np.ndarray:
    if not isinstance(obj, dict):
        raise WireError("MALFORMED", f"{field} must be a map with dtype, shape, data", field)
    word, shape, data = obj.get("dtype"), obj.get("shape"), obj.get("data")
    if not isinstance(word, str) or word not in DTYPES:
        raise WireError("BAD_TENSOR", f"{field}.dtype {word!r} unknown; use one of {sorted(DTYPES)}", field)
    if not isinstance(shape, list):
        raise WireError("BAD_TENSOR", f"{field}.shape must be a list of non-negative ints, got {shape!r}", field)
    count, max_elements = 1, limits.max_elements
    for d in shape:  # one pass: each dimension a plain int (not a bool), >= 0 and within the limit
        if type(d) is not int or d < 0:
            raise WireError("BAD_TENSOR", f"{field}.shape must be a list of non-negative ints, got {shape!r}", field)
        if d > max_elements:
            raise WireError("TOO_LARGE", f"{field} has a dimension over {max_elements}", field)
        count *= d
    if len(shape) > limits.max_rank:
        raise WireError("TOO_LARGE", f"{field} has rank {len(shape)}; the limit is {limits.max_rank}", field)
    if not isinstance(data, (bytes, bytearray)):
        raise WireError("BAD_TENSOR", f"{field}.data must be msgpack bin, got {type(data).__name__}", field)
    if count > limits.max_elements:
        raise WireError("TOO_LARGE", f"{field} has {count} elements; the limit is {limits.max_elements}", field)
    dt = DTYPES[word]
    if count * dt.itemsize != len(data):
        raise WireError(
            "BAD_TENSOR",
            f"{field} shape {shape} of {word} needs {count * dt.itemsize} bytes, got {len(data)}",
            field,
        )
    view = np.frombuffer(data, dtype=dt).reshape(shape)
    if word == "bfloat16" and bf16 == "float32":
        return bfloat16_bits_to_float32(view)
    return view
