"""Scenario files: validation and the typed `Scenario` the runner consumes.

    FILE ──► wire.yamlines ──► bench.scenario.model (pydantic) ──► cross checks ──► Scenario
             (every key keeps    keys, types, bounds, choices      sites, models served, engines built
              its line)          of each section                   by edge, profiles, checkpoints, faults,
                                                                   assertions, sweep, attackers

Owns the checks that need several keys or other packages; `bench.scenario.model` owns each key's
shape and meaning. Invariant: `load_scenario` either returns a fully checked `Scenario` or raises
`ScenarioError` whose message starts ``file:line: key.path:``; `bench validate` and `bench run`
call the same function, so a file validate passes is one run accepts (engine configs are built by
the engines' own constructors, site overrides by chaos.profiles, checkpoints looked up on disk).
Unknown keys are always rejected, with the known keys listed and the closest one suggested.
"""

from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from bench.scenario import model as sm
from bench.scenario.model import (  # noqa: F401 - re-exported  # noqa: F401 - re-exported
    CAMERA_KINDS,
    PROFILES_FALLBACK,
    ROBOT_TYPES_FALLBACK,
    camera_kinds,
    profile_names,
    robot_types,
)
from wire import configerrors, yamlines
from wire.suggest import did_you_mean

REPO_ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTS_DIR = REPO_ROOT / "bench" / "checkpoints"
SCENARIOS_DIR = REPO_ROOT / "scenarios"
FAULT_TARGET_RE = re.compile(r"^(robot|site|server):[^\s]+$|^router(:hub)?$")
PLACEHOLDER_ENDPOINT = "tcp/127.0.0.1:7447"  # the engine check's router; the run's comes from the router it starts


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
    attackers: list = field(default_factory=list)
    fidelity: dict = field(default_factory=dict)  # tolerances (model.Fidelity); empty = the defaults
    cluster: dict = field(default_factory=dict)  # placement under --cluster ray (model.Cluster)
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


def engine_field_names() -> set[str] | None:
    """Fields of edge.RemoteEngineConfig, or None when the edge package is not importable."""
    try:
        import dataclasses

        from edge import RemoteEngineConfig

        return {f.name for f in dataclasses.fields(RemoteEngineConfig)}
    except Exception:
        return None


def checkpoint_dir(name_or_path: str) -> Path:
    """A checkpoint name (bench/checkpoints/<name>) or a path, as a directory path."""
    p = Path(name_or_path)
    if p.is_absolute() or "/" in name_or_path:
        return p if p.is_absolute() else (REPO_ROOT / p)
    return CHECKPOINTS_DIR / name_or_path


def checkpoint_model_id(name_or_path: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(name_or_path).name).strip("-.") or "policy"


def engine_config(group: GroupSpec, endpoint: str) -> dict:
    """The RemoteEngineConfig fields a robot of `group` runs with (bench.fleet.shard builds its robots
    from this; the scenario check builds the same one, so both refuse the same values)."""
    from bench.robots.core import robot_type

    cls = robot_type(group.robot)
    engine = dict(group.engine)
    engine.setdefault("fallback", cls.safe_fallback)  # what keeps this robot type safe when stalled
    engine.update(
        connect_endpoints=[endpoint],
        model_id=group.model_id,
        fps=group.fps,
        action_names=list(cls.action_names),
        state_dim=len(cls.state_names),
        task=group.task,
    )
    if group.cameras is not None:
        engine["cameras"] = list(group.cameras.names)
    return engine


def shadow_engine_config(remote_cfg):
    """The local RTC engine's config beside a remote engine's (bench.fleet.parity runs it)."""
    from edge.rtc import RTCEngineConfig

    return RTCEngineConfig(
        fps=remote_cfg.fps,
        execution_horizon=remote_cfg.execution_horizon,
        rtc_enabled=remote_cfg.rtc_enabled,
        trim=remote_cfg.trim,
        latency_mode=remote_cfg.latency_mode,
        latency_window=remote_cfg.latency_window,
    )


def local_engine_config(remote_cfg):
    """The `rtc` engine a `kind: local` group runs (bench.fleet.local): the remote config's queue, gating,
    guidance and trim, so the two groups differ by the network and the server process only."""
    from edge.rtc import RTCEngineConfig

    return RTCEngineConfig(
        fps=remote_cfg.fps,
        execution_horizon=remote_cfg.execution_horizon,
        rtc_enabled=remote_cfg.rtc_enabled,
        trim=remote_cfg.trim,
        buffer_time_s=remote_cfg.buffer_time_s,
        latency_mode=remote_cfg.latency_mode,
        latency_window=remote_cfg.latency_window,
    )


# --- loading -----------------------------------------------------------------------------------


def load_scenario(path: str | Path, *, check_checkpoints: bool = False) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(str(path), 0, "", f"cannot read the file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(
            str(path),
            0,
            "",
            f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
            f"{exc.start}); a scenario is a YAML file saved as UTF-8",
        ) from None
    return parse_scenario(text, source=str(path), check_checkpoints=check_checkpoints)


def parse_scenario(text: str, source: str = "<string>", *, check_checkpoints: bool = False) -> Scenario:
    try:
        data = yamlines.load(text)
    except yamlines.YamlError as exc:
        raise ScenarioError(source, exc.line, "", f"not valid YAML: {exc.problem}") from None
    if data is None:
        raise ScenarioError(
            source, 1, "", "the file is empty; a scenario needs name, duration_s, fleet, sites, servers"
        )
    scenario = build_scenario(data, source)
    if check_checkpoints:
        check_checkpoints_present(scenario)
    return scenario


class _Where:
    """Errors against one scenario tree: `fail(path, message)` finds the line of the deepest key of `path`."""

    def __init__(self, source: str, data: Any):
        self.source, self.data = source, data

    def line(self, *path) -> int:
        return yamlines.line_at(self.data, path, 0) or 0

    def fail(self, path: tuple, message: str, shown: str | None = None) -> ScenarioError:
        return ScenarioError(self.source, self.line(*path), shown or configerrors.dotted(path), message)


def _unknown_key(model, key: str, path: str) -> str:
    known = list(configerrors.model_fields(model))
    return f"unknown key{did_you_mean(key, known)}; known keys: {', '.join(known)}"


def _unknown_engine_key(model, key: str, path: str) -> str:
    if key in sm.ENGINE_OWNED:
        return "set by the bench from the robot, its site and the group; remove it"
    known = sorted(configerrors.model_fields(model))
    return f"not a RemoteEngineConfig field{did_you_mean(key, known)}; fields: {', '.join(known)}"


def build_scenario(data: Any, source: str = "<string>") -> Scenario:
    w = _Where(source, data)
    if not isinstance(data, dict):
        raise ScenarioError(
            source,
            getattr(data, "line", 0) or 1,
            "(top level)",
            f"expected a mapping of keys, got {'a list' if isinstance(data, list) else repr(data)}",
        )
    try:
        m = sm.ScenarioFile.model_validate(data)
    except ValidationError as exc:
        where, line, message = configerrors.locate(sm.ScenarioFile, exc, data, _unknown_key, 0)
        raise ScenarioError(source, line or 0, configerrors.dotted(where), message) from None
    sites = _read_sites(w, m)
    groups = _read_groups(w, m, sites)
    replicas = [
        ReplicaSpec(
            id=r.id,
            checkpoint=r.checkpoint,
            model_id=r.model_id or checkpoint_model_id(r.checkpoint),
            max_sessions=r.max_sessions,
            emulated_latency=r.emulated_latency,
            manifest=dict(r.manifest),
            line=w.line("servers", "replicas", i),
        )
        for i, r in enumerate(m.servers.replicas)
    ]
    _check_unique(w, [r.id for r in replicas], ("servers", "replicas"), "id", "replica id")
    _check_served(w, groups, replicas)
    _check_rates(w, groups, replicas, dict(m.servers.manifest))
    faults = _read_faults(w, m, sites, replicas, groups)
    assertions = _read_assertions(w, m, groups, replicas)
    sweep = _read_sweep(w, m, data)
    attackers = _read_attackers(w, m, groups)
    return Scenario(
        name=m.name,
        description=m.description.strip(),
        duration_s=float(m.duration_s),
        warmup_s=float(m.warmup_s),
        seed=m.seed,
        shards=m.fleet.shards,
        groups=groups,
        sites=sites,
        replicas=replicas,
        server_manifest=dict(m.servers.manifest),
        faults=faults,
        assertions=assertions,
        sweep=sweep,
        source=source,
        raw=data,
        security=m.security,
        attackers=attackers,
        fidelity=m.fidelity.model_dump(),
        cluster=m.cluster.model_dump(),
    )


def _check_unique(w: _Where, names: list, path: tuple, key: str, what: str) -> None:
    for i, n in enumerate(names):
        if n in names[:i]:
            raise w.fail((*path, i, key), f"{what} {n!r} is used twice; {what}s must be unique")


def _read_sites(w: _Where, m: sm.ScenarioFile) -> dict[str, SiteSpec]:
    sites = {}
    for name, s in m.sites.items():
        for key, value in s.overrides.items():  # chaos.profiles builds the toxics the run's proxy gets
            try:
                from chaos.profiles import profile_toxics
            except Exception:  # the chaos package is another install; without it only the shape is checked
                break
            try:
                profile_toxics(s.profile, {key: value})
            except ValueError as exc:
                raise w.fail(("sites", name, "overrides", key), str(exc)) from None
        sites[name] = SiteSpec(name=name, profile=s.profile, overrides=dict(s.overrides), line=w.line("sites", name))
    return sites


def _read_groups(w: _Where, m: sm.ScenarioFile, sites: dict[str, SiteSpec]) -> list[GroupSpec]:
    groups: list[GroupSpec] = []
    for i, g in enumerate(m.fleet.groups):
        path = ("fleet", "groups", i)
        if any(o.name == g.name for o in groups):
            raise w.fail((*path, "name"), f"group name {g.name!r} is used twice; group names must be unique")
        if g.site not in sites:
            raise w.fail(
                (*path, "site"), f"unknown site {g.site!r}{did_you_mean(g.site, sites)}; sites: {', '.join(sites)}"
            )
        _check_engine_keys(w, path, g.engine)
        cams = (
            None
            if g.cameras is None
            else CameraSpec(
                kind=g.cameras.kind, names=list(g.cameras.names), height=g.cameras.height, width=g.cameras.width
            )
        )
        if cams is not None and cams.kind == "rendered":
            from bench.robots.models import GL_UNAVAILABLE

            if GL_UNAVAILABLE:
                raise w.fail((*path, "cameras", "kind"), f"{GL_UNAVAILABLE}; or use kind: synthetic")
        policy = g.policy or g.robot
        engine = dict(g.engine)
        kind = engine.pop("kind", "remote")
        chunking = engine.pop("chunking", None)
        if chunking is not None:
            if chunking not in sm.CHUNKINGS:  # the engine model says so first where edge is installed
                raise w.fail((*path, "engine", "chunking"), f"{chunking!r} is not one of {', '.join(sm.CHUNKINGS)}")
            engine = {**sm.CHUNKINGS[chunking], **engine}  # a field given beside the word wins (as `--set` does)
        if kind == "local" and g.shadow is not None:
            raise w.fail(
                (*path, "shadow"),
                "a `kind: local` group has no remote engine to compare with; put the `shadow` on a remote group",
            )
        if g.seeds_of is not None:
            if g.seeds_of == g.name or not any(o.name == g.seeds_of for o in m.fleet.groups):
                others = [o.name for o in m.fleet.groups if o.name != g.name]
                raise w.fail(
                    (*path, "seeds_of"),
                    f"seeds_of {g.seeds_of!r} names no other group"
                    f"{did_you_mean(g.seeds_of, others)}; groups: {', '.join(others)}",
                )
        shadow = None
        if g.shadow is not None:
            shadow = {
                "engine": g.shadow.engine,
                "max_delay_steps": g.shadow.max_delay_steps,
                "policy": g.shadow.policy or policy,
            }
        group = GroupSpec(
            name=g.name,
            robot=g.robot,
            count=g.count,
            fps=float(g.fps),
            site=g.site,
            cameras=cams,
            policy=policy,
            model_id=g.model_id or checkpoint_model_id(policy),
            task=g.task,
            episode_s=_episode_s(g.episode_s, g.robot),
            engine=engine,
            shadow=shadow,
            line=w.line(*path),
            stagger_episodes=g.stagger_episodes,
            engine_kind=kind,
            seeds_of=g.seeds_of,
        )
        _check_engine(w, path, group)
        if kind == "remote":
            _check_lease(w, path, group, sites[g.site])
        groups.append(group)
    return groups


LEASE_ROUND_TRIPS = 1.5  # a lease must cover the round trip and the keep-alive period after it (lease / 4)


def _check_lease(w: _Where, path: tuple, group: GroupSpec, site: SiteSpec) -> None:
    """A robot's Zenoh lease against its site's worst round trip: the router starts the lease when it answers the
    session open, and hears the robot's first keep-alive a round trip plus a keep-alive period (lease / 4) later,
    so a lease under ~4/3 of the round trip closes every session as it opens (no robot ever gets one)."""
    try:
        from chaos.profiles import profile_toxics, worst_round_trip_ms
        from edge.remote import RemoteEngineConfig
    except ImportError:
        return
    rtt = worst_round_trip_ms(profile_toxics(site.profile, site.overrides))
    lease = int(group.engine.get("lease_ms", RemoteEngineConfig.lease_ms))
    if lease < LEASE_ROUND_TRIPS * rtt:
        key = "lease_ms" if "lease_ms" in group.engine else None
        raise w.fail(
            (*path, "engine", *((key,) if key else ())),
            f"lease_ms {lease}{'' if key else ' (the default)'} is under {LEASE_ROUND_TRIPS:g} x the worst round "
            f"trip of site {site.name!r} ({site.profile}: {rtt:g} ms): the router would close each robot's "
            f"Zenoh session before its first keep-alive arrives; set engine.lease_ms >= "
            f"{math.ceil(LEASE_ROUND_TRIPS * rtt)}",
        )


def _check_engine_keys(w: _Where, path: tuple, engine: dict) -> None:
    """Each `engine:` key against the fields of edge.RemoteEngineConfig (types and fixed choices)."""
    try:
        model = sm.engine_model()
    except Exception:  # the edge package is another install; without it the engine is not checked
        return
    for key in engine:
        if key in sm.ENGINE_OWNED:
            raise w.fail((*path, "engine", key), _unknown_engine_key(model, key, ""))
    try:
        model.model_validate(engine)
    except ValidationError as exc:
        where, _line, message = configerrors.locate(model, exc, engine, _unknown_engine_key)
        raise w.fail((*path, "engine", *where), message) from None


def _check_engine(w: _Where, path: tuple, group: GroupSpec) -> None:
    """Build the engine configs the run would build: their constructors are the authority on values."""
    try:
        from edge.engine import ConfigError
        from edge.remote import RemoteEngineConfig

        cfg = engine_config(group, PLACEHOLDER_ENDPOINT)
    except ImportError:
        return
    try:
        remote = RemoteEngineConfig.from_dict(cfg)
    except (ConfigError, TypeError, ValueError) as exc:
        raise w.fail(_engine_key_path(path, group, exc), f"the engine refuses it: {_config_words(exc)}") from None
    if group.engine_kind == "local":
        try:
            local_engine_config(remote)
        except (ConfigError, TypeError, ValueError) as exc:
            raise w.fail(
                _engine_key_path(path, group, exc), f"the local engine refuses it: {_config_words(exc)}"
            ) from None
    if group.shadow:
        try:
            shadow_engine_config(remote)
        except (ConfigError, TypeError, ValueError) as exc:
            raise w.fail(
                _engine_key_path(path, group, exc, fallback="shadow"),
                f"the shadow engine ({group.shadow['engine']}, local) refuses it: {_config_words(exc)}; "
                "the remote engine alone accepts it, so drop `shadow` or change the value",
            ) from None


def _config_words(exc: Exception) -> str:
    return re.sub(r"^\w+Config\.\w+: ", "", str(exc))


def _engine_key_path(path: tuple, group: GroupSpec, exc: Exception, fallback: str = "engine") -> tuple:
    m = re.match(r"^\w+Config\.(\w+):", str(exc))
    key = m.group(1) if m else None
    if key and key in group.engine:
        return (*path, "engine", key)
    return (*path, fallback) if key is None else (*path, fallback if fallback == "shadow" else "engine", key)


def _episode_s(value, robot: str) -> float:
    if value is not None:
        return float(value)
    try:
        from bench.robots import robot_type

        return float(robot_type(robot).episode_s)
    except Exception:
        return 10.0


def _check_served(w: _Where, groups: list[GroupSpec], replicas: list[ReplicaSpec]) -> None:
    served = {r.model_id for r in replicas}
    for i, g in enumerate(groups):
        if g.model_id in served or g.engine_kind == "local":  # a local group loads its policy in the shard
            continue
        missing = [(j, r) for j, r in enumerate(replicas) if not _checkpoint_present(r.checkpoint)]
        if missing:  # the likelier cause: a misspelt checkpoint names another model
            j, r = missing[0]
            raise w.fail(("servers", "replicas", j, "checkpoint"), _missing_checkpoint_words(r.checkpoint, groups))
        key = "model_id" if w.line("fleet", "groups", i, "model_id") else "policy" if g.policy != g.robot else "robot"
        raise w.fail(
            ("fleet", "groups", i, key),
            f"no server replica serves model {g.model_id!r}{did_you_mean(g.model_id, served)}; served: "
            f"{', '.join(sorted(served))}; give the group a model_id a replica serves, or add a replica",
            shown=f"fleet.groups[{g.name}].{key}",
        )


def checkpoint_config(name_or_path: str) -> dict:
    """A checkpoint's config.json (a name under bench/checkpoints or a path), {} where it cannot be read as a
    mapping yet: the bench reads a few of its keys (fps, chunk_size, hyper_params) before any server loads it."""
    try:
        config = json.loads((checkpoint_dir(name_or_path) / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        return {}
    return config if isinstance(config, dict) else {}


def _trained_fps(name_or_path: str) -> float | None:
    """The rate a checkpoint was trained at (its config.json's fps); None where it cannot be read yet."""
    try:
        fps = checkpoint_config(name_or_path).get("fps")
        return float(fps) if fps else None
    except (ValueError, TypeError):
        return None


def _check_rates(w: _Where, groups: list[GroupSpec], replicas: list[ReplicaSpec], server_manifest: dict) -> None:
    """A group whose control rate differs from the trained fps of a replica serving its model: the server refuses
    its sessions (FPS_MISMATCH) unless that replica's manifest allows resampling. Said here, before a run whose
    robots would all stay unserved."""
    for i, g in enumerate(groups):
        if g.engine_kind == "local":
            continue
        for r in replicas:
            if r.model_id != g.model_id:
                continue
            # the manifest's trained_fps overrides the checkpoint's (server.manifest), as allow_resampling its refusal
            trained = r.manifest.get("trained_fps", server_manifest.get("trained_fps")) or _trained_fps(r.checkpoint)
            trained = float(trained) if trained else None
            allowed = r.manifest.get("allow_resampling", server_manifest.get("allow_resampling", False))
            if trained is None or abs(trained - g.fps) < 1e-6 or allowed is True:
                continue
            raise w.fail(
                ("fleet", "groups", i, "fps"),
                f"group {g.name!r} runs at {g.fps:g} Hz but replica {r.id!r} serves {r.checkpoint!r}, trained "
                f"at {trained:g} Hz: its sessions would be refused (FPS_MISMATCH). Run the group at "
                f"{trained:g} Hz, serve a checkpoint trained at {g.fps:g} Hz, or set "
                f"servers.manifest.allow_resampling: true (each chunk then plays stretched in time)",
                shown=f"fleet.groups[{g.name}].fps",
            )


def _checkpoint_present(name_or_path: str) -> bool:
    d = checkpoint_dir(name_or_path)
    return (d / "config.json").is_file() and (d / "model.safetensors").is_file()


def _missing_checkpoint_words(name_or_path: str, groups: list[GroupSpec]) -> str:
    d = checkpoint_dir(name_or_path)
    if (d / "config.json").is_file() and (d / "stats.json").is_file():  # shipped without weights (reacher_vla)
        return (
            f"checkpoint {name_or_path!r} ships without weights ({d} has config.json and stats.json only); "
            f"make random ones (timing only, no task skill) with: bench init-weights {name_or_path}"
        )
    shipped = (
        sorted(p.name for p in CHECKPOINTS_DIR.iterdir() if (p / "config.json").is_file())
        if CHECKPOINTS_DIR.is_dir()
        else []
    )
    robot = next(
        (g.robot for g in groups if g.model_id == checkpoint_model_id(name_or_path)),
        groups[0].robot if groups else "reacher",
    )
    return (
        f"checkpoint {name_or_path!r} is missing ({d} has no config.json and model.safetensors)"
        f"{did_you_mean(name_or_path, shipped)}; build it with: bench train --robot {robot}"
        + (f" --out {d}" if d.name != robot else "")
        + (f" (present: {', '.join(shipped)})" if shipped else "")
    )


def check_checkpoints_present(scenario: Scenario) -> None:
    """Raise ScenarioError at the first replica (or shadow) whose checkpoint is not on disk."""
    w = _Where(scenario.source, scenario.raw)
    for j, r in enumerate(scenario.replicas):
        if not _checkpoint_present(r.checkpoint):
            raise w.fail(
                ("servers", "replicas", j, "checkpoint"), _missing_checkpoint_words(r.checkpoint, scenario.groups)
            )
    for i, g in enumerate(scenario.groups):
        if g.engine_kind == "local" and not _checkpoint_present(g.policy):
            key = "policy" if w.line("fleet", "groups", i, "policy") else "robot"
            raise w.fail(("fleet", "groups", i, key), _missing_checkpoint_words(g.policy, [g]))
        if g.shadow and not _checkpoint_present(g.shadow["policy"]):
            raise w.fail(("fleet", "groups", i, "shadow", "policy"), _missing_checkpoint_words(g.shadow["policy"], [g]))
    for i, f in enumerate(scenario.faults):  # a replica restarted with another model: found now, not mid-run
        if f.get("action") != "restart_with":
            continue
        if "checkpoint" in f and not _checkpoint_present(str(f["checkpoint"])):
            raise w.fail(("faults", i, "checkpoint"), _missing_checkpoint_words(str(f["checkpoint"]), scenario.groups))
        if "manifest" in f and not Path(str(f["manifest"])).is_file():
            raise w.fail(
                ("faults", i, "manifest"),
                f"manifest {str(f['manifest'])!r} is not a file (relative paths start "
                f"at {Path.cwd()}, where bench runs); give a policy-server manifest",
            )


def _read_attackers(w: _Where, m: sm.ScenarioFile, groups: list[GroupSpec]) -> list[dict]:
    out: list[dict] = []
    try:
        from bench.security.attacker import attacks_for
    except Exception:  # the attacker module needs zenoh; validation without it checks names only
        attacks_for = None
    for i, atk in enumerate(m.attackers):
        path = ("attackers", i)
        a = atk.model_dump()
        if any(o["name"] == a["name"] for o in out):
            raise w.fail((*path, "name"), f"attacker name {a['name']!r} is used twice")
        target = a["target"] or f"{groups[0].name}/0"
        gname, _, idx = target.partition("/")
        match = [g for g in groups if g.name == gname]
        if not match or not idx.isdigit() or int(idx) >= match[0].count:
            raise w.fail(
                (*path, "target"),
                f"{target!r} is not GROUP/INDEX of a robot; groups: "
                + ", ".join(f"{g.name} (0..{g.count - 1})" for g in groups),
            )
        a["target"] = target
        if float(a["at"]) > float(m.duration_s):
            raise w.fail((*path, "at"), f"{a['at']:g} s is after the end of the run ({m.duration_s:g} s)")
        if attacks_for is not None:
            known = attacks_for(a["credentials"])
            words = known if a["attacks"] == "all" else a["attacks"]
            if not isinstance(words, list) or not words or any(x not in known for x in words):
                raise w.fail(
                    (*path, "attacks"),
                    f"{a['attacks']!r}: give `all` or a list of attacks for credentials "
                    f"{a['credentials']}: {', '.join(known)}",
                )
            a["attacks"] = list(words)
        out.append(a)
    return out


def _read_faults(w: _Where, m: sm.ScenarioFile, sites, replicas, groups) -> list[dict]:
    raw = m.faults
    targets_known = {"router", "router:hub"} | {f"site:{s}" for s in sites} | {f"server:{r.id}" for r in replicas}
    for i, item in enumerate(raw):
        path = ("faults", i)
        target = item.get("target")
        if isinstance(target, str) and FAULT_TARGET_RE.match(target):
            if target.startswith("robot:"):
                _check_robot_target(w, (*path, "target"), target, groups)
            elif target not in targets_known:
                raise w.fail(
                    (*path, "target"),
                    f"unknown target {target!r}{did_you_mean(target, targets_known)}; "
                    f"known: {', '.join(sorted(targets_known))}, robot:<group>[/<index>]",
                )
        t = item.get("at", item.get("t"))
        duration = float(m.duration_s)
        if isinstance(t, (int, float)) and not isinstance(t, bool) and t > duration:
            raise ScenarioError(
                w.source, w.line(*path), f"faults[{i}].at", f"fault at {t}s is after the end of the run ({duration}s)"
            )
    _check_timeline_with_chaos(w, raw)
    return [dict(item) for item in raw]


def _check_robot_target(w: _Where, path: tuple, target: str, groups) -> None:
    body = target.split(":", 1)[1]
    gname, _, idx = body.partition("/")
    for g in groups:
        if g.name == gname:
            if idx and (not idx.isdigit() or int(idx) >= g.count):
                raise w.fail(path, f"robot index {idx!r} is not in 0..{g.count - 1} of group {gname!r}")
            return
    raise w.fail(path, f"unknown group {gname!r} in {target!r}; groups: {', '.join(g.name for g in groups)}")


def _check_timeline_with_chaos(w: _Where, raw: list) -> None:
    """Let chaos.timeline parse the faults when it is importable: its grammar is the authority."""
    try:
        from chaos import timeline
    except Exception:
        return
    parse = getattr(timeline, "parse_timeline", None) or getattr(timeline, "parse", None)
    if parse is None or not raw:
        return
    try:
        parse([dict(x) for x in raw])
    except Exception as exc:  # its error names the entry; we add the file and line
        msg = str(exc)
        m = re.search(r"\[(\d+)\]", msg)
        line = w.line("faults", int(m.group(1))) if m else w.line("faults")
        raise ScenarioError(w.source, line, "faults", msg) from None


def _read_assertions(
    w: _Where, m: sm.ScenarioFile, groups: list[GroupSpec], replicas: list[ReplicaSpec]
) -> list[AssertionSpec]:
    from bench.scenario import assertions as asserts

    out = []
    for i, expr in enumerate(m.assertions):
        line = w.line("assertions", i)
        try:
            asserts.check_expression(expr, groups=[g.name for g in groups], replicas=[r.id for r in replicas])
        except asserts.AssertionSyntaxError as exc:
            raise ScenarioError(w.source, line, f"assertions[{i}]", str(exc)) from None
        out.append(AssertionSpec(expression=expr, line=line))
    return out


def _read_sweep(w: _Where, m: sm.ScenarioFile, data: dict) -> dict | None:
    sw = m.sweep
    if sw is None:
        return None
    try:
        get_dotted(data, sw.key)
    except KeyError as exc:
        raise w.fail(("sweep", "key"), f"{sw.key!r} does not name a key of this scenario ({exc.args[0]})") from None
    if sw.key.split(".")[0] in ("sweep", "name"):
        raise w.fail(("sweep", "key"), "sweep cannot vary `sweep` or `name`")
    from bench.scenario.assertions import AssertionSyntaxError
    from bench.scenario.sweeps import check_sweep_expression

    for i, expr in enumerate(sw.assertions):
        try:
            check_sweep_expression(expr)
        except AssertionSyntaxError as exc:
            raise ScenarioError(
                w.source, w.line("sweep", "assertions", i), f"sweep.assertions[{i}]", str(exc)
            ) from None
    if sw.assertions and sw.mode != "capacity":  # the runner judges them against a capacity sweep's knee only
        raise w.fail(
            ("sweep", "assertions"),
            f"sweep assertions are judged only with mode: capacity (this sweep's "
            f"mode is {sw.mode!r}); set mode: capacity, or move each run's "
            f"checks to the top-level assertions",
        )
    if sw.formula and sw.mode != "capacity":  # P10's formula is printed beside a capacity sweep's knee only
        raise w.fail(
            ("sweep", "formula"),
            f"the formula is compared with a capacity sweep's knee only (this sweep's "
            f"mode is {sw.mode!r}); set mode: capacity, or remove it",
        )
    _check_sweep_values(w, sw, data)
    formula = (
        {k: v for k, v in sw.formula.model_dump().items() if k in (data["sweep"].get("formula") or {})}
        if sw.formula
        else None
    )
    return {
        "key": sw.key,
        "values": list(sw.values),
        "mode": sw.mode,
        "stop_after_failure": (sw.mode == "capacity") if sw.stop_after_failure is None else sw.stop_after_failure,
        "formula": formula or None,
        "assertions": list(sw.assertions),
    }


def _check_sweep_values(w: _Where, sw, data: dict) -> None:
    """Each value once (a run and its directory are named after it), a capacity sweep's load steps increasing (its
    knee is the last step held before the first that failed), and every run valid as the sweep will build it: a bad
    value is blamed on `sweep.values[i]`, found by `bench validate`, not by the run that reaches it (or, for the
    first step, by a traceback)."""
    values = list(sw.values)

    def fail(i: int, message: str) -> ScenarioError:
        return ScenarioError(w.source, w.line("sweep", "values", i), f"sweep.values[{i}]", message)

    for i, v in enumerate(values):
        if v in values[:i]:
            raise fail(i, f"{v!r} is given twice: each value is one run, named after it; give each once")
    if sw.mode == "capacity":
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise fail(i, f"a capacity sweep's values are load steps (numbers), got {v!r}")
            if i and v <= values[i - 1]:
                raise fail(
                    i,
                    f"{v!r} after {values[i - 1]!r}: a capacity sweep's steps increase (its knee is the last "
                    f"step held before the first that failed); sort them: {sorted(values)}",
                )
    for i, v in enumerate(values):
        variant = copy.deepcopy(data)
        variant.pop("sweep", None)
        set_dotted(variant, sw.key, v)
        try:
            build_scenario(variant, w.source)
        except ScenarioError as exc:
            raise fail(i, f"with {sw.key} = {v!r}: {exc.path + ': ' if exc.path else ''}{exc.message}") from None


# --- sweep helpers -----------------------------------------------------------------------------


def _step(obj, part):
    if isinstance(obj, list):
        if part.isdigit() and int(part) < len(obj):
            return int(part)
        for i, item in enumerate(obj):  # groups/replicas may be addressed by name or id
            if isinstance(item, dict) and part in (item.get("name"), item.get("id")):
                return i
        raise KeyError(f"no item {part!r}")
    if isinstance(obj, dict) and part in obj:
        return part
    raise KeyError(f"no key {part!r}")


def get_dotted(data, key: str):
    obj = data
    for part in key.split("."):
        obj = obj[_step(obj, part)]
    return obj


def set_dotted(data, key: str, value) -> None:
    parts = key.split(".")
    obj = data
    for part in parts[:-1]:
        obj = obj[_step(obj, part)]
    last = parts[-1]
    if isinstance(obj, dict):
        obj[last] = value
    else:
        obj[_step(obj, last)] = value


def sweep_variants(scenario: Scenario) -> list[tuple[str, Scenario]]:
    """One (label, Scenario) per sweep value, or [("", scenario)] without a sweep."""
    if not scenario.sweep:
        return [("", scenario)]
    out = []
    for value in scenario.sweep["values"]:
        data = copy.deepcopy(scenario.raw)
        data.pop("sweep", None)
        set_dotted(data, scenario.sweep["key"], value)
        label = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{scenario.sweep['key']}={value}")
        out.append((label, build_scenario(data, scenario.source)))
    return out


def missing_checkpoints(scenario: Scenario) -> list[str]:
    """Messages naming each missing checkpoint and the command that builds it."""
    msgs, seen = [], set()
    for r in scenario.replicas:
        d = checkpoint_dir(r.checkpoint)
        if d not in seen and not _checkpoint_present(r.checkpoint):
            msgs.append(
                f"servers.replicas[{r.id}].checkpoint: {_missing_checkpoint_words(r.checkpoint, scenario.groups)}"
            )
        seen.add(d)
    return msgs


def list_scenarios(directory: Path = SCENARIOS_DIR) -> list[tuple[Path, str, str]]:
    """(path, name, description or error) for every shipped scenario file."""
    out = []
    for p in sorted(directory.glob("**/*.yaml")):  # sub-folders too: scenarios/ci/ holds the CI chaos jobs
        if p.exists() and not p.is_file() and not p.is_dir():  # a FIFO or device: reading it could block forever
            out.append((p, p.stem, f"INVALID: {p}: not a regular file (a FIFO or a device); a scenario is a YAML file"))
            continue
        try:
            s = load_scenario(p)
            out.append((p, s.name, s.description))
        except ScenarioError as exc:
            out.append((p, p.stem, f"INVALID: {exc}"))
    return out
