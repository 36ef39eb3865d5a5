"""The transformer's building blocks for flow_transformer: a pre-LN block (self-attention, adaLN-conditioned
cross-attention to a memory, MLP) and the image tokenizers (a conv grid, ViT patches).

Invariant: every block is per-sample (LayerNorm, attention within a sample), as server.policies.layers'."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from server.policies.layers import mlp


class Block(nn.Module):
    """Pre-LN transformer block: self-attention, optional cross-attention to a memory, MLP.

    An action block (`cross`) is conditioned by adaLN: each of its three norms is shifted and scaled
    by a projection of (flow time + pooled observation) (zero-initialised: a plain block at first).
    The velocity changes sharply with t, and a time feature added at the input alone fades. The
    condition is (B, d), one per sample, or (B, T, d), one per token (training-time RTC's per-row time).

    The attention is nn.MultiheadAttention's (its weights, so checkpoints load as before) written out with
    scaled_dot_product_attention, so an action block takes its cross-attention keys and values already
    projected (`memory_kv`): the memory is the same at every Euler step, its projection is done once per call.
    """

    def __init__(self, d: int, heads: int, mlp_ratio: int, cross: bool):
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.cross = cross
        if cross:
            self.norm2 = nn.LayerNorm(d)
            self.cross_attn = nn.MultiheadAttention(d, heads, batch_first=True)
            self.modulation = nn.Linear(d, 6 * d)
            nn.init.zeros_(self.modulation.weight)
            nn.init.zeros_(self.modulation.bias)
        self.norm3 = nn.LayerNorm(d)
        self.mlp = mlp(d, d * mlp_ratio, d, num_layers=2)

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """The cross-attention's keys and values of `memory` (B, N, d), split into heads: 2 x (B, heads, N, d/heads),
        each contiguous (not views of one projection: a CUDA graph copies an input into a buffer of its strides)."""
        d = memory.shape[-1]
        k, v = F.linear(memory, self.cross_attn.in_proj_weight[d:], self.cross_attn.in_proj_bias[d:]).chunk(2, dim=-1)
        heads = self.cross_attn.num_heads
        return _split_heads(k, heads).contiguous(), _split_heads(v, heads).contiguous()

    def forward(self, x: Tensor, memory_kv: tuple[Tensor, Tensor] | None = None, time: Tensor | None = None) -> Tensor:
        if not self.cross:
            x = x + self._self_attention(self.norm1(x))
            return x + self.mlp(self.norm3(x))
        modulation = self.modulation(time)
        if modulation.dim() == 2:  # one condition per sample: broadcast over its tokens
            modulation = modulation[:, None, :]
        shift1, scale1, shift2, scale2, shift3, scale3 = modulation.chunk(6, dim=-1)
        x = x + self._self_attention(self.norm1(x) * (1 + scale1) + shift1)
        x = x + self._cross_attention(self.norm2(x) * (1 + scale2) + shift2, *memory_kv)
        return x + self.mlp(self.norm3(x) * (1 + scale3) + shift3)

    def _self_attention(self, h: Tensor) -> Tensor:
        attn = self.attn
        q, k, v = (
            _split_heads(part, attn.num_heads)
            for part in F.linear(h, attn.in_proj_weight, attn.in_proj_bias).chunk(3, dim=-1)
        )
        return attn.out_proj(_merge_heads(F.scaled_dot_product_attention(q, k, v)))

    def _cross_attention(self, h: Tensor, k: Tensor, v: Tensor) -> Tensor:
        attn, d = self.cross_attn, h.shape[-1]
        q = _split_heads(F.linear(h, attn.in_proj_weight[:d], attn.in_proj_bias[:d]), attn.num_heads)
        return attn.out_proj(_merge_heads(F.scaled_dot_product_attention(q, k, v)))


def _split_heads(x: Tensor, heads: int) -> Tensor:
    """(B, L, d) -> (B, heads, L, d / heads)"""
    return x.unflatten(-1, (heads, -1)).transpose(1, 2)


def _merge_heads(x: Tensor) -> Tensor:
    """(B, heads, L, d / heads) -> (B, L, d)"""
    return x.transpose(1, 2).flatten(2)


class ConvTokens(nn.Module):
    """(B, 3, H, W) -> (B, grid^2, d): two strided convs, average-pooled to a grid."""

    def __init__(self, d: int, grid: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, kernel_size=5, stride=2, padding=2),
            nn.SiLU(),
            nn.Conv2d(16, 32, kernel_size=3, stride=2, padding=1),
            nn.SiLU(),
            nn.AdaptiveAvgPool2d(grid),
        )
        self.proj = nn.Linear(32, d)

    def forward(self, image: Tensor) -> Tensor:
        return self.proj(self.net(image).flatten(2).transpose(1, 2))


class PatchTokens(nn.Module):
    """(B, 3, H, W) -> (B, (H/p)(W/p), d): ViT patch embedding plus learned positions."""

    def __init__(self, d: int, patch: int, height: int, width: int):
        super().__init__()
        self.proj = nn.Conv2d(3, d, kernel_size=patch, stride=patch)
        self.pos = nn.Parameter(torch.zeros(1, (height // patch) * (width // patch), d))
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, image: Tensor) -> Tensor:
        return self.proj(image).flatten(2).transpose(1, 2) + self.pos
