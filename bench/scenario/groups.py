"""The cross checks of the fleet, sites and servers sections: sites, groups, the models served and the rates.

Reads `sites:` (overrides checked by chaos.profiles) and `fleet.groups` into their specs (engines
checked by bench.scenario.engines), then checks that every remote group's model is served by a replica
and runs at the rate its checkpoint was trained at (or that the replica allows resampling).
"""

from __future__ import annotations

from bench.scenario import model as sm
from bench.scenario.checkpoints import (
    checkpoint_config,
    checkpoint_model_id,
    checkpoint_present,
    missing_checkpoint_words,
    trained_fps,
)
from bench.scenario.engines import check_engine, check_engine_keys, check_lease
from bench.scenario.spec import CameraSpec, GroupSpec, ReplicaSpec, SiteSpec, Where
from wire.suggest import did_you_mean


def check_unique(w: Where, names: list, path: tuple, key: str, what: str) -> None:
    for i, n in enumerate(names):
        if n in names[:i]:
            raise w.fail((*path, i, key), f"{what} {n!r} is used twice; {what}s must be unique")


def read_sites(w: Where, m: sm.ScenarioFile) -> dict[str, SiteSpec]:
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


def read_groups(w: Where, m: sm.ScenarioFile, sites: dict[str, SiteSpec]) -> list[GroupSpec]:
    groups: list[GroupSpec] = []
    gym_names: dict[str, dict] = {}  # gym type name -> its config, in this scenario
    for i, g in enumerate(m.fleet.groups):
        path = ("fleet", "groups", i)
        if any(o.name == g.name for o in groups):
            raise w.fail((*path, "name"), f"group name {g.name!r} is used twice; group names must be unique")
        if g.site not in sites:
            raise w.fail(
                (*path, "site"), f"unknown site {g.site!r}{did_you_mean(g.site, sites)}; sites: {', '.join(sites)}"
            )
        check_engine_keys(w, path, g.engine)
        robot, gym_config, gym_type = g.robot, None, None
        if (g.robot is None) == (g.gym is None):
            raise w.fail(
                path if g.robot is None else (*path, "gym"),
                "give the group's robot type: `robot` (a built-in or plugin type) or `gym` (a Gymnasium env), not both"
                if g.robot is not None
                else "missing `robot` (a robot type: " + ", ".join(sm.robot_types()) + ") or `gym` (a Gymnasium env)",
            )
        if g.gym is not None:
            gym_config, gym_type = read_gym(w, (*path, "gym"), g, gym_names)
            robot = gym_type.name
            gym_names[robot] = gym_config
        fps = float(g.fps) if g.fps is not None else (gym_type.fps if gym_type is not None else 30.0)
        cams = (
            None
            if g.cameras is None
            else CameraSpec(
                kind=g.cameras.kind, names=list(g.cameras.names), height=g.cameras.height, width=g.cameras.width
            )
        )
        if gym_type is not None:
            cams = gym_cameras(w, path, gym_type, cams)
        elif cams is not None and cams.kind == "observation":
            raise w.fail(
                (*path, "cameras", "kind"),
                "camera kind `observation` takes its images from a gymnasium env's observation: only a group "
                "with `gym:` has one; use synthetic or rendered",
            )
        if cams is not None and cams.kind == "rendered":
            from bench.robots.models import GL_UNAVAILABLE

            if GL_UNAVAILABLE:
                raise w.fail((*path, "cameras", "kind"), f"{GL_UNAVAILABLE}; or use kind: synthetic")
        if g.policy is None and gym_type is not None:
            raise w.fail(
                path, "a gym group needs `policy`: the checkpoint its robots' server serves (no default for an env)"
            )
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
            robot=robot,
            count=g.count,
            fps=fps,
            site=g.site,
            cameras=cams,
            policy=policy,
            model_id=g.model_id or checkpoint_model_id(policy),
            task=g.task,
            episode_s=_episode_s(g.episode_s, robot),
            engine=engine,
            shadow=shadow,
            line=w.line(*path),
            stagger_episodes=g.stagger_episodes,
            engine_kind=kind,
            seeds_of=g.seeds_of,
            gym=gym_config,
        )
        check_engine(w, path, group)
        if kind == "remote":
            check_lease(w, path, group, sites[g.site])
        groups.append(group)
    return groups


def read_gym(w: Where, path: tuple, g, taken: dict[str, dict]) -> tuple[dict, type]:
    """A gym group's config and its robot type (bench.robots.gymenv), the mapping checked against the env's
    spaces; the error names the key below `gym` and the env's actual space."""
    from bench.robots.gymenv import GymMappingError, gym_robot_type, type_name

    config = g.gym.model_dump(exclude_none=True)
    try:
        return config, gym_robot_type(config, type_name(config, taken))
    except GymMappingError as exc:
        raise w.fail((*path, *exc.path), exc.message) from None
    except Exception as exc:  # the env's own code failed: said with the key that named it
        raise w.fail((*path, "env"), f"making {config['env']!r} failed: {type(exc).__name__}: {exc}") from None


def gym_cameras(w: Where, path: tuple, gym_type, cams: CameraSpec | None) -> CameraSpec | None:
    """A gym group's cameras: its `observation.cameras`, as kind `observation` at the env's image size."""
    observed = dict(gym_type.cameras)
    if cams is None:
        if not observed:
            return None
        (height, width), *_ = observed.values()
        return CameraSpec(kind="observation", names=list(observed), height=height, width=width)
    if cams.kind == "rendered":
        raise w.fail(
            (*path, "cameras", "kind"),
            "a gym group has no MuJoCo scene of ours to render: map the env's images with "
            "gym.observation.cameras (kind observation), or use kind synthetic",
        )
    if cams.kind == "observation":
        if sorted(cams.names) != sorted(observed):
            raise w.fail(
                (*path, "cameras", "names"),
                f"camera names {cams.names} differ from gym.observation.cameras {sorted(observed)}; "
                "drop `cameras` (it follows the mapping) or name the same cameras",
            )
        sizes = {observed[n] for n in cams.names}
        if sizes != {(cams.height, cams.width)}:
            raise w.fail(
                (*path, "cameras"),
                f"the env's images are {' and '.join(f'{h}x{wd}' for h, wd in sorted(sizes))}, not "
                f"{cams.height}x{cams.width}: drop height and width (they follow the env)",
            )
    return cams


def _episode_s(value, robot: str) -> float:
    if value is not None:
        return float(value)
    try:
        from bench.robots import robot_type

        return float(robot_type(robot).episode_s)
    except Exception:
        return 10.0


def check_served(w: Where, groups: list[GroupSpec], replicas: list[ReplicaSpec]) -> None:
    served = {r.model_id for r in replicas}
    for i, g in enumerate(groups):
        if g.model_id in served or g.engine_kind == "local":  # a local group loads its policy in the shard
            continue
        missing = [(j, r) for j, r in enumerate(replicas) if not checkpoint_present(r.checkpoint)]
        if missing:  # the likelier cause: a misspelt checkpoint names another model
            j, r = missing[0]
            raise w.fail(("servers", "replicas", j, "checkpoint"), missing_checkpoint_words(r.checkpoint, groups))
        key = "model_id" if w.line("fleet", "groups", i, "model_id") else "policy" if g.policy != g.robot else "robot"
        raise w.fail(
            ("fleet", "groups", i, key),
            f"no server replica serves model {g.model_id!r}{did_you_mean(g.model_id, served)}; served: "
            f"{', '.join(sorted(served))}; give the group a model_id a replica serves, or add a replica",
            shown=f"fleet.groups[{g.name}].{key}",
        )


def check_rates(w: Where, groups: list[GroupSpec], replicas: list[ReplicaSpec], server_manifest: dict) -> None:
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
            trained = r.manifest.get("trained_fps", server_manifest.get("trained_fps")) or trained_fps(r.checkpoint)
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


def check_gym_policies(w: Where, groups: list[GroupSpec]) -> None:
    """A gym group's mapping against the checkpoint it names: the server refuses a session whose action names
    differ (sessions.py) and an observation whose state has another size, so both are said here, at the key."""
    from bench.robots.core import robot_type
    from bench.robots.gymenv import describe

    for i, g in enumerate(groups):
        if g.gym is None:
            continue
        config = checkpoint_config(g.policy)
        cls = robot_type(g.robot)
        names, dim = config.get("action_names"), config.get("state_dim")
        if names is not None and len(names) != len(cls.action_names):
            raise w.fail(
                ("fleet", "groups", i, "policy"),
                f"the policy {g.policy!r} acts on {len(names)} actions {list(names)}; the env takes "
                f"{len(cls.action_names)} ({describe(cls.mapping.action_space)}): serve a policy trained on this env",
            )
        if names is not None and list(names) != list(cls.action_names):
            raise w.fail(
                ("fleet", "groups", i, "gym", "action", "names"),
                f"the mapping names the actions {list(cls.action_names)}; the policy {g.policy!r} acts on "
                f"{list(names)} (the server refuses other names): set gym.action.names to those",
            )
        if dim is not None and int(dim) != len(cls.state_names):
            raise w.fail(
                ("fleet", "groups", i, "gym", "observation", "state"),
                f"the mapping makes a state of {len(cls.state_names)} values ({', '.join(cls.state_names)}); the "
                f"policy {g.policy!r} takes {dim}",
            )


def check_gym_envs(scenario) -> None:
    """gymnasium's check_env on every gym group's env that asks for it (`gym.check_env`, default true): `bench
    validate` and `bench run` call this after the load, which already checked each mapping."""
    from bench.robots.gymenv import GymMappingError, check_env_contract

    w = Where(scenario.source, scenario.raw)
    for i, g in enumerate(scenario.groups):
        if g.gym is None or not g.gym.get("check_env", True):
            continue
        try:
            check_env_contract(g.gym)
        except GymMappingError as exc:
            raise w.fail(("fleet", "groups", i, "gym", *exc.path), exc.message) from None
