"""What `bench robots` prints: every robot type available here, built in, plugged in or a scenario's gym env.

    built in (ROBOT_TYPES) + entry points (plugins.entry_points) + gym types the caller registered
        -> one RobotInfo each: where it comes from, state/action names, cameras, fps, fallback,
           and its measured cost per tick (core.measure_tick_us) unless measure=False

A plugin that does not load is listed with the reason, never dropped: the listing is how a user finds out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.robots.core import DEFAULT_FPS, ROBOT_TYPES, RobotType, measure_tick_us
from bench.robots.gymenv import GYM_PREFIX, GymRobotType
from bench.robots.plugins import PluginError, entry_points, load_plugin


@dataclass
class RobotInfo:
    name: str
    source: str  # "built in", "plugin mypkg.robots:MyArm", "gym gym_pusht/PushT-v0"
    state_names: tuple[str, ...] = ()
    action_names: tuple[str, ...] = ()
    cameras: str = ""
    fps: float = DEFAULT_FPS
    fallback: str = ""
    tick_us: float | None = None
    problem: str = ""
    stepping: str = field(default="batched (one MjModel, lockstep)")


def _cameras(cls: type[RobotType]) -> str:
    if issubclass(cls, GymRobotType):
        return ", ".join(f"{n} (observation, {h}x{w})" for n, (h, w) in cls.cameras.items()) or "none (synthetic only)"
    view = cls.camera_view
    return (
        f"rendered (MJCF camera {view!r}) or synthetic"
        if isinstance(view, str)
        else "rendered (free camera) or synthetic"
    )


def info(cls: type[RobotType], source: str, measure: bool) -> RobotInfo:
    gym_type = issubclass(cls, GymRobotType)
    fallback = cls.safe_fallback
    if gym_type:
        config = cls.config
        fallback = config.get("fallback", "hold") if isinstance(config.get("fallback", "hold"), str) else "fixed"
        fallback = f"{fallback} (engine: {cls.safe_fallback})"
    row = RobotInfo(
        name=cls.name,
        source=source,
        state_names=tuple(cls.state_names),
        action_names=tuple(cls.action_names),
        cameras=_cameras(cls),
        fps=float(getattr(cls, "fps", DEFAULT_FPS)),
        fallback=fallback,
        stepping="one env a robot" if gym_type else "batched (one MjModel, lockstep)",
    )
    if measure:
        try:
            row.tick_us = measure_tick_us(cls)
        except Exception as exc:  # a user's type that fails to step: said in its row
            row.problem = f"stepping failed: {type(exc).__name__}: {exc}"
    return row


def available(gym_types: list[type[RobotType]] = (), *, measure: bool = True) -> list[RobotInfo]:
    """Built-in types, then plugins (entry points), then `gym_types` (made from scenarios by the caller)."""
    rows, seen = [], set()
    for name, cls in sorted(ROBOT_TYPES.items()):
        if name.startswith(GYM_PREFIX) or ":" in name or cls.__module__.split(".")[0] != "bench":
            continue
        rows.append(info(cls, "built in", measure))
        seen.add(name)
    for name, target in sorted(entry_points().items()):
        if name in seen:
            continue
        try:
            cls = load_plugin(name)
        except PluginError as exc:
            rows.append(RobotInfo(name=name, source=f"plugin {target}", problem=str(exc)))
            continue
        rows.append(info(cls, f"plugin {target}", measure))
        seen.add(name)
    for cls in gym_types:
        if cls.name not in seen:
            rows.append(info(cls, f"gym {cls.config['env']}", measure))
            seen.add(cls.name)
    return rows


def _names(names: tuple[str, ...], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return f"{shown}, ... ({len(names)})" if len(names) > limit else f"{shown} ({len(names)})"


def format_rows(rows: list[RobotInfo]) -> str:
    out = []
    for r in rows:
        cost = f"{r.tick_us:.1f} us/tick" if r.tick_us is not None else "not measured"
        out.append(f"{r.name}  [{r.source}]")
        if r.problem:
            out.append(f"  problem:  {r.problem}")
            if not r.state_names:
                continue
        out += [
            f"  state:    {_names(r.state_names)}",
            f"  action:   {_names(r.action_names)}",
            f"  cameras:  {r.cameras}",
            f"  fps {r.fps:g} Hz, fallback {r.fallback}, {r.stepping}, cost {cost}",
        ]
    return "\n".join(out)
