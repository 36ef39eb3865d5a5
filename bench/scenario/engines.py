"""The engine configs a group's robots run with, and the checks of a group's `engine:` section against edge.

Owns the one place the bench turns a `GroupSpec` into RemoteEngineConfig fields (bench.fleet builds its
robots from `engine_config`; the scenario check builds the same one, so both refuse the same values),
the local and shadow RTC engines beside it, and the lease check against the site's worst round trip.
Without the edge or chaos package installed, only the shape of the section is checked.
"""

from __future__ import annotations

import math
import re

from pydantic import ValidationError

from bench.scenario import model as sm
from bench.scenario.spec import GroupSpec, SiteSpec, Where
from wire import configerrors
from wire.suggest import did_you_mean

PLACEHOLDER_ENDPOINT = "tcp/127.0.0.1:7447"  # the engine check's router; the run's comes from the router it starts


def engine_field_names() -> set[str] | None:
    """Fields of edge.RemoteEngineConfig, or None when the edge package is not importable."""
    try:
        import dataclasses

        from edge import RemoteEngineConfig

        return {f.name for f in dataclasses.fields(RemoteEngineConfig)}
    except Exception:
        return None


def group_robot_type(group: GroupSpec):
    """The group's robot type; a gym group's made again from its config where another load replaced it."""
    from bench.robots.core import robot_type

    if group.gym is not None:
        from bench.robots.gymenv import gym_robot_type

        return gym_robot_type(group.gym, group.robot, measure=False)
    return robot_type(group.robot)


def engine_config(group: GroupSpec, endpoint: str) -> dict:
    """The RemoteEngineConfig fields a robot of `group` runs with (bench.fleet.shard builds its robots
    from this; the scenario check builds the same one, so both refuse the same values)."""
    cls = group_robot_type(group)
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


def _unknown_engine_key(model, key: str, path: str) -> str:
    if key in sm.ENGINE_OWNED:
        return "set by the bench from the robot, its site and the group; remove it"
    known = sorted(configerrors.model_fields(model))
    return f"not a RemoteEngineConfig field{did_you_mean(key, known)}; fields: {', '.join(known)}"


LEASE_ROUND_TRIPS = 1.5  # a lease must cover the round trip and the keep-alive period after it (lease / 4)


def check_lease(w: Where, path: tuple, group: GroupSpec, site: SiteSpec) -> None:
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


def check_engine_keys(w: Where, path: tuple, engine: dict) -> None:
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


def check_engine(w: Where, path: tuple, group: GroupSpec) -> None:
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
