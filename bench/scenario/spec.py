"""The typed scenario the runner consumes: the checked `*Spec` dataclasses, `Scenario` and `ScenarioError`.

A `*Spec` is a section after the cross checks (bench.scenario.load), with its defaults resolved and its
file line kept; the same section as the file says it (pydantic) is bench.scenario.model's class without
the suffix. `Where` turns a key path of one scenario tree into a `ScenarioError` at that key's line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from wire import configerrors, yamlines


class ScenarioError(ValueError):
    """A scenario problem; `str()` is ``file:line: key.path: message``."""

    def __init__(self, source: str, line: int, path: str, message: str):
        self.source, self.line, self.path, self.message = source, line, path, message
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {path}: {message}" if path else f"{where}: {message}")


# --- typed result (what the runner consumes) ---------------------------------------------------
# A `*Spec` is a section after the cross-checks, with its defaults resolved and its file line kept;
# the same section as the file says it (pydantic) is bench.scenario.model's class without the suffix.


@dataclass
class CameraSpec:
    """The cameras of a group's robots, checked (model.Cameras is the file's section)."""

    kind: str = "synthetic"
    names: list[str] = field(default_factory=lambda: ["front"])
    height: int = 64
    width: int = 64


@dataclass
class GroupSpec:
    """A group as the runner builds it: policy, model id and episode length resolved (model.Group is the file's)."""

    name: str
    robot: str
    count: int
    fps: float
    site: str
    cameras: CameraSpec | None
    policy: str
    model_id: str
    task: str
    episode_s: float
    engine: dict
    shadow: dict | None = None
    line: int = 0
    stagger_episodes: bool = False
    engine_kind: str = "remote"  # model.ENGINE_KINDS: `local` runs the checkpoint in the shard (bench.fleet.local)
    seeds_of: str | None = None  # seed robot i as robot i of this group (a paired baseline)
    gym: dict | None = None  # a gym group's `gym:` config (bench.robots.gymenv); `robot` is then its type's name


@dataclass
class SiteSpec:
    """A site: its profile and toxic overrides, checked against chaos.profiles (model.Site is the file's)."""

    name: str
    profile: str
    overrides: dict
    line: int = 0


@dataclass
class ReplicaSpec:
    """One policy-server process to start: model id resolved from its checkpoint (model.Replica is the file's)."""

    id: str
    checkpoint: str
    model_id: str
    max_sessions: int
    emulated_latency: Any
    manifest: dict
    start_at: float | None = None  # a scale-up: started by a `start` fault at this time
    line: int = 0


@dataclass
class AssertionSpec:
    expression: str
    line: int = 0


@dataclass
class Scenario:
    name: str
    description: str
    duration_s: float
    warmup_s: float
    seed: int
    shards: int | str  # "auto": bench.run.sizing picks the count on the host that runs it
    groups: list[GroupSpec]
    sites: dict[str, SiteSpec]
    replicas: list[ReplicaSpec]
    server_manifest: dict
    faults: list[dict]
    assertions: list[AssertionSpec]
    sweep: dict | None
    security: str = "tcp"
    engine_workers: str = "pool"  # how a shard hosts its engines' workers (model.Fleet.engine_workers)
    attackers: list = field(default_factory=list)
    fidelity: dict = field(default_factory=dict)  # tolerances (model.Fidelity); empty = the defaults
    cluster: dict = field(default_factory=dict)  # placement under --cluster ray (model.Cluster)
    record: dict = field(default_factory=dict)  # what the run records beside its records (model.Record)
    source: str = "<string>"
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def robots(self) -> int:
        return sum(g.count for g in self.groups)

    def group(self, name: str) -> GroupSpec:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(name)


class Where:
    """Errors against one scenario tree: `fail(path, message)` finds the line of the deepest key of `path`."""

    def __init__(self, source: str, data: Any):
        self.source, self.data = source, data

    def line(self, *path) -> int:
        return yamlines.line_at(self.data, path, 0) or 0

    def fail(self, path: tuple, message: str, shown: str | None = None) -> ScenarioError:
        return ScenarioError(self.source, self.line(*path), shown or configerrors.dotted(path), message)
