"""Scenario files: the schema, its validation, and the typed `Scenario` the runner consumes.

Owns the meaning of every key a scenario YAML may hold (the tables `SCHEMA_*` below are the single
source; docs/scenarios.md describes the same keys). Invariant: `load_scenario` either returns a
fully checked `Scenario` or raises `ScenarioError` whose message starts ``file:line: key.path:``;
unknown keys are always rejected, with the known keys listed and the closest one suggested.

Checks that need other packages (engine fields, network profiles, fault timeline, assertion
figures) are done through those packages when they are importable, so the schema stays in step
with the code that consumes it.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from wire import yamlines
from wire.suggest import did_you_mean
from wire.yamlines import LineDict, LineList

REPO_ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTS_DIR = REPO_ROOT / "bench" / "checkpoints"
SCENARIOS_DIR = REPO_ROOT / "scenarios"

ROBOT_TYPES_FALLBACK = ("arm", "reacher", "base")
CAMERA_KINDS = ("synthetic", "rendered")
PROFILES_FALLBACK = ("lan", "wifi", "lte", "wan_50ms", "satellite", "congested")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class ScenarioError(ValueError):
    """A scenario problem; `str()` is ``file:line: key.path: message``."""

    def __init__(self, source: str, line: int, path: str, message: str):
        self.source, self.line, self.path, self.message = source, line, path, message
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {path}: {message}" if path else f"{where}: {message}")


# --- schema tables: key -> (kind, default, doc). `REQUIRED` marks keys without a default. -------

REQUIRED = object()

SCHEMA_TOP = {
    "name": ("name", REQUIRED, "scenario name; the report folder reports/<name>/"),
    "description": ("str", "", "one or two sentences shown by `bench list`"),
    "duration_s": ("pos_number", REQUIRED, "measured run length in seconds (after warmup_s)"),
    "warmup_s": ("nonneg_number", 5.0, "robots tick and connect for this long before t=0; not measured"),
    "seed": ("int", 0, "base seed: robot i of group g gets a seed derived from (seed, g, i)"),
    "fleet": ("mapping", REQUIRED, "the robots: shards and groups"),
    "sites": ("mapping", REQUIRED, "site name -> network profile between its robots and the router"),
    "servers": ("mapping", REQUIRED, "the policy-server replicas"),
    "faults": ("list", [], "the chaos timeline (see chaos.timeline); times relative to t=0"),
    "assertions": ("list", [], "expressions over the run's figures; all must hold for verdict pass"),
    "sweep": ("mapping", None, "optional: run the scenario once per value of one key"),
    "security": ("security_mode", "tcp", "tcp: plain links, no router rules; mtls: a run PKI (bench.security.pki), TLS links, "
                                         "per-robot certificates and router access rules generated from the fleet"),
    "attackers": ("list", [], "hostile clients started during the run (bench.security.attacker): a rogue robot with its own "
                              "valid certificate, intruders without one or with another CA's"),
}

SCHEMA_ATTACKER = {
    "name": ("name", REQUIRED, "attacker name (its log is logs/attacker-NAME.log)"),
    "credentials": ("credentials", "own_cert", "own_cert (an enrolled robot gone rogue) | none | foreign_ca"),
    "target": ("str", None, "victim robot as GROUP/INDEX; default: robot 0 of the first group"),
    "at": ("nonneg_number", 2.0, "seconds after t=0 when the attacks start"),
    "attacks": ("any", "all", "attack words (bench.security.attacker.ATTACKS) or `all` for every attack of these credentials"),
    "flood_hz": ("pos_number", 300, "observation rate of the flood attack"),
    "flood_s": ("pos_number", 4.0, "length of the flood attack"),
}

SCHEMA_FLEET = {
    "shards": ("pos_int", 1, "fleet shard processes; robots are dealt round-robin over them"),
    "groups": ("list", REQUIRED, "robot groups (each: same type, fps, cameras, site, engine)"),
}

SCHEMA_GROUP = {
    "name": ("name", REQUIRED, "group name; used by group[NAME].figure and states(group=NAME)"),
    "robot": ("robot_type", REQUIRED, "robot type from bench.robots (arm, reacher, base)"),
    "count": ("pos_int", REQUIRED, "number of robots"),
    "fps": ("pos_number", 30, "control rate in Hz; every tick calls the engine"),
    "site": ("name", REQUIRED, "a key of `sites`: the network between these robots and the router"),
    "cameras": ("mapping", None, "cameras of every robot: kind, names, height, width"),
    "policy": ("str", None, "checkpoint name under bench/checkpoints/ or a path; default: the robot type"),
    "model_id": ("name", None, "model the robots ask for; default: the policy's model id"),
    "task": ("str", "", "task string sent with each observation"),
    "episode_s": ("pos_number", None, "episode length; default the robot type's; robot and engine reset after it"),
    "stagger_episodes": ("bool", False, "lengthen each robot's first episode by a random part of one, so the "
                         "group's episodes do not all start on the same tick"),
    "engine": ("mapping", {}, "RemoteEngineConfig overrides (any field of edge.RemoteEngineConfig)"),
    "shadow": ("mapping", None, "golden parity: a local engine beside each robot's remote one, in lockstep (bench.fleet.parity)"),
}

SCHEMA_SHADOW = {
    "engine": ("shadow_engine", "rtc", "the local engine compared with the remote one (rtc)"),
    "max_delay_steps": ("nonneg_int", 0, "request n of both engines merges with a delay drawn from 0..N control steps"),
    "policy": ("str", None, "checkpoint of the local engine; default the group's (another one must mismatch)"),
}

SCHEMA_CAMERAS = {
    "kind": ("camera_kind", "synthetic", "synthetic (cheap, procedurally drawn) or rendered (MuJoCo)"),
    "names": ("str_list", ["front"], "camera names; one image each per observation"),
    "height": ("pos_int", 64, "image height in pixels"),
    "width": ("pos_int", 64, "image width in pixels"),
}

SCHEMA_SITE = {
    "profile": ("profile", "lan", "network profile from chaos.profiles"),
    "overrides": ("mapping", {}, "toxic attribute overrides merged into the profile"),
}

SCHEMA_SERVERS = {
    "replicas": ("list", REQUIRED, "server replicas, one policy-server process each"),
    "manifest": ("mapping", {}, "manifest keys applied to every replica (dotted or nested)"),
}

SCHEMA_REPLICA = {
    "id": ("name", REQUIRED, "replica id (key chunk); also the fault target server:<id>"),
    "checkpoint": ("str", REQUIRED, "checkpoint name under bench/checkpoints/ or a path"),
    "model_id": ("name", None, "served model id; default: the checkpoint's model id"),
    "max_sessions": ("pos_int", 64, "sessions this replica accepts"),
    "emulated_latency": ("any", None, "server-side emulated inference latency (manifest emulated_latency)"),
    "manifest": ("mapping", {}, "manifest keys for this replica only (override servers.manifest)"),
}

SCHEMA_SWEEP = {
    "key": ("str", REQUIRED, "dotted key to vary, e.g. sites.eu.profile or fleet.groups.0.count"),
    "values": ("list", REQUIRED, "one run per value"),
    "mode": ("sweep_mode", "runs", "runs: every run is judged; capacity: runs are load steps, the verdict is the sweep's assertions"),
    "stop_after_failure": ("bool", None, "stop at the first failing value (default: true in capacity mode)"),
    "formula": ("mapping", None, "capacity: nominal P10 inputs r_hz, t_ms, horizon, dt_s, rtt_ms"),
    "assertions": ("list", [], "capacity: expressions over knee, n_max, knee_ratio, ... (bench.evidence.capacity)"),
}

FAULT_TARGET_RE = re.compile(r"^(robot|site|server):[^\s]+$|^router$")


# --- typed result ----------------------------------------------------------------------------


@dataclass
class Cameras:
    kind: str = "synthetic"
    names: list[str] = field(default_factory=lambda: ["front"])
    height: int = 64
    width: int = 64


@dataclass
class Group:
    name: str
    robot: str
    count: int
    fps: float
    site: str
    cameras: Cameras | None
    policy: str
    model_id: str
    task: str
    episode_s: float
    engine: dict
    shadow: dict | None = None
    line: int = 0
    stagger_episodes: bool = False


@dataclass
class Site:
    name: str
    profile: str
    overrides: dict
    line: int = 0


@dataclass
class Replica:
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
    shards: int
    groups: list[Group]
    sites: dict[str, Site]
    replicas: list[Replica]
    server_manifest: dict
    faults: list[dict]
    assertions: list[AssertionSpec]
    sweep: dict | None
    security: str = "tcp"
    attackers: list = field(default_factory=list)
    source: str = "<string>"
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def robots(self) -> int:
        return sum(g.count for g in self.groups)

    def group(self, name: str) -> Group:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(name)


# --- value checks: kind word -> checker returning the value or raising ValueError ----------------


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _name(v):
    if not isinstance(v, str) or not _NAME_RE.match(v):
        raise ValueError(f"{v!r} is not a name (letters, digits, _ . -; starts with a letter or digit)")
    return v


def _robot_type(v):
    known = robot_types()
    if v not in known:
        raise ValueError(f"unknown robot type {v!r}; known: {', '.join(known)}")
    return v


def _profile(v):
    known = profile_names()
    if v not in known:
        raise ValueError(f"unknown network profile {v!r}; known: {', '.join(known)}")
    return v


def _choice(options):
    def check(v):
        if v not in options:
            raise ValueError(f"{v!r} is not one of {', '.join(options)}")
        return v
    return check


def _typed(pred: Callable[[Any], bool], what: str):
    def check(v):
        if not pred(v):
            raise ValueError(f"expected {what}, got {type(v).__name__} {v!r}")
        return v
    return check


KINDS: dict[str, Callable[[Any], Any]] = {
    "any": lambda v: v,
    "str": _typed(lambda v: isinstance(v, str), "a string"),
    "name": _name,
    "int": _typed(lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "pos_int": _typed(lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0, "a positive integer"),
    "pos_number": _typed(lambda v: _is_number(v) and v > 0, "a positive number"),
    "nonneg_number": _typed(lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    "nonneg_int": _typed(lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an integer >= 0"),
    "shadow_engine": lambda v: _choice(("rtc",))(v),
    "sweep_mode": lambda v: _choice(("runs", "capacity"))(v),
    "bool": _typed(lambda v: isinstance(v, bool), "true or false"),
    "mapping": _typed(lambda v: isinstance(v, dict), "a mapping"),
    "list": _typed(lambda v: isinstance(v, list), "a list"),
    "str_list": _typed(lambda v: isinstance(v, list) and v and all(isinstance(x, str) and x for x in v),
                       "a non-empty list of strings"),
    "robot_type": _robot_type,
    "camera_kind": lambda v: _choice(camera_kinds())(v),
    "profile": _profile,
    "security_mode": _choice(("tcp", "mtls")),
    "credentials": _choice(("own_cert", "none", "foreign_ca")),
}


# --- discovery of names other packages own -----------------------------------------------------


def robot_types() -> tuple[str, ...]:
    try:
        from bench import robots
        reg = getattr(robots, "ROBOT_TYPES", None) or getattr(robots, "REGISTRY", None)
        if reg:
            return tuple(sorted(reg))
    except Exception:  # bench.robots is another package; its absence must not break validation
        pass
    return ROBOT_TYPES_FALLBACK


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


# --- the reader --------------------------------------------------------------------------------


class _Section:
    """Reads one mapping against one schema table, with errors naming file, line and key path."""

    def __init__(self, source: str, data: Any, path: str, schema: dict, line: int = 0):
        self.source, self.path, self.schema = source, path, schema
        if not isinstance(data, dict):
            raise ScenarioError(source, getattr(data, "line", line), path or "(top level)",
                                f"expected a mapping, got {type(data).__name__}")
        self.data = data
        for key in data:
            if key not in schema:
                suggestion = did_you_mean(key, schema)
                raise ScenarioError(source, self.line_of(key), self.key_path(key),
                                    f"unknown key{suggestion}; known keys: {', '.join(schema)}")

    def line_of(self, key) -> int:
        return self.data.line_of(key) if isinstance(self.data, LineDict) else 0

    def key_path(self, key) -> str:
        return f"{self.path}.{key}" if self.path else str(key)

    def fail(self, key, message: str) -> ScenarioError:
        return ScenarioError(self.source, self.line_of(key), self.key_path(key), message)

    def get(self, key):
        kind, default, _doc = self.schema[key]
        if key not in self.data or self.data[key] is None:
            if default is REQUIRED:
                raise ScenarioError(self.source, getattr(self.data, "line", 0), self.key_path(key),
                                    "required key is missing")
            return copy.deepcopy(default)
        try:
            return KINDS[kind](self.data[key])
        except ValueError as exc:
            raise self.fail(key, str(exc)) from None


def _item_line(lst, i: int) -> int:
    return lst.line_of(i) if isinstance(lst, LineList) else 0


# --- loading -----------------------------------------------------------------------------------


def load_scenario(path: str | Path, *, check_checkpoints: bool = False) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScenarioError(str(path), 0, "", f"cannot read the file: {exc.strerror or exc}") from None
    return parse_scenario(text, source=str(path), check_checkpoints=check_checkpoints)


def parse_scenario(text: str, source: str = "<string>", *, check_checkpoints: bool = False) -> Scenario:
    try:
        data = yamlines.load(text)
    except yamlines.YamlError as exc:
        raise ScenarioError(source, exc.line, "", f"not valid YAML: {exc.problem}") from None
    if data is None:
        raise ScenarioError(source, 1, "", "the file is empty; a scenario needs name, duration_s, fleet, sites, servers")
    scenario = build_scenario(data, source)
    if check_checkpoints:
        missing = missing_checkpoints(scenario)
        if missing:
            raise ScenarioError(source, 0, "", missing[0])
    return scenario


def build_scenario(data: Any, source: str = "<string>") -> Scenario:
    top = _Section(source, data, "", SCHEMA_TOP)
    name = top.get("name")
    sites = _read_sites(source, top)
    fleet = _Section(source, top.get("fleet"), "fleet", SCHEMA_FLEET, top.line_of("fleet"))
    groups = _read_groups(source, fleet, sites)
    server_sec = _Section(source, top.get("servers"), "servers", SCHEMA_SERVERS, top.line_of("servers"))
    replicas = _read_replicas(source, server_sec)
    served = {r.model_id for r in replicas}
    for g in groups:
        if g.model_id not in served:
            raise ScenarioError(source, g.line, f"fleet.groups[{g.name}].model_id",
                                f"no server replica serves model {g.model_id!r}; served: {', '.join(sorted(served))}")
    faults = _read_faults(source, top, sites, replicas, groups)
    assertions = _read_assertions(source, top, groups)
    sweep = _read_sweep(source, top, data)
    attackers = _read_attackers(source, top, groups)
    return Scenario(
        name=name, description=top.get("description").strip(), duration_s=float(top.get("duration_s")),
        warmup_s=float(top.get("warmup_s")), seed=top.get("seed"), shards=fleet.get("shards"), groups=groups,
        sites=sites, replicas=replicas, server_manifest=server_sec.get("manifest"), faults=faults,
        assertions=assertions, sweep=sweep, source=source, raw=data, security=top.get("security"),
        attackers=attackers,
    )


def _read_sites(source: str, top: _Section) -> dict[str, Site]:
    raw = top.get("sites")
    if not raw:
        raise top.fail("sites", "needs at least one site, e.g. `lab: {profile: lan}`")
    sites = {}
    for name, body in raw.items():
        path = f"sites.{name}"
        line = raw.line_of(name) if isinstance(raw, LineDict) else 0
        try:
            _name(name)
        except ValueError as exc:
            raise ScenarioError(source, line, path, str(exc)) from None
        if isinstance(body, str):  # shorthand `eu: wan_50ms`
            body = {"profile": body}
        sec = _Section(source, body, path, SCHEMA_SITE, line)
        sites[name] = Site(name=name, profile=sec.get("profile"), overrides=sec.get("overrides"), line=line)
    return sites


def _read_groups(source: str, fleet: _Section, sites: dict[str, Site]) -> list[Group]:
    raw = fleet.get("groups")
    if not raw:
        raise fleet.fail("groups", "needs at least one group")
    groups: list[Group] = []
    engine_fields = engine_field_names()
    for i, body in enumerate(raw):
        path = f"fleet.groups[{i}]"
        line = _item_line(raw, i)
        sec = _Section(source, body, path, SCHEMA_GROUP, line)
        gname = sec.get("name")
        if any(g.name == gname for g in groups):
            raise sec.fail("name", f"group name {gname!r} is used twice; group names must be unique")
        site = sec.get("site")
        if site not in sites:
            raise sec.fail("site", f"unknown site {site!r}; sites: {', '.join(sites)}")
        cams = None
        if sec.data.get("cameras") is not None:
            csec = _Section(source, sec.get("cameras"), f"{path}.cameras", SCHEMA_CAMERAS, sec.line_of("cameras"))
            cams = Cameras(kind=csec.get("kind"), names=list(csec.get("names")), height=csec.get("height"),
                           width=csec.get("width"))
        engine = sec.get("engine")
        if engine_fields is not None:
            for key in engine:
                if key not in engine_fields:
                    esec_line = engine.line_of(key) if isinstance(engine, LineDict) else sec.line_of("engine")
                    raise ScenarioError(source, esec_line, f"{path}.engine.{key}",
                                        "not a RemoteEngineConfig field" + did_you_mean(key, sorted(engine_fields))
                                        + f"; fields: {', '.join(sorted(engine_fields))}")
        for owned in ("connect_endpoints", "action_names", "state_dim", "fps", "cameras"):
            if owned in engine:
                raise ScenarioError(source, engine.line_of(owned) if isinstance(engine, LineDict) else line,
                                    f"{path}.engine.{owned}",
                                    "set by the bench from the robot, its site and the group; remove it")
        policy = sec.get("policy") or sec.get("robot")
        shadow = None
        if sec.data.get("shadow") is not None:
            ssec = _Section(source, sec.get("shadow"), f"{path}.shadow", SCHEMA_SHADOW, sec.line_of("shadow"))
            shadow = {"engine": ssec.get("engine"), "max_delay_steps": ssec.get("max_delay_steps"),
                      "policy": ssec.get("policy") or policy}
        groups.append(Group(
            name=gname, robot=sec.get("robot"), count=sec.get("count"), fps=float(sec.get("fps")), site=site,
            cameras=cams, policy=policy, model_id=sec.get("model_id") or checkpoint_model_id(policy),
            task=sec.get("task"), episode_s=_episode_s(sec.get("episode_s"), sec.get("robot")), engine=dict(engine),
            shadow=shadow, line=line, stagger_episodes=bool(sec.get("stagger_episodes")),
        ))
    return groups


def _episode_s(value, robot: str) -> float:
    if value is not None:
        return float(value)
    try:
        from bench.robots import robot_type

        return float(robot_type(robot).episode_s)
    except Exception:
        return 10.0


def _read_replicas(source: str, sec: _Section) -> list[Replica]:
    raw = sec.get("replicas")
    if not raw:
        raise sec.fail("replicas", "needs at least one replica")
    out: list[Replica] = []
    for i, body in enumerate(raw):
        path = f"servers.replicas[{i}]"
        rsec = _Section(source, body, path, SCHEMA_REPLICA, _item_line(raw, i))
        rid = rsec.get("id")
        if any(r.id == rid for r in out):
            raise rsec.fail("id", f"replica id {rid!r} is used twice")
        ckpt = rsec.get("checkpoint")
        out.append(Replica(
            id=rid, checkpoint=ckpt, model_id=rsec.get("model_id") or checkpoint_model_id(ckpt),
            max_sessions=rsec.get("max_sessions"), emulated_latency=rsec.get("emulated_latency"),
            manifest=dict(rsec.get("manifest")), line=_item_line(raw, i),
        ))
    return out


def _read_attackers(source: str, top: _Section, groups: list[Group]) -> list[dict]:
    raw = top.get("attackers")
    out: list[dict] = []
    try:
        from bench.security.attacker import attacks_for
    except Exception:  # the attacker module needs zenoh; validation without it checks names only
        attacks_for = None
    for i, body in enumerate(raw):
        path = f"attackers[{i}]"
        sec = _Section(source, body, path, SCHEMA_ATTACKER, _item_line(raw, i))
        a = {k: sec.get(k) for k in SCHEMA_ATTACKER}
        if any(o["name"] == a["name"] for o in out):
            raise sec.fail("name", f"attacker name {a['name']!r} is used twice")
        target = a["target"] or f"{groups[0].name}/0"
        gname, _, idx = target.partition("/")
        match = [g for g in groups if g.name == gname]
        if not match or not idx.isdigit() or int(idx) >= match[0].count:
            raise sec.fail("target", f"{target!r} is not GROUP/INDEX of a robot; groups: "
                                     + ", ".join(f"{g.name} (0..{g.count - 1})" for g in groups))
        a["target"] = target
        if float(a["at"]) > float(top.get("duration_s")):
            raise sec.fail("at", f"{a['at']} s is after the end of the run ({top.get('duration_s')} s)")
        if attacks_for is not None:
            known = attacks_for(a["credentials"])
            words = known if a["attacks"] == "all" else a["attacks"]
            if not isinstance(words, list) or not words or any(w not in known for w in words):
                raise sec.fail("attacks", f"{a['attacks']!r}: give `all` or a list of attacks for credentials "
                                          f"{a['credentials']}: {', '.join(known)}")
            a["attacks"] = list(words)
        out.append(a)
    return out


def _read_faults(source, top: _Section, sites, replicas, groups) -> list[dict]:
    raw = top.get("faults")
    targets_known = {"router"} | {f"site:{s}" for s in sites} | {f"server:{r.id}" for r in replicas}
    for i, item in enumerate(raw):
        line = _item_line(raw, i)
        path = f"faults[{i}]"
        if not isinstance(item, dict):
            raise ScenarioError(source, line, path, f"expected a mapping, got {type(item).__name__}")
        target = item.get("target")
        if isinstance(target, str) and FAULT_TARGET_RE.match(target):
            if target.startswith("robot:"):
                _check_robot_target(source, item.line_of("target") if isinstance(item, LineDict) else line,
                                    f"{path}.target", target, groups)
            elif target not in targets_known:
                raise ScenarioError(source, item.line_of("target") if isinstance(item, LineDict) else line,
                                    f"{path}.target", f"unknown target {target!r}; known: {', '.join(sorted(targets_known))}, robot:<group>[/<index>]")
        t = item.get("at", item.get("t"))
        duration = float(top.get("duration_s"))
        if _is_number(t) and t > duration:
            raise ScenarioError(source, line, f"{path}.at", f"fault at {t}s is after the end of the run ({duration}s)")
    _check_timeline_with_chaos(source, raw)
    return [dict(item) for item in raw]


def _check_robot_target(source, line, path, target, groups):
    body = target.split(":", 1)[1]
    gname, _, idx = body.partition("/")
    for g in groups:
        if g.name == gname:
            if idx and (not idx.isdigit() or int(idx) >= g.count):
                raise ScenarioError(source, line, path, f"robot index {idx!r} is not in 0..{g.count - 1} of group {gname!r}")
            return
    raise ScenarioError(source, line, path, f"unknown group {gname!r} in {target!r}; groups: {', '.join(g.name for g in groups)}")


def _check_timeline_with_chaos(source: str, raw: list) -> None:
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
        line = _item_line(raw, int(m.group(1))) if m else getattr(raw, "line", 0)
        raise ScenarioError(source, line, "faults", msg) from None


def _read_assertions(source: str, top: _Section, groups: list[Group]) -> list[AssertionSpec]:
    from bench.scenario import assertions as asserts
    raw = top.get("assertions")
    out = []
    for i, expr in enumerate(raw):
        line = _item_line(raw, i)
        if not isinstance(expr, str):
            raise ScenarioError(source, line, f"assertions[{i}]", "an assertion is an expression string; quote it")
        try:
            asserts.check_expression(expr, groups=[g.name for g in groups])
        except asserts.AssertionSyntaxError as exc:
            raise ScenarioError(source, line, f"assertions[{i}]", str(exc)) from None
        out.append(AssertionSpec(expression=expr, line=line))
    return out


def _read_sweep(source: str, top: _Section, data: dict) -> dict | None:
    raw = top.get("sweep")
    if raw is None:
        return None
    sec = _Section(source, raw, "sweep", SCHEMA_SWEEP, top.line_of("sweep"))
    key, values = sec.get("key"), sec.get("values")
    if not values:
        raise sec.fail("values", "needs at least one value")
    try:
        get_dotted(data, key)
    except KeyError as exc:
        raise sec.fail("key", f"{key!r} does not name a key of this scenario ({exc.args[0]})") from None
    if key.split(".")[0] in ("sweep", "name"):
        raise sec.fail("key", "sweep cannot vary `sweep` or `name`")
    mode = sec.get("mode")
    stop = sec.get("stop_after_failure")
    formula = sec.get("formula")
    if formula:
        fsec = _Section(source, formula, "sweep.formula", {k: ("pos_number", None, "") for k in
                                                          ("r_hz", "t_ms", "horizon", "dt_s", "rtt_ms")},
                        sec.line_of("formula"))
        formula = {k: fsec.get(k) for k in fsec.data}
    asserts = sec.get("assertions")
    from bench.scenario.assertions import AssertionSyntaxError
    from bench.scenario.sweeps import check_sweep_expression

    for i, expr in enumerate(asserts):
        try:
            check_sweep_expression(str(expr))
        except AssertionSyntaxError as exc:
            raise ScenarioError(source, _item_line(asserts, i), f"sweep.assertions[{i}]", str(exc)) from None
    return {"key": key, "values": list(values), "mode": mode,
            "stop_after_failure": (mode == "capacity") if stop is None else stop,
            "formula": dict(formula) if formula else None, "assertions": [str(a) for a in asserts]}


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
    msgs = []
    seen = set()
    for r in scenario.replicas:
        d = checkpoint_dir(r.checkpoint)
        if d in seen:
            continue
        seen.add(d)
        if not (d / "config.json").is_file() or not (d / "model.safetensors").is_file():
            robot = next((g.robot for g in scenario.groups if g.model_id == r.model_id), r.checkpoint)
            msgs.append(f"servers.replicas[{r.id}].checkpoint: checkpoint {str(d)!r} is missing; "
                        f"build it with: bench train --robot {robot}")
    return msgs


def list_scenarios(directory: Path = SCENARIOS_DIR) -> list[tuple[Path, str, str]]:
    """(path, name, description or error) for every shipped scenario file."""
    out = []
    for p in sorted(directory.glob("**/*.yaml")):  # sub-folders too: scenarios/ci/ holds the CI chaos jobs
        try:
            s = load_scenario(p)
            out.append((p, s.name, s.description))
        except ScenarioError as exc:
            out.append((p, p.stem, f"INVALID: {exc}"))
    return out
