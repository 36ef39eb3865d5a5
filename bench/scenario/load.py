"""The scenario loader: a file in, a fully checked `Scenario` out, or a `ScenarioError` at its line.

    FILE ──► wire.yamlines ──► bench.scenario.model (pydantic) ──► cross checks ──► Scenario
             (every key keeps    keys, types, bounds, choices      sites, models served, engines built
              its line)          of each section                   by edge, profiles, checkpoints, faults,
                                                                   assertions, sweep, attackers

Owns the order of the checks that need several keys or other packages, each done by the module owning
its sections: bench.scenario.groups (sites, groups, models served, rates), bench.scenario.engines (the
engine configs), bench.scenario.checkpoints (on disk), bench.scenario.events (faults, attackers,
assertions), bench.scenario.variants (the sweep); bench.scenario.model owns each key's shape and
meaning, bench.scenario.spec the typed result. Invariant: `load_scenario` either returns a fully
checked `Scenario` or raises `ScenarioError` whose message starts ``file:line: key.path:``; `bench
validate` and `bench run` call the same function, so a file validate passes is one run accepts (engine
configs are built by the engines' own constructors, site overrides by chaos.profiles, checkpoints
looked up on disk). Unknown keys are always rejected, with the known keys listed and the closest one
suggested. Every name other code imports from here is re-exported (its home is the module above).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from bench.scenario import model as sm
from bench.scenario.checkpoints import (  # noqa: F401 - re-exported
    CHECKPOINTS_DIR,
    REPO_ROOT,
    check_checkpoints_present,
    checkpoint_config,
    checkpoint_dir,
    checkpoint_model_id,
    missing_checkpoints,
)
from bench.scenario.engines import (  # noqa: F401 - re-exported
    LEASE_ROUND_TRIPS,
    PLACEHOLDER_ENDPOINT,
    engine_config,
    engine_field_names,
    local_engine_config,
    shadow_engine_config,
)
from bench.scenario.events import FAULT_TARGET_RE, read_assertions, read_attackers, read_faults  # noqa: F401
from bench.scenario.groups import check_gym_policies, check_rates, check_served, check_unique, read_groups, read_sites
from bench.scenario.model import (  # noqa: F401 - re-exported
    CAMERA_KINDS,
    PROFILES_FALLBACK,
    ROBOT_TYPES_FALLBACK,
    camera_kinds,
    profile_names,
    robot_types,
)
from bench.scenario.spec import (  # noqa: F401 - re-exported
    AssertionSpec,
    CameraSpec,
    GroupSpec,
    ReplicaSpec,
    Scenario,
    ScenarioError,
    SiteSpec,
    Where,
)
from bench.scenario.variants import get_dotted, read_sweep, set_dotted  # noqa: F401 - re-exported
from wire import configerrors, yamlines
from wire.suggest import did_you_mean

SCENARIOS_DIR = REPO_ROOT / "scenarios"


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


def _unknown_key(model, key: str, path: str) -> str:
    known = list(configerrors.model_fields(model))
    return f"unknown key{did_you_mean(key, known)}; known keys: {', '.join(known)}"


def build_scenario(data: Any, source: str = "<string>") -> Scenario:
    w = Where(source, data)
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
    sites = read_sites(w, m)
    groups = read_groups(w, m, sites)
    replicas = [
        ReplicaSpec(
            id=r.id,
            checkpoint=r.checkpoint,
            model_id=r.model_id or checkpoint_model_id(r.checkpoint),
            max_sessions=r.max_sessions,
            emulated_latency=r.emulated_latency,
            manifest=dict(r.manifest),
            start_at=r.start_at,
            line=w.line("servers", "replicas", i),
        )
        for i, r in enumerate(m.servers.replicas)
    ]
    check_unique(w, [r.id for r in replicas], ("servers", "replicas"), "id", "replica id")
    check_served(w, groups, replicas)
    check_rates(w, groups, replicas, dict(m.servers.manifest))
    check_gym_policies(w, groups)
    faults = read_faults(w, m, sites, replicas, groups)
    assertions = read_assertions(w, m, groups, replicas)
    sweep = read_sweep(w, m, data, build_scenario)
    attackers = read_attackers(w, m, groups)
    return Scenario(
        name=m.name,
        description=m.description.strip(),
        duration_s=float(m.duration_s),
        warmup_s=float(m.warmup_s),
        seed=m.seed,
        shards=m.fleet.shards,
        engine_workers=m.fleet.engine_workers,
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
        record=read_record(w, m),
    )


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


def read_record(w: Where, m) -> dict:
    """`record`, checked against what the run can write: LeRobot importable here, a directory not there yet."""
    record = m.record.model_dump()
    if not record["dataset"]:
        return record
    import importlib.util

    if importlib.util.find_spec("lerobot") is None:  # found, not imported: the plain path stays LeRobot-free
        raise w.fail(
            ("record", "dataset"),
            "recording a LeRobotDataset needs lerobot 0.4.4 here: pip install -e '.[lerobot]' "
            "(docs/bench.md \"Record a run as a LeRobotDataset\"), or leave record.dataset false",
        )
    for i, g in enumerate(m.fleet.groups):
        if g.fps is not None and float(g.fps) != int(g.fps):  # None: the default, a whole 30 (or the env's)
            raise w.fail(
                ("fleet", "groups", i, "fps"),
                f"a LeRobotDataset's fps is a whole number, and group {g.name!r} ticks at {g.fps:g} Hz: give it a "
                "whole fps, or leave record.dataset false",
            )
    if record["dir"] is not None:
        if m.sweep is not None:
            raise w.fail(
                ("record", "dir"),
                "a sweep's runs would all write this one directory: leave record.dir out (each run writes its "
                "own dataset/)",
            )
        if Path(record["dir"]).exists():
            raise w.fail(
                ("record", "dir"),
                f"{record['dir']!r} already exists; a LeRobotDataset is created in a new directory: remove it "
                "or give another",
            )
    return record
