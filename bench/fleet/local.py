"""The in-run baseline: a `kind: local` group's engine, the checkpoint run inside the shard with no network.

    robot tick ── obs ──► edge `rtc` engine (its own inference thread, the same ActionQueue, gating and trim
                          as the remote engine) ──► server.runtime.LocalPredictor (the server's pipeline and
                          policy, in this process) ──► merge

A remote group and its local twin share robots, seeds (`seeds_of`), checkpoint, engine settings and the
host's load in one run, so the difference in their task success is what the network, the router and the
server process cost. The shard imports torch only when it hosts such a group (edge never does).

Invariant: one predictor per robot (a session's pipeline and the policy's noise state are per robot,
as on the server); each inference thread gives itself one torch thread (server.runtime.set_torch_threads)
so the shard's engines do not start OpenMP teams that spin against its control loop.
"""

from __future__ import annotations

import threading


class _OneThreadTorch:
    """A LocalPredictor whose calling thread is set to one intra-op torch thread on its first call."""

    def __init__(self, predictor):
        self.predictor = predictor
        self._configured = threading.local()

    def predict_action_chunk(self, obs, inference_delay, prefix):
        if not getattr(self._configured, "done", False):
            from server.runtime import set_torch_threads

            set_torch_threads(1)
            self._configured.done = True
        return self.predictor.predict_action_chunk(obs, inference_delay, prefix)

    def reset(self) -> None:
        self.predictor.reset()


def make_local_engine(engine_cfg: dict, checkpoint: str):
    """The `rtc` engine a local group's robot runs: `engine_cfg` is the RemoteEngineConfig dict the remote
    twin would run (bench.scenario.schema.engine_config); its queue, gating, guidance and trim carry over."""
    from edge import RemoteEngineConfig
    from edge.rtc import RTCEngine

    from bench.scenario.schema import local_engine_config
    from server.runtime import LocalPredictor

    remote = RemoteEngineConfig.from_dict(dict(engine_cfg))
    predictor = LocalPredictor.from_checkpoint(str(checkpoint), rtc=remote.rtc_enabled)
    return RTCEngine(local_engine_config(remote), policy=_OneThreadTorch(predictor))
