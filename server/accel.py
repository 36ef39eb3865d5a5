"""The accelerator side of the batched inference path: JPEG decode on the GPU and pinned host copies.

    [InferItem.images {name: EncodedImage(jpeg)}, ...]  ──decode_jpegs──►  {(item, name): (H, W, 3) uint8 on cuda}
         one nvjpeg batch call (torchvision.io.decode_jpeg(list, device="cuda")) for the whole micro-batch
    stacked CPU tensors  ──to_device──►  pinned staging, non-blocking copy to the GPU

Owns `GpuJpegDecoder` and `to_device`. ModelRuntime uses them when the model's device is CUDA.

Invariants: nothing here is needed on a CPU host. `GpuJpegDecoder.for_device` returns None where the
device is not CUDA or torchvision (an optional package) cannot decode JPEGs on the GPU, and the
runtime then decodes on the CPU as before. A JPEG that nvjpeg refuses falls back to the CPU decoder
for that image alone, so a bad frame fails only its own sample (the CPU decoder raises the error the
client gets). Frames come back as (H, W, 3) uint8, the layout `images_to_model` takes from the CPU
decoder, so preprocessing after decode is the same code on either path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger(__name__)


def _torchvision_decode_jpeg() -> Callable[..., Any] | None:
    try:
        from torchvision.io import decode_jpeg
    except Exception:  # not installed, or built without image support
        return None
    return decode_jpeg


class GpuJpegDecoder:
    """Batched JPEG decode on one CUDA device (nvjpeg through torchvision)."""

    def __init__(self, device: torch.device, decode_jpeg: Callable[..., Any]):
        self.device = device
        self._decode = decode_jpeg
        self.batches = 0
        self.fallbacks = 0

    @classmethod
    def for_device(cls, device: torch.device | str) -> GpuJpegDecoder | None:
        device = torch.device(device)
        if device.type != "cuda" or not torch.cuda.is_available():
            return None
        decode = _torchvision_decode_jpeg()
        if decode is None:
            log.info(
                "torchvision is not installed: JPEG frames are decoded on the CPU (pip install torchvision "
                "for nvjpeg decode on %s)",
                device,
            )
            return None
        return cls(device, decode)

    def decode(self, jpegs: Sequence[bytes]) -> list[Tensor | None]:
        """(H, W, 3) uint8 frames on the device, one per JPEG; None where nvjpeg could not decode it."""
        if not jpegs:
            return []
        data = [torch.frombuffer(bytearray(j), dtype=torch.uint8) for j in jpegs]
        try:
            frames = self._decode(data, device=self.device)
            self.batches += 1
            return [f.permute(1, 2, 0) for f in frames]  # (3, H, W) -> the CPU decoder's (H, W, 3)
        except Exception:  # one bad stream fails the batch call: retry one by one to isolate it
            out: list[Tensor | None] = []
            for one in data:
                try:
                    out.append(self._decode(one, device=self.device).permute(1, 2, 0))
                except Exception:
                    self.fallbacks += 1
                    out.append(None)
            return out


def decode_item_jpegs(decoder: GpuJpegDecoder, images: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every item's images with its JPEG frames replaced by GPU frames (one decode call for the batch).

    Anything that is not a JPEG `EncodedImage` (raw, PNG, numpy) and any frame nvjpeg refused is left
    as it was, for the CPU path.
    """
    where: list[tuple[int, str]] = []
    jpegs: list[bytes] = []
    for i, frames in enumerate(images):
        for name, frame in frames.items():
            if getattr(frame, "codec", None) == "jpeg":
                where.append((i, name))
                jpegs.append(frame.data)
    out = [dict(frames) for frames in images]
    for (i, name), frame in zip(where, decoder.decode(jpegs)):
        if frame is not None:
            out[i][name] = frame
    return out


def to_device(tensor: Tensor, device: torch.device, dtype: torch.dtype) -> Tensor:
    """`tensor` on `device`/`dtype`; a CPU tensor bound for CUDA goes through pinned memory, non-blocking.

    Pinned buffers come from torch's caching host allocator, so steady-state batches reuse them.
    """
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.to(dtype=dtype).pin_memory().to(device, non_blocking=True)
    return tensor.to(device=device, dtype=dtype)
