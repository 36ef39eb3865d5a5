"""`noop`: passes every chunk through untouched (Toxiproxy registers it too; also the failed toxicity draw)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from chaos.toxiproxy.toxics.toxic import Toxic


@dataclass
class NoopToxic(Toxic):
    type_name: ClassVar[str] = "noop"
