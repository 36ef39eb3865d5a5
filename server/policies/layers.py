"""Small torch building blocks shared by the shipped policies: MLPs, a conv stem, a time embedding.

Invariant: every block is per-sample (no batch norm, no cross-sample ops), so a sample's output
never depends on what else is in the batch; this is what makes micro-batching sessions safe.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from server.policies.base import STATE_KEY, PolicyConfig, image_key


def mlp(in_dim: int, hidden_dim: int, out_dim: int, num_layers: int) -> nn.Sequential:
    """`num_layers` Linear layers with SiLU between them (num_layers >= 1)."""
    dims = [in_dim] + [hidden_dim] * (num_layers - 1) + [out_dim]
    layers: list[nn.Module] = []
    for i in range(num_layers):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i < num_layers - 1:
            layers.append(nn.SiLU())
    return nn.Sequential(*layers)


class ConvStem(nn.Module):
    """(B, 3, H, W) in [0, 1] -> (B, out_dim): two strided convs and a global average pool."""

    def __init__(self, out_dim: int, channels: int = 3):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(channels, 16, kernel_size=5, stride=2, padding=2),
            nn.SiLU(),
            nn.Conv2d(16, 32, kernel_size=3, stride=2, padding=1),
            nn.SiLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(32, out_dim),
        )

    def forward(self, image: Tensor) -> Tensor:
        return self.net(image)


class ObservationEncoder(nn.Module):
    """State (+ one conv stem per declared camera) -> (B, out_dim) observation embedding.

    `state_in_dim` may differ from `config.state_dim` (a policy that stacks a history passes the
    stacked width and hands the stacked state in `forward`).
    """

    def __init__(self, config: PolicyConfig, out_dim: int, hidden_dim: int, state_in_dim: int | None = None):
        super().__init__()
        self.image_names = sorted(config.image_features)
        self.state_proj = nn.Linear(state_in_dim or config.state_dim, hidden_dim)
        self.stems = nn.ModuleDict({name: ConvStem(hidden_dim) for name in self.image_names})
        self.head = mlp(hidden_dim * (1 + len(self.image_names)), hidden_dim, out_dim, num_layers=2)

    def forward(self, batch: dict[str, Tensor], state: Tensor | None = None) -> Tensor:
        parts = [self.state_proj(batch[STATE_KEY] if state is None else state)]
        parts += [self.stems[name](batch[image_key(name)]) for name in self.image_names]
        return self.head(torch.nn.functional.silu(torch.cat(parts, dim=-1)))


_FREQS: dict[tuple[int, str], Tensor] = {}


def _time_freqs(half: int, device: torch.device) -> Tensor:
    """The embedding's frequencies, computed once per (size, device): every Euler step of every request
    asked for the same arange/exp again (a third of the embedding's time: 15 -> 11 us a call). Inside torch.compile
    they are computed in the graph and never cached: a tensor made there is the graph's output, and under CUDA graphs
    the next replay overwrites it (a replica that compiled first and cached then failed its second bucket's compile:
    "accessing tensor output of CUDAGraphs that has been overwritten", seen on an H100:
    docs/results/2026-11-27-accelerator-lease-3-h100.md)."""
    key = (half, str(device))
    freqs = _FREQS.get(key)
    if freqs is None:
        with torch.inference_mode(False), torch.no_grad():  # a normal tensor, usable under autograd too
            freqs = torch.exp(
                torch.arange(half, device=device, dtype=torch.float32) * (-math.log(1000.0) / max(half - 1, 1))
            )
        if not torch.compiler.is_compiling():
            _FREQS[key] = freqs
    return freqs


def time_embedding(t: Tensor, dim: int) -> Tensor:
    """Sinusoidal features of the flow time t in [0, 1]: (B,) -> (B, dim)."""
    freqs = _time_freqs(dim // 2, t.device)
    angles = t.float()[:, None] * 1000.0 * freqs[None, :]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1).to(t.dtype)
