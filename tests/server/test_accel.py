"""server.accel: the GPU JPEG path batches a micro-batch's frames into one decode call, isolates a bad
frame, and hands preprocessing the same (H, W, 3) uint8 layout as the CPU decoder; off CUDA it is off."""

from __future__ import annotations

import numpy as np
import pytest
import simplejpeg
import torch

from server.accel import GpuJpegDecoder, decode_item_jpegs, to_device
from server.processors import images_to_model
from wire.images import encode_image


def frame(seed: int, h: int = 24, w: int = 32) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


class CpuStandIn:
    """torchvision.io.decode_jpeg's contract (a tensor or a list of uint8 tensors -> (3, H, W) frames) on the CPU."""

    def __init__(self):
        self.calls = 0

    def __call__(self, data, device):
        self.calls += 1
        one = not isinstance(data, list)
        frames = [
            torch.from_numpy(simplejpeg.decode_jpeg(t.numpy().tobytes())).permute(2, 0, 1)
            for t in ([data] if one else data)
        ]
        return frames[0] if one else frames


def test_no_gpu_decoder_off_cuda():
    assert GpuJpegDecoder.for_device("cpu") is None
    if not torch.cuda.is_available():
        assert GpuJpegDecoder.for_device("cuda") is None


def test_a_micro_batch_is_one_decode_call_and_other_codecs_stay_for_the_cpu():
    stand_in = CpuStandIn()
    decoder = GpuJpegDecoder(torch.device("cpu"), stand_in)
    raw = encode_image(frame(9), "raw")
    items = [
        {"front": encode_image(frame(i), "jpeg", 95), "wrist": encode_image(frame(10 + i), "jpeg", 95)}
        for i in range(3)
    ]
    items.append({"front": raw})
    out = decode_item_jpegs(decoder, items)
    assert stand_in.calls == 1 and decoder.batches == 1
    assert out[3]["front"] is raw
    for i in range(3):
        for name in ("front", "wrist"):
            got = out[i][name]
            assert got.dtype == torch.uint8 and tuple(got.shape) == (24, 32, 3)
            np.testing.assert_array_equal(got.numpy(), items[i][name].decode())


def test_a_bad_jpeg_is_left_to_the_cpu_decoder_and_the_others_still_decode():
    decoder = GpuJpegDecoder(torch.device("cpu"), CpuStandIn())
    good = encode_image(frame(1), "jpeg")
    bad = type(good)("jpeg", b"\xff\xd8 not a jpeg", good.shape)
    out = decode_item_jpegs(decoder, [{"front": good}, {"front": bad}])
    assert isinstance(out[0]["front"], torch.Tensor)
    assert out[1]["front"] is bad and decoder.fallbacks == 1


@pytest.mark.parametrize("size", [(24, 32), (12, 16)])
def test_tensor_frames_preprocess_exactly_as_numpy_frames(size):
    f = frame(3)
    shape = [3, *size]
    np_path = images_to_model(f, shape)
    torch_path = images_to_model(torch.from_numpy(f), shape)
    torch.testing.assert_close(torch_path, np_path, rtol=0, atol=0)


def test_to_device_on_cpu_is_a_plain_cast():
    t = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    out = to_device(t, torch.device("cpu"), torch.float32)
    assert out.dtype == torch.float32 and torch.equal(out, t.float())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: pinned non-blocking copies and nvjpeg")
def test_cuda_pinned_copy_and_nvjpeg_decode():
    t = torch.randn(4, 5)
    torch.testing.assert_close(to_device(t, torch.device("cuda"), torch.float32).cpu(), t)
    decoder = GpuJpegDecoder.for_device("cuda")
    if decoder is None:
        pytest.skip("torchvision with nvjpeg is not installed")
    out = decoder.decode([encode_image(frame(2), "jpeg", 95).data])
    assert out[0].is_cuda and tuple(out[0].shape) == (24, 32, 3)
