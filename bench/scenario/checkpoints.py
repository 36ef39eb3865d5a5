"""Checkpoints a scenario names: where each lives on disk, its model id and config, and the checks that it is there.

A checkpoint is a name under bench/checkpoints/ or a path; a missing one is reported with the command
that builds it (`bench train`, or `bench init-weights` for one shipped without weights).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench.scenario.spec import GroupSpec, Scenario, Where
from wire.suggest import did_you_mean

REPO_ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTS_DIR = REPO_ROOT / "bench" / "checkpoints"


def checkpoint_dir(name_or_path: str) -> Path:
    """A checkpoint name (bench/checkpoints/<name>) or a path, as a directory path."""
    p = Path(name_or_path)
    if p.is_absolute() or "/" in name_or_path:
        return p if p.is_absolute() else (REPO_ROOT / p)
    return CHECKPOINTS_DIR / name_or_path


def checkpoint_model_id(name_or_path: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(name_or_path).name).strip("-.") or "policy"


def checkpoint_config(name_or_path: str) -> dict:
    """A checkpoint's config.json (a name under bench/checkpoints or a path), {} where it cannot be read as a
    mapping yet: the bench reads a few of its keys (fps, chunk_size, hyper_params) before any server loads it."""
    try:
        config = json.loads((checkpoint_dir(name_or_path) / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        return {}
    return config if isinstance(config, dict) else {}


def trained_fps(name_or_path: str) -> float | None:
    """The rate a checkpoint was trained at (its config.json's fps); None where it cannot be read yet."""
    try:
        fps = checkpoint_config(name_or_path).get("fps")
        return float(fps) if fps else None
    except (ValueError, TypeError):
        return None


def checkpoint_present(name_or_path: str) -> bool:
    d = checkpoint_dir(name_or_path)
    return (d / "config.json").is_file() and (d / "model.safetensors").is_file()


# checkpoints made on the machine that runs them (git-ignored), and the command that makes each
GENERATED = {
    "lerobot_act_random": "python -m server.policies.lerobot_random bench/checkpoints/lerobot_act_random --type act "
    "--state-dim 8 --env-state-dim 2 --action-dim 2 --chunk 30",
}


def missing_checkpoint_words(name_or_path: str, groups: list[GroupSpec]) -> str:
    d = checkpoint_dir(name_or_path)
    if name_or_path in GENERATED:
        return (
            f"checkpoint {name_or_path!r} is made where it runs, with random weights (timing only, no task skill): "
            f"{GENERATED[name_or_path]}"
        )
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
    w = Where(scenario.source, scenario.raw)
    for j, r in enumerate(scenario.replicas):
        if not checkpoint_present(r.checkpoint):
            raise w.fail(
                ("servers", "replicas", j, "checkpoint"), missing_checkpoint_words(r.checkpoint, scenario.groups)
            )
    for i, g in enumerate(scenario.groups):
        if g.engine_kind == "local" and not checkpoint_present(g.policy):
            key = "policy" if w.line("fleet", "groups", i, "policy") else "robot"
            raise w.fail(("fleet", "groups", i, key), missing_checkpoint_words(g.policy, [g]))
        if g.shadow and not checkpoint_present(g.shadow["policy"]):
            raise w.fail(("fleet", "groups", i, "shadow", "policy"), missing_checkpoint_words(g.shadow["policy"], [g]))
    for i, f in enumerate(scenario.faults):  # a replica restarted with another model: found now, not mid-run
        if f.get("action") != "restart_with":
            continue
        if "checkpoint" in f and not checkpoint_present(str(f["checkpoint"])):
            raise w.fail(("faults", i, "checkpoint"), missing_checkpoint_words(str(f["checkpoint"]), scenario.groups))
        if "manifest" in f and not Path(str(f["manifest"])).is_file():
            raise w.fail(
                ("faults", i, "manifest"),
                f"manifest {str(f['manifest'])!r} is not a file (relative paths start "
                f"at {Path.cwd()}, where bench runs); give a policy-server manifest",
            )


def missing_checkpoints(scenario: Scenario) -> list[str]:
    """Messages naming each missing checkpoint and the command that builds it."""
    msgs, seen = [], set()
    for r in scenario.replicas:
        d = checkpoint_dir(r.checkpoint)
        if d not in seen and not checkpoint_present(r.checkpoint):
            msgs.append(
                f"servers.replicas[{r.id}].checkpoint: {missing_checkpoint_words(r.checkpoint, scenario.groups)}"
            )
        seen.add(d)
    return msgs
