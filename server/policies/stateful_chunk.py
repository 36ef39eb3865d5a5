"""`stateful_chunk`: a chunk policy whose output depends on instance state, like LeRobot's Diffusion.

    select_action(obs) --push--> _obs_queue (last n_obs_steps observations) --read--> predict_action_chunk

`predict_action_chunk` reads the observation history that only `select_action` fills; with an
empty history it falls back to the current observation repeated. Two sessions sharing one instance
would therefore see each other's history: `chunk_stateless = False`, so the server forces exclusive
mode (one session) and calls `reset()` on episode reset, which clears both queues.
It exists to exercise that path; it has no RTC guidance.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch
from torch import Tensor

from server.policies.base import (
    STATE_KEY,
    ChunkPolicy,
    PolicyConfig,
    PolicyInputError,
    register_policy,
)
from server.policies.layers import ObservationEncoder, mlp

DEFAULTS = {"hidden_dim": 256, "num_layers": 3, "obs_embed_dim": 128, "n_obs_steps": 2, "n_action_steps": None}


@register_policy("stateful_chunk")
class StatefulChunkPolicy(ChunkPolicy):
    supports_rtc = False
    chunk_stateless = False

    hyper_param_defaults = DEFAULTS

    def __init__(self, config: PolicyConfig):
        super().__init__(config)
        hp = self.hp
        self.n_obs_steps = int(hp["n_obs_steps"])
        self.n_action_steps = int(hp["n_action_steps"] or config.chunk_size)
        self.encoder = ObservationEncoder(
            config, hp["obs_embed_dim"], hp["hidden_dim"], state_in_dim=config.state_dim * self.n_obs_steps
        )
        self.head = mlp(hp["obs_embed_dim"], hp["hidden_dim"], config.chunk_size * config.action_dim, hp["num_layers"])
        self._obs_queue: deque[dict[str, Tensor]] = deque(maxlen=self.n_obs_steps)
        self._action_queue: deque[Tensor] = deque()

    def reset(self) -> None:
        self._obs_queue.clear()
        self._action_queue.clear()

    def _forward(self, batch: dict[str, Tensor], history: list[Tensor]) -> Tensor:
        history = [history[0]] * (self.n_obs_steps - len(history)) + history
        out = self.head(torch.nn.functional.silu(self.encoder(batch, state=torch.cat(history, dim=-1))))
        return out.reshape(out.shape[0], self.config.chunk_size, self.config.action_dim)

    def predict_action_chunk(
        self,
        batch: dict[str, Tensor],
        inference_delay: Sequence[int],
        prefix: Sequence[Tensor | None],
    ) -> Tensor:
        size, _, _ = self.check_chunk_args(batch, inference_delay, prefix)
        inputs = self.model_inputs(batch)
        if self._obs_queue:
            if self._obs_queue[-1][STATE_KEY].shape[0] != size:
                raise PolicyInputError(
                    f"stateful_chunk holds a history of batch size {self._obs_queue[-1][STATE_KEY].shape[0]} "
                    f"but got B={size}; it serves one session at a time (exclusive mode) - call reset()"
                )
            latest = self._obs_queue[-1]
            history = [obs[STATE_KEY] for obs in self._obs_queue]
        else:
            latest, history = inputs, [inputs[STATE_KEY]]
        with torch.no_grad():
            return self._forward(latest, history).float()

    def select_action(self, batch: dict[str, Tensor]) -> Tensor:
        """(B, A): push the observation into the history; refill the action queue when empty."""
        inputs = self.model_inputs(batch)
        self._obs_queue.append({k: v.detach().clone() for k, v in inputs.items()})
        if not self._action_queue:
            size = inputs[STATE_KEY].shape[0]
            chunk = self.predict_action_chunk(batch, [0] * size, [None] * size)
            self._action_queue.extend(chunk[:, : self.n_action_steps].transpose(0, 1))
        return self._action_queue.popleft()

    def training_loss(
        self, batch: dict[str, Tensor], action_chunk: Tensor, generator: torch.Generator | None = None
    ) -> Tensor:
        """MSE with the history filled by the current state (the empty-history fallback)."""
        return torch.nn.functional.mse_loss(self._forward(batch, [batch[STATE_KEY]]), action_chunk)
