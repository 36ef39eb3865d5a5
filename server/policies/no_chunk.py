"""`no_chunk`: a select_action-only policy (SAC/SARM-like), registered to prove the start-up refusal.

Invariant: it never gets past `make_policy` / `load_checkpoint` (`PolicyLoadError`); `classify`
calls it "no_chunk_api". It deliberately does not subclass `ChunkPolicy`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from server.policies.base import STATE_KEY, PolicyConfig, register_policy


@register_policy("no_chunk")
class NoChunkPolicy(nn.Module):
    supports_rtc = False
    chunk_stateless = True  # irrelevant: without a chunk API the policy is refused regardless

    def __init__(self, config: PolicyConfig):
        super().__init__()
        self.config = config
        self.net = nn.Linear(config.state_dim, config.action_dim)

    def select_action(self, batch: dict[str, Tensor]) -> Tensor:
        with torch.no_grad():
            return self.net(batch[STATE_KEY])

    def reset(self) -> None:
        pass
