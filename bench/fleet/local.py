"""The in-run baseline: a `kind: local` group's engine, the checkpoint run inside the shard with no network.

    robot tick ── obs ──► edge `rtc` engine (its own inference thread, the same ActionQueue, gating and trim
                          as the remote engine) ──► server.runtime.LocalPredictor (the server's pipeline and
                          policy, in this process) ──► merge

A remote group and its local twin share robots, seeds (`seeds_of`), checkpoint, engine settings and the
host's load in one run, so the difference in their task success is what the network, the router and the
server process cost. The shard imports torch only when it hosts such a group (edge never does).

Invariant: one predictor per robot (a session's pipeline and the policy's noise state are per robot,
as on the server); the predictor gives each inference thread one torch thread, as a replica's
(LocalPredictor's torch_threads): the server's numbers, and no OpenMP teams spinning against the control loop.
"""

from __future__ import annotations


def make_local_engine(engine_cfg: dict, checkpoint: str):
    """The `rtc` engine a local group's robot runs: `engine_cfg` is the RemoteEngineConfig dict the remote
    twin would run (bench.scenario.load.engine_config); its queue, gating, guidance and trim carry over."""
    from bench.scenario.load import local_engine_config
    from edge import RemoteEngineConfig
    from edge.rtc import RTCEngine
    from server.runtime import LocalPredictor

    remote = RemoteEngineConfig.from_dict(dict(engine_cfg))
    predictor = LocalPredictor.from_checkpoint(str(checkpoint), rtc=remote.rtc_enabled)
    return RTCEngine(local_engine_config(remote), policy=predictor)
