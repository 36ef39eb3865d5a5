"""Camera frames on the wire: JPEG, PNG or raw, always RGB, always HxWxC uint8.

    {"codec": "jpeg", "data": <bin>, "shape": [480, 640, 3]}

Invariant: a frame handed to `encode_image` in RGB order decodes in RGB order (a pure red frame
decodes red, never blue); the server never has to guess the channel order. Decoding is lazy:
`EncodedImage` keeps the bytes until someone calls `.decode()`, which may ask for a JPEG scaled down
to no less than the size its consumer resizes to (`at_least`).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import simplejpeg

from wire.errors import WireError
from wire.tensors import DEFAULT_LIMITS, Limits

CODECS = ("jpeg", "png", "raw")


@dataclass(frozen=True, slots=True)
class EncodedImage:
    codec: str
    data: bytes
    shape: tuple[int, int, int] | None = None  # required for raw, advisory otherwise

    def to_wire(self) -> dict:
        out: dict = {"codec": self.codec, "data": self.data}
        if self.shape is not None:
            out["shape"] = list(self.shape)
        return out

    def decode(self, limits: Limits = DEFAULT_LIMITS, at_least: tuple[int, int] | None = None) -> np.ndarray:
        return decode_image(self, limits, at_least)


def encode_image(frame: np.ndarray, codec: str = "jpeg", quality: int = 90) -> EncodedImage:
    """Encode an HxWx3 (or HxWx1) uint8 RGB frame. `quality` applies to JPEG only."""
    a = np.asarray(frame)
    if a.dtype != np.uint8 or a.ndim != 3 or a.shape[2] not in (1, 3):
        raise WireError("BAD_IMAGE", f"frames must be HxWx3 or HxWx1 uint8 RGB, got {a.dtype} {a.shape}")
    shape = (int(a.shape[0]), int(a.shape[1]), int(a.shape[2]))
    if codec == "raw":
        return EncodedImage("raw", np.ascontiguousarray(a).tobytes(), shape)
    if codec == "jpeg":
        if not 1 <= quality <= 100:
            raise WireError("BAD_IMAGE", f"JPEG quality {quality} must be in 1..100")
        cs = "RGB" if shape[2] == 3 else "GRAY"
        return EncodedImage(
            "jpeg", simplejpeg.encode_jpeg(np.ascontiguousarray(a), quality=quality, colorspace=cs), shape
        )
    if codec == "png":
        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(a[:, :, 0] if shape[2] == 1 else a, "L" if shape[2] == 1 else "RGB").save(
            buf, "PNG", compress_level=1
        )
        return EncodedImage("png", buf.getvalue(), shape)
    raise WireError("BAD_IMAGE", f"codec {codec!r} unknown; use one of {CODECS}", "codec")


def image_from_wire(obj: object, field: str, limits: Limits = DEFAULT_LIMITS) -> EncodedImage:
    if not isinstance(obj, dict):
        raise WireError("MALFORMED", f"{field} must be a map with codec and data", field)
    codec, data, shape = obj.get("codec"), obj.get("data"), obj.get("shape")
    if not isinstance(codec, str) or codec not in CODECS:
        raise WireError("BAD_IMAGE", f"{field}.codec {codec!r} unknown; use one of {CODECS}", field)
    if not isinstance(data, (bytes, bytearray)):
        raise WireError("BAD_IMAGE", f"{field}.data must be msgpack bin", field)
    if shape is not None:
        if (
            not isinstance(shape, list)
            or len(shape) != 3
            or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)
            or shape[2] not in (1, 3)
        ):
            raise WireError("BAD_IMAGE", f"{field}.shape must be [h, w, 1|3], got {shape!r}", field)
        if shape[0] * shape[1] > limits.max_image_pixels:
            raise WireError(
                "TOO_LARGE", f"{field} is {shape[0]}x{shape[1]}; limit {limits.max_image_pixels} pixels", field
            )
        shape = (shape[0], shape[1], shape[2])
    if codec == "raw":
        if shape is None:
            raise WireError("BAD_IMAGE", f"{field}: raw frames need shape [h, w, c]", field)
        if shape[0] * shape[1] * shape[2] != len(data):
            raise WireError(
                "BAD_IMAGE",
                f"{field}: raw shape {list(shape)} needs {shape[0] * shape[1] * shape[2]} bytes, got {len(data)}",
                field,
            )
    return EncodedImage(codec, bytes(data), shape)


def decode_image(
    img: EncodedImage, limits: Limits = DEFAULT_LIMITS, at_least: tuple[int, int] | None = None
) -> np.ndarray:
    """Decode to HxWxC uint8 RGB. Corrupt data raises WireError(BAD_IMAGE).

    `at_least` (h, w): the size the caller will resize to. A frame at least twice that size each way comes back
    scaled down, never below `at_least`: a JPEG by libjpeg's DCT scaling (1/2 to 1/8, in the decode), a PNG by
    an integer box filter after it. A frame many times the size its consumer needs then costs little more than
    one of that size (a 4096x4096 frame for a 64x64 camera held a replica's dispatch thread 0.3-1 s at full
    size: the float conversion and antialiased resize of 16 M pixels). Smaller frames come back unchanged."""
    if img.codec == "raw":
        assert img.shape is not None
        return np.frombuffer(img.data, dtype=np.uint8).reshape(img.shape)
    try:
        if img.codec == "jpeg":
            h, w, c, _ = simplejpeg.decode_jpeg_header(img.data)
            if h * w > limits.max_image_pixels:
                raise WireError("TOO_LARGE", f"JPEG is {h}x{w}; limit {limits.max_image_pixels} pixels")
            if img.shape is not None and (h, w) != img.shape[:2]:  # refused before the decode is paid for
                raise WireError("BAD_IMAGE", f"JPEG is {h}x{w} but declares {list(img.shape)}")
            want_grey = img.shape is not None and img.shape[2] == 1
            scale = {"min_height": at_least[0], "min_width": at_least[1], "min_factor": 2} if at_least else {}
            out = simplejpeg.decode_jpeg(img.data, colorspace="GRAY" if want_grey else "RGB", **scale)
            out = out.reshape(out.shape[0], out.shape[1], -1)
        else:
            from PIL import Image

            with Image.open(io.BytesIO(img.data)) as im:
                if im.width * im.height > limits.max_image_pixels:
                    raise WireError(
                        "TOO_LARGE", f"PNG is {im.height}x{im.width}; limit {limits.max_image_pixels} pixels"
                    )
                if img.shape is not None and (im.height, im.width) != img.shape[:2]:  # before the decode, as a JPEG
                    raise WireError("BAD_IMAGE", f"PNG is {im.height}x{im.width} but declares {list(img.shape)}")
                want_grey = img.shape is not None and img.shape[2] == 1
                im = im.convert("L" if want_grey else "RGB")
                factor = min(im.height // at_least[0], im.width // at_least[1]) if at_least else 1
                if factor >= 2:  # a box filter on the bytes, before the consumer's float resize of every pixel
                    im = im.reduce(factor)
                out = np.asarray(im)
                out = out.reshape(out.shape[0], out.shape[1], -1)
    except WireError:
        raise
    except Exception as exc:  # decoder libraries raise many types; the contract is one
        raise WireError("BAD_IMAGE", f"{img.codec} frame could not be decoded: {exc}") from None
    if img.shape is not None and out.shape[2] != img.shape[2]:  # its height and width were checked before decoding
        raise WireError("BAD_IMAGE", f"frame decodes to {out.shape[2]} channels but declares {list(img.shape)}")
    return out
