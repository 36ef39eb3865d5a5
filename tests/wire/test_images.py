"""Images: RGB order survives every codec (a silent BGR swap would poison every policy)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wire import WireError, encode_image
from wire.images import EncodedImage, decode_image, image_from_wire


@pytest.mark.parametrize("codec", ["jpeg", "png", "raw"])
def test_pure_red_decodes_red_not_blue(codec):
    frame = np.zeros((32, 48, 3), np.uint8)
    frame[..., 0] = 255
    out = encode_image(frame, codec, quality=90).decode()
    assert out.shape == (32, 48, 3)
    r, g, b = out[..., 0].mean(), out[..., 1].mean(), out[..., 2].mean()
    assert r > 240 and g < 15 and b < 15


@pytest.mark.parametrize("codec", ["jpeg", "png", "raw"])
def test_rgb_stripes_keep_their_order(codec):
    frame = np.zeros((48, 48, 3), np.uint8)
    for i in range(3):
        frame[:, i * 16 : (i + 1) * 16, i] = 255
    out = encode_image(frame, codec).decode().astype(int)
    for i in range(3):
        stripe = out[:, i * 16 + 4 : (i + 1) * 16 - 4]
        assert stripe[..., i].mean() > 200
        assert all(stripe[..., j].mean() < 60 for j in range(3) if j != i)


def test_lossless_codecs_are_exact():
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)
    for codec in ("png", "raw"):
        assert np.array_equal(encode_image(frame, codec).decode(), frame)


def test_corrupt_jpeg_gives_bad_image():
    with pytest.raises(WireError) as exc:
        decode_image(EncodedImage("jpeg", b"\xff\xd8garbage"))
    assert exc.value.code == "BAD_IMAGE"


def test_raw_frame_needs_matching_shape():
    with pytest.raises(WireError, match="needs 12 bytes"):
        image_from_wire({"codec": "raw", "data": b"\0" * 11, "shape": [2, 2, 3]}, "img")
    with pytest.raises(WireError, match="need shape"):
        image_from_wire({"codec": "raw", "data": b"\0" * 12}, "img")


def test_non_uint8_frames_are_refused():
    with pytest.raises(WireError, match="uint8"):
        encode_image(np.zeros((4, 4, 3), np.float32))


@settings(max_examples=150)
@given(st.sampled_from(["jpeg", "png"]), st.binary(max_size=300))
def test_random_bytes_as_images_give_only_wire_errors(codec, data):
    try:
        decode_image(EncodedImage(codec, data))
    except WireError:
        pass


def test_a_jpeg_far_larger_than_its_consumer_needs_decodes_scaled_down_but_never_below_it():
    rng = np.random.default_rng(0)
    big = encode_image(rng.integers(0, 256, (4096, 4096, 3), dtype=np.uint8), quality=5)
    out = big.decode(at_least=(64, 64))
    assert out.shape == (512, 512, 3)  # libjpeg's smallest scale, 1/8, still at least 64x64
    assert big.decode(at_least=(600, 700)).shape == (1024, 1024, 3)  # 1/4 keeps both sides >= asked


def test_a_png_far_larger_than_its_consumer_needs_comes_back_reduced_but_never_below_it():
    big = encode_image(np.zeros((4096, 2048, 3), np.uint8), codec="png")  # 4096x2048 pixels in ~110 KB
    assert big.decode(at_least=(64, 64)).shape == (128, 64, 3)
    assert big.decode(at_least=(1000, 1000)).shape == (2048, 1024, 3)
    red = np.zeros((256, 256, 3), np.uint8)
    red[..., 0] = 255
    np.testing.assert_array_equal(encode_image(red, codec="png").decode(at_least=(64, 64)), red[:64, :64])


def test_a_jpeg_under_twice_its_consumers_size_decodes_unchanged():
    frame = np.random.default_rng(1).integers(0, 256, (100, 120, 3), dtype=np.uint8)
    img = encode_image(frame)
    np.testing.assert_array_equal(img.decode(at_least=(64, 64)), img.decode())
    assert img.decode(at_least=(100, 120)).shape == (100, 120, 3)


@pytest.mark.parametrize("codec", ["jpeg", "png"])
def test_a_frame_whose_header_contradicts_its_declared_shape_is_refused_before_decoding(codec):
    img = encode_image(np.zeros((64, 64, 3), np.uint8), codec=codec)
    with pytest.raises(WireError, match=rf"{codec.upper()} is 64x64 but declares \[32, 32, 3\]") as e:
        EncodedImage(codec, img.data, (32, 32, 3)).decode()
    assert e.value.code == "BAD_IMAGE"
