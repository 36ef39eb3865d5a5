"""The scenario file's shape as typed models: every key, its type, bounds, default and meaning.

Owns what a scenario YAML may hold key by key (pydantic v2): `bench.scenario.load` validates a
file against `ScenarioFile`, then runs the checks that need several keys or other packages (sites
referenced, models served, engines built, faults, assertions). The same models give the JSON
Schema editors use (`bench schema scenario`, docs/schemas/scenario.schema.json) and the key tables
of docs/scenarios.md (`python -m bench.scenario.docs`). Names other packages own (robot types,
network profiles, camera kinds, engine fields and their choices) are read from those packages, so
the schema cannot fall behind the code that consumes it.

Invariants: every model forbids unknown keys; a field's description is its one meaning (the docs
table and the editor's hover text are generated from it).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, Strict, WithJsonSchema, create_model

from wire.configerrors import Doc, problem

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
ROBOT_TYPES_FALLBACK = ("arm", "reacher", "base")
CAMERA_KINDS = ("observation", "rendered", "synthetic")
PROFILES_FALLBACK = ("lan", "wifi", "lte", "wan_50ms", "satellite", "congested")
# engine fields the bench sets from the robot, its site and the group: a scenario may not
ENGINE_OWNED = ("connect_endpoints", "action_names", "state_dim", "fps", "cameras", "model_id", "task")
# `engine.kind`: where a group's policy runs. `remote` (the system under test: network, router, server; edge's
# `remote` engine) or `local` (the same checkpoint through the server's inference path inside the shard, no
# network: edge's `rtc` engine, the in-run baseline a remote group's task success is compared with,
# bench.fleet.local). Edge's factory words (`sync`, `rtc`, `remote`) name engine classes; `kind` picks one of two.
ENGINE_KINDS = ("remote", "local")
# `engine.chunking`: the chunking strategy by name, a preset of the engine fields it sets (the words of
# bench.training.delay_eval's STRATEGIES). `sync` is blocking inference, as edge's `sync` engine does it locally:
# ask only when the queue is empty (buffer_time_s: one millisecond of playback) and append what comes back.
SYNC_BUFFER_TIME_S = 0.001
CHUNKINGS = {
    "sync": {"rtc_enabled": False, "buffer_time_s": SYNC_BUFFER_TIME_S},
    "append": {"rtc_enabled": False},
    "rtc": {"rtc_enabled": True},
}


# --- names other packages own -----------------------------------------------------------------


def robot_types() -> tuple[str, ...]:
    """The robot types a group may name: the shipped ones and the installed plugins' entry points (a gym env's
    type is made from its group's `gym:` key, a `module:Class` from the class it names)."""
    try:
        from bench import robots
        from bench.robots.gymenv import GYM_PREFIX
        from bench.robots.plugins import plugin_names

        reg = getattr(robots, "ROBOT_TYPES", None) or getattr(robots, "REGISTRY", None)
        if reg:
            shipped = {n for n, c in reg.items() if c.__module__.startswith("bench.") and not n.startswith(GYM_PREFIX)}
            return tuple(sorted(shipped | set(plugin_names())))
    except Exception:  # bench.robots is another room; its absence must not break validation
        pass
    return ROBOT_TYPES_FALLBACK


MODULE_CLASS_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"


class _RobotDoc(Doc):
    """The robot names a registry knows, or any `module:Class` (a user's own type) in the JSON Schema."""

    def __call__(self, schema: dict) -> None:
        super().__call__(schema)
        schema.setdefault("anyOf", []).insert(1, {"type": "string", "pattern": MODULE_CLASS_PATTERN})


def _robot_word(v: str) -> str:
    """A robot type name, or `module:Class` of a user's RobotType subclass (imported here to check it)."""
    try:
        from bench.robots.plugins import PluginError, is_module_class, load_plugin
    except Exception:
        return _one_of(robot_types, "robot type")(v)
    if is_module_class(v):
        try:
            load_plugin(v)
        except PluginError as exc:
            problem(str(exc).split(": ", 1)[-1])
        return v
    return _one_of(robot_types, "robot type")(v)


def camera_kinds() -> tuple[str, ...]:
    try:
        from bench.robots.cameras import CAMERA_KINDS as kinds

        if kinds:
            return tuple(sorted(kinds))
    except Exception:
        pass
    return CAMERA_KINDS


def profile_names() -> tuple[str, ...]:
    try:
        from chaos import profiles

        for attr in ("PROFILES", "profiles", "REGISTRY"):
            reg = getattr(profiles, attr, None)
            if isinstance(reg, dict) and reg:
                return tuple(sorted(reg))
    except Exception:
        pass
    return PROFILES_FALLBACK


# --- value types --------------------------------------------------------------------------------


def _name(v: str) -> str:
    if not NAME_RE.match(v):
        problem(f"{v!r} is not a name (letters, digits, _ . -; starts with a letter or digit)")
    return v


def _one_of(names, what: str):
    def check(v: str) -> str:
        known = names()
        if v not in known:
            from wire.suggest import did_you_mean

            problem(f"unknown {what} {v!r}{did_you_mean(v, known)}; known: {', '.join(known)}")
        return v

    return check


def _shards(v: Any) -> Any:
    if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v > 0):
        return v
    problem(f"expected a positive integer or auto, got {v!r}")


def _unique(v: list) -> list:
    repeated = sorted({x for x in v if v.count(x) > 1})
    if repeated:
        problem(f"{', '.join(map(repr, repeated))} given more than once; each camera needs its own name")
    return v


def _site_shorthand(v: Any) -> Any:
    return {"profile": v} if isinstance(v, str) else v  # `eu: wan_50ms`


Str = Annotated[str, Strict()]
Bool = Annotated[bool, Strict()]
Int = Annotated[int, Strict()]
Num = Annotated[float, Strict()]
Name = Annotated[str, Strict(), AfterValidator(_name), WithJsonSchema({"type": "string", "pattern": NAME_RE.pattern})]
PosInt = Annotated[int, Strict(), Field(gt=0)]
NonNegInt = Annotated[int, Strict(), Field(ge=0)]
PosNum = Annotated[float, Strict(), Field(gt=0)]
NonNegNum = Annotated[float, Strict(), Field(ge=0)]
RobotType = Annotated[str, Strict(), AfterValidator(_robot_word)]
Profile = Annotated[str, Strict(), AfterValidator(_one_of(profile_names, "network profile"))]
CameraKind = Annotated[str, Strict(), AfterValidator(_one_of(camera_kinds, "camera kind"))]
Shards = Annotated[
    Any,
    AfterValidator(_shards),
    WithJsonSchema({"anyOf": [{"const": "auto"}, {"type": "integer", "exclusiveMinimum": 0}]}),
]


def _f(default: Any = ..., doc: str = "", enum=None, **meta: Any) -> Any:
    """A scenario key: `doc` is its meaning; `default_doc` words a default computed later;
    `enum` names a registry whose names the JSON Schema lists (for completion)."""
    extra = meta.pop("doc_class", Doc)(enum=enum, **meta)
    if isinstance(default, (list, dict)):
        value = default
        return Field(default_factory=lambda: type(value)(value), description=doc, json_schema_extra=extra)
    return Field(default, description=doc, json_schema_extra=extra)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- the engine overrides: the fields of edge.RemoteEngineConfig ---------------------------------


def _engine_choices() -> dict[str, tuple[str, ...]]:
    from edge.engine import FallbackBehavior
    from edge.latency import LATENCY_MODES
    from edge.queue import TRIM_MODES

    return {
        "fallback": tuple(f.value for f in FallbackBehavior),
        "trim": tuple(TRIM_MODES),
        "latency_mode": tuple(LATENCY_MODES),
    }


def _engine_type(name: str, tp: Any) -> Any:
    choices = _engine_choices().get(name)
    if choices:
        return Literal[choices]
    base, nullable = tp, False
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        base, nullable = args[0], True
    strict = {str: Str, bool: Bool, int: Int, float: Num}.get(base, base)
    return (strict | None) if nullable else strict


@functools.cache
def engine_model() -> type[BaseModel]:
    """The `engine:` mapping of a group: every RemoteEngineConfig field the bench does not set."""
    from edge.remote import FIELD_DOCS, RemoteEngineConfig

    hints = typing.get_type_hints(RemoteEngineConfig)
    fields: dict[str, Any] = {
        "kind": (
            Literal[ENGINE_KINDS],
            _f(
                "remote",
                "`remote`: the robots run the remote engine through their site, the "
                "router and a replica (the system under test); `local`: the same "
                "checkpoint through the server's inference path inside the shard, "
                "no network (edge.rtc.RTCEngine with the fields below that apply: "
                "`buffer_time_s`, `rtc_enabled`, `execution_horizon`, `trim`, "
                "`latency_mode`, `latency_window`): the in-run baseline of task "
                "success (docs/scenarios.md \"Local baseline\")",
            ),
        ),
        "chunking": (
            Literal[tuple(CHUNKINGS)] | None,
            _f(
                None,
                "the chunking strategy by name, a preset of the fields it sets (a field given beside it wins, as "
                "`--set` does): `rtc` (`rtc_enabled: true`: each chunk guided by the executed prefix), `append` "
                "(`rtc_enabled: false`: appended unguided), `sync` (blocking: `rtc_enabled: false`, "
                f"`buffer_time_s: {SYNC_BUFFER_TIME_S:g}`, so it asks only when the queue is empty)",
                default_doc="the fields as given",
            ),
        ),
    }
    for f in dataclasses.fields(RemoteEngineConfig):
        if f.name in ENGINE_OWNED:
            continue
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        doc = FIELD_DOCS.get(f.name, "")
        if f.name == "fallback":
            doc += "; default: the robot type's safe fallback"
        fields[f.name] = (_engine_type(f.name, hints[f.name]), _f(default, doc))
    return create_model(
        "Engine",
        __config__=ConfigDict(extra="forbid"),
        __doc__="Overrides of edge.RemoteEngineConfig for every robot of the group.",
        **fields,
    )


# --- the sections --------------------------------------------------------------------------------


class Cameras(_Model):
    """Cameras of every robot of a group."""

    kind: CameraKind = _f(
        "synthetic",
        "`synthetic` (cheap, procedurally drawn), `rendered` (MuJoCo) or `observation` (a `gym` group's: the images "
        "its env puts in its observation, `gym.observation.cameras`)",
        enum=camera_kinds,
        default_doc="`synthetic`; a `gym` group with `observation.cameras`: `observation`",
    )
    names: Annotated[list[Str], AfterValidator(_unique)] = Field(
        default_factory=lambda: ["front"],
        min_length=1,
        json_schema_extra={"uniqueItems": True},
        description="camera names, each once; one image each per observation",
    )
    height: PosInt = _f(64, "image height in pixels")
    width: PosInt = _f(64, "image width in pixels")


class Shadow(_Model):
    """Golden parity: a local engine beside each robot's remote one, in lockstep (bench.fleet.parity)."""

    engine: Literal["rtc"] = _f("rtc", "the local engine compared with the remote one")
    max_delay_steps: NonNegInt = _f(0, "request n of both engines merges with a delay drawn from 0..N control steps")
    policy: Str | None = _f(
        None, "the local engine's checkpoint (another one must mismatch)", default_doc="the group's"
    )


class GymObservation(_Model):
    """How a gym env's observation becomes the policy's state and cameras."""

    state: list[Str] | None = _f(
        None,
        "the entries whose values, in order, make the policy's state: a key path into a Dict observation "
        "(`agent_pos`, `pixels.top`) with an optional index or slice into it flattened (`agent_pos[0:2]`), "
        "or a slice of a Box observation (`[0:5]`)",
        default_doc="a Box observation whole",
    )
    cameras: dict[Name, Str] = _f(
        {}, "camera name -> the key path of an (H, W, 3) uint8 image in the observation (camera kind `observation`)"
    )


class GymAction(_Model):
    """How the engine's action becomes `env.step`'s: `offset + scale * action`, clipped to the env's space."""

    names: list[Str] | None = _f(
        None,
        "one name per element of the env's 1-D Box action space; a served policy must act on these names",
        default_doc="`action[0]`, `action[1]`, ...",
    )
    scale: Num | list[Num] = _f(1.0, "a number or one per action", type_doc="number or list of numbers")
    offset: Num | list[Num] = _f(0.0, "a number or one per action", type_doc="number or list of numbers")
    clip: Bool = _f(True, "clip the env action to the env's action space")


class GymSuccess(_Model):
    """Task success of an episode: exactly one of `info`, `reward`, `terminated`."""

    info: Str | None = _f(None, "an `info` key whose value on the episode's last step is truthy on success")
    reward: Num | None = _f(None, "success when a step's reward reaches this threshold")
    terminated: Bool | None = _f(
        None, "`true`: success when the env terminates the episode (not truncated) without `failure_info`"
    )
    failure_info: Str | None = _f(None, "with `terminated`: an `info` key that marks a termination as failure")


class Gym(_Model):
    """A Gymnasium environment as the group's robot type (docs/robots.md), stepped one env per robot."""

    env: Str = _f(
        ...,
        "a registered env id (`gym_pusht/PushT-v0`; its package is imported when the namespace is not yet "
        "registered) or `module:callable` from your own installed package, returning a gymnasium.Env",
    )
    kwargs: dict = _f({}, "keyword arguments of `gymnasium.make` or of the callable")
    observation: GymObservation = Field(
        default_factory=GymObservation,
        description="the env's observation -> the policy's `state` and cameras (below)",
        json_schema_extra=Doc(default_doc="a Box observation as the state"),
    )
    action: GymAction = Field(
        default_factory=GymAction,
        description="the engine's action -> `env.step`'s (below)",
        json_schema_extra=Doc(default_doc="as is"),
    )
    fallback: Literal["hold", "zero"] | list[Num] = _f(
        "hold",
        "the command a robot applies when none arrives (the engine stalled, or before the first): `hold` the last "
        "one (zero before any), `zero`, or a fixed action in the engine's units; also the engine's default "
        "`fallback` (`hold`, or `zero` for `zero`)",
        type_doc="`hold` \\| `zero` or list of numbers",
    )
    success: GymSuccess | None = _f(None, "what counts as task success (below)", default_doc="`{info: is_success}`")
    episode_s: PosNum | None = _f(
        None,
        "longest episode; an episode also ends when the env says terminated or truncated",
        default_doc="the env's max_episode_steps / fps, else 10",
    )
    check_env: Bool = _f(
        True, "`bench validate` and `bench run` run gymnasium's `check_env` on the env (the mapping is always checked)"
    )


class Group(_Model):
    """Robots of one type, rate, cameras, site and engine."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"oneOf": [{"required": ["robot"]}, {"required": ["gym"]}]}
    )

    name: Name = _f(..., "used by `group[NAME].figure`, `states(group=NAME)` and `robot:NAME/i` fault targets")
    robot: RobotType | None = _f(
        None,
        "robot type from `bench.robots`, an installed plugin's entry point (`fleet_inference.robots`), or "
        "`module:Class` of your own RobotType subclass (docs/robots.md)",
        enum=robot_types,
        default_doc="**required** unless `gym` is given",
        doc_class=_RobotDoc,
    )
    gym: Gym | None = _f(None, "a Gymnasium env as the robot type, instead of `robot` (below, docs/robots.md)")
    count: PosInt = _f(..., "robots in the group")
    fps: PosNum | None = _f(
        None,
        "control rate in Hz; every tick calls the engine's notify_observation and get_action (a gym env steps once a tick)",
        default_doc="`30`; a gym env's `metadata.render_fps`",
    )
    site: Name = _f(..., "a key of `sites`: the network between these robots and the router")
    cameras: Cameras | None = _f(None, "cameras of every robot: `{kind, names, height, width}` (below)")
    policy: Str | None = _f(None, "checkpoint name under `bench/checkpoints/` or a path", default_doc="the robot type")
    model_id: Name | None = _f(
        None, "the model the robots ask for; some replica must serve it", default_doc="the policy's name"
    )
    task: Str = _f("", "task string sent with each observation")
    episode_s: PosNum | None = _f(
        None, "episode length; robot and engine `reset()` at its end", default_doc="the robot type's"
    )
    stagger_episodes: Bool = _f(
        False,
        "lengthen each robot's first episode by a seeded random part of one (0 to "
        "`episode_s`), so the group's episode boundaries spread instead of falling on "
        "the same tick: a real fleet does not start its episodes in lockstep, and one "
        "that does sends its episodes' first requests as a burst",
    )
    engine: dict = _f(
        {},
        "overrides of `edge.RemoteEngineConfig` fields (the engine table below); "
        "`connect_endpoints`, `action_names`, `state_dim`, `fps`, `cameras`, `model_id` and `task` "
        "are set by the bench from the robot, the site and the group, and refused here; every value is checked by the engine's own constructor at validate time",
    )
    shadow: Shadow | None = _f(
        None, "golden parity: a local engine in lockstep beside each robot's remote one (below, and `rtc_parity`)"
    )
    seeds_of: Name | None = _f(
        None,
        "seed robot `i` as robot `i` of the group NAME (same targets and start states, "
        "episode by episode): a `local` baseline paired with the remote group it is the "
        "baseline of",
        default_doc="its own",
    )


class Fleet(_Model):
    """The robots: shard processes and groups."""

    shards: Shards = _f(
        "auto",
        "fleet shard processes; robots are dealt round-robin over them. `auto`: sized from "
        "robots, fps and this host's cores (`bench.run.sizing`, docs/bench.md \"Sizing the "
        "bench to the host\"); an integer always wins",
        type_doc="`auto` or int > 0",
    )
    engine_workers: Literal["pool", "threads"] = _f(
        "pool",
        "how a shard hosts its robots' remote-engine network workers: `pool`, all on one shared thread "
        "(edge.remote.drive.WorkerPool); `threads`, a thread per engine, as on a robot. The worker's code is "
        "the same; `threads` puts a shard's hundred workers on its GIL beside the control loop",
    )
    groups: list[Group] = Field(..., min_length=1, description="robot groups (below)")


class Site(_Model):
    """The network between a site's robots and the router: its own proxy, its own toxics."""

    profile: Profile = _f("lan", "network profile from `chaos.profiles`", enum=profile_names)
    overrides: dict = _f(
        {},
        "toxic attributes merged into the profile: `TYPE.ATTRIBUTE: value` or "
        "`TYPE: {ATTRIBUTE: value}` (`chaos.profiles.TOXIC_ATTRIBUTES`), e.g. "
        "`bandwidth.rate: 250`; checked by `chaos.profiles` at validate time",
    )


SiteOrProfile = Annotated[Site, BeforeValidator(_site_shorthand)]


class Replica(_Model):
    """One policy-server process."""

    id: Name = _f(..., "replica id (key chunk); also the fault target `server:<id>`")
    checkpoint: Str = _f(
        ...,
        "checkpoint name under `bench/checkpoints/` or a path; it must exist when the file "
        "is validated or run: `bench train --robot TYPE` builds one",
    )
    model_id: Name | None = _f(None, "served model id", default_doc="the checkpoint's name")
    max_sessions: PosInt = _f(64, "sessions this replica accepts")
    emulated_latency: Any = _f(
        None,
        "emulated inference latency: ms or a mapping (the manifest's "
        "`emulated_latency`); reported as `inference_emulated`",
    )
    manifest: dict = _f({}, "manifest keys for this replica only (win over `servers.manifest`)")
    start_at: NonNegNum | None = _f(
        None,
        "seconds after t=0 at which this replica starts (a scale-up: a `start` fault at that time); "
        "none: it starts with the run",
    )


class Servers(_Model):
    """The policy-server replicas."""

    replicas: list[Replica] = Field(
        ..., min_length=1, description="server replicas, one `policy-server` process each (below)"
    )
    manifest: dict = _f({}, "manifest keys applied to every replica (nested or dotted, e.g. `scheduling.max_batch: 8`)")


class Formula(_Model):
    """Nominal inputs of design P10's capacity formula, printed beside the measured ones."""

    r_hz: PosNum | None = _f(None, "request rate of one robot")
    t_ms: PosNum | None = _f(None, "inference time")
    horizon: PosNum | None = _f(None, "execution horizon")
    dt_s: PosNum | None = _f(None, "control period")
    rtt_ms: PosNum | None = _f(None, "network round trip")


class Sweep(_Model):
    """Run the scenario once per value of one key."""

    key: Str = _f(..., "dotted key to vary, e.g. `sites.eu.profile` or `fleet.groups.eu.count`")
    values: list = Field(
        ...,
        min_length=1,
        description="one run per value, each once (in `capacity` mode "
        "increasing numbers); each run is checked as it will be built",
    )
    mode: Literal["runs", "capacity"] = _f(
        "runs",
        "`runs`: every run is judged by the assertions and the exit code is "
        "the worst run's. `capacity`: the values are load steps; the "
        "assertions are the target one step must hold; the knee is the last "
        "value before the first failing step, and the exit code is the "
        "verdict of the sweep's own `assertions`",
    )
    stop_after_failure: Bool | None = _f(None, "stop at the first failing value", default_doc="true in capacity mode")
    formula: Formula | None = _f(
        None,
        "`capacity` only (refused in `runs` mode): nominal inputs of P10's formula, printed beside the measured ones",
    )
    assertions: list[Str] = _f(
        [],
        "`capacity` only (refused in `runs` mode): expressions over the sweep figures `knee`, `first_failure`, `n_max`, "
        "`n_max_nominal`, `knee_ratio`, `knee_ratio_nominal`, `steps`, `knee_without_bench`, "
        "`first_failure_without_bench` (bench.evidence.capacity)",
    )


class Attacker(_Model):
    """A hostile client started during the run (bench.security.attacker)."""

    name: Name = _f(
        ...,
        "attacker name (log `logs/attacker-NAME.log`); with `own_cert` also its client uuid and "
        "certificate CN (an enrolled robot gone rogue)",
    )
    credentials: Literal["own_cert", "none", "foreign_ca"] = _f(
        "own_cert",
        "`own_cert` (a valid certificate of the fleet CA), `none` (no client certificate), `foreign_ca` "
        "(a certificate of another CA)",
    )
    target: Str | None = _f(None, "the victim robot, `GROUP/INDEX`", default_doc="robot 0 of the first group")
    at: NonNegNum = _f(
        2.0, "seconds after t=0 when the attacks start (they run one after the other, about 25 s for `all`)"
    )
    attacks: Literal["all"] | list[Str] = _f(
        "all",
        "attack words of `bench.security.attacker.ATTACKS`: with "
        "`own_cert` `subscribe_other_obs`, `publish_other_obs`, "
        "`subscribe_other_action`, `token_other_robot`, `token_server`, "
        "`open_other_session`, `reset_other_session`, "
        "`open_fabricated_sessions`, `flood`, `oversized`, `malformed`; "
        "otherwise `connect`; `all`: every attack of the credentials",
    )
    flood_hz: PosNum = _f(300, "observation rate of `flood` (on the rogue's own session)")
    flood_s: PosNum = _f(4.0, "length of `flood`")


class Fidelity(_Model):
    """The twin's own error budget: tolerances of the self-measurement every run makes (`summary.json` →
    `fidelity`, docs/bench.md "Fidelity"). Out of tolerance, a failed assertion reads `inconclusive`."""

    leg_error_ms: NonNegNum = _f(
        5.0, "a network leg's p99 of (delay the proxy applied - delay the profile asked) may reach this many ms ..."
    )
    leg_error_ratio: NonNegNum = _f(0.2, "... or this share of the leg's asked delay, whichever is larger")
    bandwidth_ratio: NonNegNum = _f(
        0.9, "a shaped leg (`bandwidth` toxic) delivers at least this share of its asked rate while it has data queued"
    )
    host_late_ratio: NonNegNum = _f(0.01, "a shard's share of ticks made late by the bench host itself")
    loop_overrun_ratio: NonNegNum = _f(0.05, "a shard's share of loop slots that ran past their budget")
    scheduler_wait_ms: NonNegNum = _f(
        250.0, "a shard's worst wait for a core or its GIL in one loop slot (slot wall time - its CPU time)"
    )
    forward_ratio: NonNegNum = _f(
        2.0,
        "a replica's forward-pass p50 over its own unloaded forward time at the same "
        "batch size, measured when it started ...",
    )
    forward_excess_ms: NonNegNum = _f(
        2.0,
        "... judged only when the forward pass is also this many ms (p50) over that "
        "time: a cheap pass doubles from scheduling noise no round trip notices",
    )
    other_load_shift: NonNegNum = _f(
        0.05,
        "where an assertion compares the run's first and last windows (a `_drift` "
        "figure), the host's CPU used by processes outside the run may differ by "
        "at most this share of all cores between the two windows",
    )
    speed_shift: NonNegNum = _f(
        0.15,
        "... and the host's own speed (the in-run speed probe's mean, CPU time) may "
        "differ by at most this share between them: a VM in a slow phase lengthens "
        "every CPU step of a round trip",
    )


class Cluster(_Model):
    """Where a run's processes go under `bench run --cluster ray` (docs/cluster.md); ignored by local runs."""

    placement: Literal["spread", "pack"] = _f(
        "spread",
        "`spread`: shards and replicas over as many nodes as Ray can "
        "(its SPREAD strategy); `pack`: as few nodes as fit them",
    )
    shard_cpus: PosNum = _f(1.0, "CPUs Ray reserves for each fleet shard")
    replica_cpus: PosNum = _f(1.0, "CPUs Ray reserves for each server replica")
    replica_gpus: NonNegNum = _f(
        1.0, "GPUs Ray reserves for each replica whose `model.device` is cuda (0 for a CPU replica, whatever this says)"
    )
    routers: Literal["per_node", "driver"] | None = _f(
        None,
        "`per_node`: a Zenoh router on every node that hosts a shard or a replica, joined to the driver's and "
        "to each other (a mesh), and the site proxies on every node with shards, each in front of its node's "
        "router; `driver`: one router and the site proxies on the driver host, every link crossing to it "
        "(docs/cluster.md). With `security: mtls` every node router has its own key and a `node-router` "
        "certificate and enforces the run's access rules (docs/security.md)",
        default_doc="`per_node`",
    )


class Record(_Model):
    """What a run records beside its records: every robot's episodes as LeRobotDatasets, one per group
    (bench.run.dataset, docs/bench.md "Record a run as a LeRobotDataset"); `bench run --record-dataset`."""

    dataset: Bool = _f(
        False,
        "record every robot's episodes as a LeRobotDataset (format v3.0), one per group: each tick's state, the "
        "command the robot executed, the group's task and the provenance of its action (session, seq, episode, "
        "chunk, queue wait, inference time); needs lerobot 0.4.4 where the run's runner runs",
    )
    cameras: Bool = _f(
        True, "with `dataset`: the frames of a group's cameras as image features (a group without cameras has none)"
    )
    dir: Str | None = _f(
        None,
        "where the datasets go, one directory per group (`DIR/<group>/`); it must not exist yet",
        default_doc="the run directory's `dataset/`",
    )


class ScenarioFile(_Model):
    """A scenario: a fleet, its networks, its servers, a fault timeline and the assertions that judge it."""

    name: Name = _f(..., "scenario name (letters, digits, `_ . -`); the report folder `reports/<name>/`")
    description: Str = _f("", "one or two sentences shown by `bench list`")
    duration_s: PosNum = _f(..., "measured run length in seconds (after warmup_s)")
    warmup_s: NonNegNum = _f(
        5.0, "robots tick and connect for this long before t=0; not measured; the fault timeline starts at t=0"
    )
    seed: Int = _f(0, "robot `i` of group `g` is seeded from `(seed, g, i)`")
    fleet: Fleet = _f(..., "the robots: shards and groups")
    sites: dict[Name, SiteOrProfile] = Field(
        ...,
        min_length=1,
        description=(
            "site name -> network profile between its robots and the router: a mapping, or just the profile name"
        ),
    )
    servers: Servers = _f(..., "the policy-server replicas")
    faults: list[dict] = _f([], "the chaos timeline (`chaos.timeline`, below); times in seconds from t=0")
    assertions: list[Str] = _f(
        [], "expressions over the run's figures (below, `bench figures`); all must hold for `pass`"
    )
    sweep: Sweep | None = _f(None, "`{key, values}`: run the scenario once per value of one key (below)")
    security: Literal["tcp", "mtls"] = _f(
        "tcp",
        "`tcp`: plain links, no router rules; `mtls`: a run PKI under "
        "`<run>/pki/` (keys 0600), TLS links, one certificate per robot (CN = its "
        "client uuid `GROUP-INDEX`), router access rules generated from the fleet "
        "(docs/security.md)",
    )
    attackers: list[Attacker] = _f([], "hostile clients started during the run (below)")
    fidelity: Fidelity = Field(
        default_factory=Fidelity,
        description=(
            "tolerances of the twin's self-measurement (below); out of tolerance, a failed assertion makes the "
            "verdict `inconclusive` (exit 3) instead of `fail`"
        ),
        json_schema_extra=Doc(default_doc="the defaults below"),
    )
    record: Record = Field(
        default_factory=Record,
        description="what the run records beside its records: its episodes as LeRobotDatasets (below)",
        json_schema_extra=Doc(default_doc="nothing"),
    )
    cluster: Cluster = Field(
        default_factory=Cluster,
        description=("placement on a Ray cluster under `bench run --cluster ray` (below); local runs ignore it"),
        json_schema_extra=Doc(default_doc="the defaults below"),
    )


SECTIONS: list[tuple[str, type[BaseModel]]] = [
    ("top level", ScenarioFile),
    ("fleet", Fleet),
    ("fleet.groups[]", Group),
    ("fleet.groups[].cameras", Cameras),
    ("fleet.groups[].shadow", Shadow),
    ("fleet.groups[].gym", Gym),
    ("fleet.groups[].gym.observation", GymObservation),
    ("fleet.groups[].gym.action", GymAction),
    ("fleet.groups[].gym.success", GymSuccess),
    ("sites.<name>", Site),
    ("servers", Servers),
    ("servers.replicas[]", Replica),
    ("sweep", Sweep),
    ("sweep.formula", Formula),
    ("attackers[]", Attacker),
    ("fidelity", Fidelity),
    ("record", Record),
    ("cluster", Cluster),
]


def json_schema() -> dict:
    """The scenario language as JSON Schema (draft 2020-12), for editors (docs/scenarios.md "Editor support").

    It checks each key's shape, type, bounds and the names registries know (robot types, profiles,
    engine choices); what needs several keys or the disk (sites referenced, models served, engine
    values the engine refuses, checkpoints, assertions) only `bench validate` checks."""
    from wire.configerrors import finite

    schema = finite(ScenarioFile.model_json_schema())
    defs = schema.setdefault("$defs", {})
    try:
        engine = finite(engine_model().model_json_schema())
    except ImportError:  # no edge package: any mapping
        engine = None
    if engine is not None:
        defs.update(engine.pop("$defs", {}))
        defs["Engine"] = engine
        defs["Group"]["properties"]["engine"] = {
            "$ref": "#/$defs/Engine",
            "description": defs["Group"]["properties"]["engine"].get("description", ""),
        }
    # `eu: wan_50ms` is short for `eu: {profile: wan_50ms}`
    sites = schema["properties"]["sites"]
    for pattern, site in list(sites.get("patternProperties", {}).items()):
        sites["patternProperties"][pattern] = {"anyOf": [{"type": "string", "enum": list(profile_names())}, site]}
    sites["additionalProperties"] = False  # a site name that is not a name
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "fleet-inference bench scenario"
    return schema
