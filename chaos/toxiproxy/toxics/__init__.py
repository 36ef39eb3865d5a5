"""The toxic registry: the JSON API's `type` word -> the toxic class, one module per toxic.

Adding a fault = one module here (plus its test in tests/chaos/toxics/) and one line in `REGISTRY`.
"""

from __future__ import annotations

from chaos.toxiproxy.toxics.bandwidth import BandwidthToxic
from chaos.toxiproxy.toxics.latency import LatencyToxic
from chaos.toxiproxy.toxics.limit_data import LimitDataToxic
from chaos.toxiproxy.toxics.loss import LossToxic, loss_fallback
from chaos.toxiproxy.toxics.noop import NoopToxic
from chaos.toxiproxy.toxics.reset_peer import ResetPeerToxic
from chaos.toxiproxy.toxics.slicer import SlicerToxic
from chaos.toxiproxy.toxics.slow_close import SlowCloseToxic
from chaos.toxiproxy.toxics.timeout import TimeoutToxic
from chaos.toxiproxy.toxics.toxic import BadAttribute, Chunk, ChunkQueue, Meter, Toxic, ToxicStub

REGISTRY: dict[str, type[Toxic]] = {
    "noop": NoopToxic,
    "latency": LatencyToxic,
    "bandwidth": BandwidthToxic,
    "slow_close": SlowCloseToxic,
    "timeout": TimeoutToxic,
    "reset_peer": ResetPeerToxic,
    "slicer": SlicerToxic,
    "limit_data": LimitDataToxic,
    "loss": LossToxic,  # ours: not in Toxiproxy; see loss.loss_fallback for the real server
}

# Types the real Toxiproxy (v2.12) knows; anything else needs a fallback there.
TOXIPROXY_TYPES = frozenset(
    {"noop", "latency", "bandwidth", "slow_close", "timeout", "reset_peer", "slicer", "limit_data"}
)


def new_toxic(type_name: str) -> Toxic | None:
    cls = REGISTRY.get(type_name)
    return cls() if cls is not None else None


__all__ = [
    "REGISTRY",
    "TOXIPROXY_TYPES",
    "new_toxic",
    "loss_fallback",
    "Toxic",
    "ToxicStub",
    "Chunk",
    "ChunkQueue",
    "Meter",
    "BadAttribute",
]
