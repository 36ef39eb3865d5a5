"""`mlp_chunk`: a deterministic MLP from the observation (state, plus a conv stem per declared camera)
to a whole action chunk in one forward pass.

Invariant: the output is a pure function of the observation. It has no RTC guidance
(`supports_rtc = False`): delays and prefixes are validated and ignored, and the server downgrades
RTC sessions on it to append mode.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from server.policies.base import ChunkPolicy, PolicyConfig, register_policy
from server.policies.layers import ObservationEncoder, mlp

DEFAULTS = {"hidden_dim": 256, "num_layers": 3, "obs_embed_dim": 128}


@register_policy("mlp_chunk")
class MlpChunkPolicy(ChunkPolicy):
    supports_rtc = False
    chunk_stateless = True

    hyper_param_defaults = DEFAULTS

    def __init__(self, config: PolicyConfig):
        super().__init__(config)
        hp = self.hp
        self.encoder = ObservationEncoder(config, hp["obs_embed_dim"], hp["hidden_dim"])
        self.head = mlp(hp["obs_embed_dim"], hp["hidden_dim"], config.chunk_size * config.action_dim, hp["num_layers"])

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        out = self.head(torch.nn.functional.silu(self.encoder(batch)))
        return out.reshape(out.shape[0], self.config.chunk_size, self.config.action_dim)

    def predict_action_chunk(
        self,
        batch: dict[str, Tensor],
        inference_delay: Sequence[int],
        prefix: Sequence[Tensor | None],
    ) -> Tensor:
        self.check_chunk_args(batch, inference_delay, prefix)
        with torch.no_grad():
            return self(self.model_inputs(batch)).float()

    def training_loss(
        self, batch: dict[str, Tensor], action_chunk: Tensor, generator: torch.Generator | None = None
    ) -> Tensor:
        return torch.nn.functional.mse_loss(self(batch), action_chunk)
