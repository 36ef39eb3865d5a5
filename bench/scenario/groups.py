"""The cross checks of the fleet, sites and servers sections: sites, groups, the models served and the rates.

Reads `sites:` (overrides checked by chaos.profiles) and `fleet.groups` into their specs (engines
checked by bench.scenario.engines), then checks that every remote group's model is served by a replica
and runs at the rate its checkpoint was trained at (or that the replica allows resampling).
"""

from __future__ import annotations

from bench.scenario import model as sm
from bench.scenario.checkpoints import checkpoint_model_id, checkpoint_present, missing_checkpoint_words, trained_fps
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
    for i, g in enumerate(m.fleet.groups):
        path = ("fleet", "groups", i)
        if any(o.name == g.name for o in groups):
            raise w.fail((*path, "name"), f"group name {g.name!r} is used twice; group names must be unique")
        if g.site not in sites:
            raise w.fail(
                (*path, "site"), f"unknown site {g.site!r}{did_you_mean(g.site, sites)}; sites: {', '.join(sites)}"
            )
        check_engine_keys(w, path, g.engine)
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
        check_engine(w, path, group)
        if kind == "remote":
            check_lease(w, path, group, sites[g.site])
        groups.append(group)
    return groups


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
