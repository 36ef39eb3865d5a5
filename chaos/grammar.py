"""The fault timeline's grammar: the events, the actions each target family takes with their parameters, the parser.

    faults: [{at, target, action, duration?, params...}]      (YAML, times in s from t=0)
        │ parse_timeline: every entry checked, errors "faults[i]: ..."
        ▼
    [FaultEvent]  (run by chaos.timeline.TimelineRunner against `Actuators`)

Targets: `site:NAME`, `server:REPLICA_ID`, `router`, `robot:GROUP`, `robot:GROUP/INDEX`,
`group:NAME` (= `robot:NAME`, the whole group). Actions are registered in `ACTIONS` by
(target family, action word), each with how it is applied and undone on the `Actuators`;
docs/chaos-faults.md tables them. Invariant: `parse_timeline` accepts an entry only if the runner
can execute it.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from chaos import profiles
from wire.suggest import did_you_mean

# --- the events --------------------------------------------------------------------------------

FAMILY_OF_KIND = {"site": "site", "server": "process", "router": "process", "robot": "robot"}
_TARGET_RE = re.compile(
    r"^(?:(?P<kind>site|server|robot|group):(?P<name>[^\s/:]+)(?:/(?P<index>\S+))?|(?P<router>router)(?P<hub>:hub)?)$"
)
TARGET_FORMS = "site:NAME, server:REPLICA_ID, router, router:hub, robot:GROUP, robot:GROUP/INDEX, group:NAME"


@dataclass(frozen=True)
class FaultEvent:
    """One checked timeline entry. `kind` is site, server, router or robot (group:NAME -> robot)."""

    index: int  # position in the scenario's `faults:` list, for messages and the log
    at: float
    target: str
    action: str
    duration: float | None = None
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)
    kind: str = ""
    name: str = ""  # site name, replica id or group; for the router "" (every router) or "hub" (the driver's)
    robot_index: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))

    @property
    def family(self) -> str:
        return FAMILY_OF_KIND[self.kind]

    @property
    def end(self) -> float | None:
        return None if self.duration is None else self.at + self.duration


class TimelineError(ValueError):
    """A bad timeline entry; `str()` starts with ``faults[i]: `` and names the key and the fix."""

    def __init__(self, index: int, key: str | None, message: str):
        self.index, self.key = index, key
        super().__init__(f"faults[{index}]: {message}")


# --- the actuators: what the runner drives -----------------------------------------------------


class Undoable(Protocol):
    def undo(self) -> None: ...


class Actuators(Protocol):
    """The world the runner acts on. Methods are called from the runner's threads (one per target)."""

    def partition(self, site: str, on: bool) -> None:
        """on=True: the site's proxy drops every connection and refuses new ones; False: one partition of the site
        ends (it heals when every partition on it has: two overlapping windows are one partition from the first
        start to the last end)."""

    def add_toxic(self, site: str, toxic: dict) -> Any:
        """Add one toxic dict ({type, name, stream, toxicity, attributes}); return a handle."""

    def remove_toxic(self, site: str, handle: Any) -> None: ...

    def set_profile(self, site: str, profile: str) -> Any:
        """Replace the site's profile toxics with `profile`'s; return what restore_profile needs. Overlapping
        windows: the profile that started last of those still in effect holds the site; when none is, the site's
        own profile is back."""

    def restore_profile(self, site: str, handle: Any) -> None: ...

    def process_fault(self, target: str, action: str, params: Mapping[str, Any]) -> Undoable | None:
        """kill, term, restart, restart_with, pause on "server:ID" or "router"; the handle undoes it."""

    def robot_fault(self, group: str, index: int | None, action: str) -> None:
        """kill, stop, pause, resume, restart one robot (index) or a whole group (None)."""


# --- parameters --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    check: Callable[[Any], Any]  # the value as used, or ValueError saying what is expected
    required: bool = False
    example: str = ""


def _number(minimum: float, *, above: bool = False, what: str = "") -> Callable[[Any], float]:
    def check(v):
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or v < minimum or (above and v == minimum):
            raise ValueError(f"must be a number {'>' if above else '>='} {minimum:g}{what}, got {v!r}")
        return float(v)

    return check


def _text(v) -> str:
    if not isinstance(v, str) or not v:
        raise ValueError(f"must be a non-empty string, got {v!r}")
    return v


def _profile_name(v) -> str:
    if v not in profiles.PROFILES:
        raise ValueError(f"unknown network profile {v!r}; profiles: {', '.join(profiles.PROFILES)}")
    return v


def _stream(v) -> str:
    if v not in ("both", *profiles.STREAMS):
        raise ValueError(f"must be both, upstream (robot -> router) or downstream (router -> robot), got {v!r}")
    return v


def _attribute(type_word: str, attr: str) -> Callable[[Any], Any]:
    def check(v):
        try:
            return profiles.check_attribute(type_word, attr, v)
        except ValueError as exc:
            raise ValueError(str(exc).replace(f"{type_word}.{attr} ", "")) from None

    return check


# --- what each action does ---------------------------------------------------------------------

Undo = Callable[[], None]


# A toxic action word -> the toxic type it adds, the attribute that must be given (and an example).
TOXIC_ACTIONS: dict[str, tuple[str, str | None, str]] = {
    "latency": ("latency", "latency", "latency: 200"),
    "jitter": ("latency", "jitter", "jitter: 50"),
    "bandwidth": ("bandwidth", "rate", "rate: 100"),
    "loss": ("loss", "probability", "probability: 0.05"),
    "slicer": ("slicer", "average_size", "average_size: 64"),
    "reset_peer": ("reset_peer", None, "timeout: 0"),
    "timeout": ("timeout", None, "timeout: 0"),
    "slow_close": ("slow_close", "delay", "delay: 1000"),
    "limit_data": ("limit_data", "bytes", "bytes: 1000000"),
}


def _toxicity(v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
        raise ValueError(f"must be a probability in 0..1 (the share of connections hit), got {v!r}")
    return float(v)


def _toxic_params(action: str) -> dict[str, Param]:
    type_word, required, example = TOXIC_ACTIONS[action]
    params = {
        attr: Param(
            _attribute(type_word, attr), attr == required, example if attr == required else f"{attr}: {default}"
        )
        for attr, default in profiles.TOXIC_ATTRIBUTES[type_word].items()
    }
    params["stream"] = Param(_stream, example="stream: both")
    params["toxicity"] = Param(_toxicity, example="toxicity: 0.5")
    return params


def _apply_toxic(act: Actuators, ev: FaultEvent) -> Undo:
    type_word = TOXIC_ACTIONS[ev.action][0]
    p = dict(ev.params)
    stream = p.pop("stream", "both")
    toxicity = p.pop("toxicity", 1.0)
    streams = profiles.STREAMS if stream == "both" else (stream,)
    handles = []
    try:
        for s in streams:
            t = profiles.toxic(type_word, s, toxicity=toxicity, name=f"fault{ev.index}_{type_word}_{s}", **p)
            handles.append(act.add_toxic(ev.name, t))
    except Exception:
        for h in reversed(handles):  # half a fault is worse than none: take back what landed
            with contextlib.suppress(Exception):  # the add's error is the one worth reporting
                act.remove_toxic(ev.name, h)
        raise

    def undo():
        for h in reversed(handles):
            act.remove_toxic(ev.name, h)

    return undo


def _apply_partition(act: Actuators, ev: FaultEvent) -> Undo:
    act.partition(ev.name, True)
    return lambda: act.partition(ev.name, False)


def _apply_profile(act: Actuators, ev: FaultEvent) -> Undo:
    handle = act.set_profile(ev.name, ev.params["profile"])
    return lambda: act.restore_profile(ev.name, handle)


def _apply_process(act: Actuators, ev: FaultEvent) -> Undo | None:
    handle = act.process_fault(ev.target, ev.action, dict(ev.params))
    if ev.duration is None:
        return None
    if not callable(getattr(handle, "undo", None)):
        raise TypeError(f"process_fault({ev.target!r}, {ev.action!r}) returned {handle!r}, not a handle with undo()")
    return handle.undo


ROBOT_UNDO = {"kill": "restart", "stop": "restart", "pause": "resume"}


def _apply_robot(act: Actuators, ev: FaultEvent) -> Undo:
    act.robot_fault(ev.name, ev.robot_index, ev.action)
    undo_action = ROBOT_UNDO.get(ev.action)
    return (lambda: act.robot_fault(ev.name, ev.robot_index, undo_action)) if undo_action else None


@dataclass(frozen=True)
class ActionSpec:
    apply: Callable[[Actuators, FaultEvent], Undo | None]  # does it; returns how to undo it
    window: str  # duration: "required" (windowed), "optional" (undone after it if given), "never"
    params: Mapping[str, Param] = field(default_factory=dict)


_PROFILE = {"profile": Param(_profile_name, True, "profile: satellite")}
_TERM = {"grace_s": Param(_number(0, above=True), example="grace_s: 5")}
_RESTART_WITH = {
    "manifest": Param(_text, example="manifest: path/to/other.yaml"),
    "checkpoint": Param(_text, example="checkpoint: other_model"),
}

# (target family, action word) -> what it takes and does. Adding an action = one line here.
# The effect of each is tabled in docs/chaos-faults.md.
ACTIONS: dict[tuple[str, str], ActionSpec] = {
    ("site", "partition"): ActionSpec(_apply_partition, "required"),
    ("site", "profile"): ActionSpec(_apply_profile, "required", _PROFILE),
    **{("site", word): ActionSpec(_apply_toxic, "required", _toxic_params(word)) for word in TOXIC_ACTIONS},
    ("process", "kill"): ActionSpec(_apply_process, "optional"),
    ("process", "term"): ActionSpec(_apply_process, "optional", _TERM),
    ("process", "restart"): ActionSpec(_apply_process, "never"),
    ("process", "start"): ActionSpec(_apply_process, "never"),
    ("process", "restart_with"): ActionSpec(_apply_process, "optional", _RESTART_WITH),
    ("process", "pause"): ActionSpec(_apply_process, "required"),
    ("robot", "kill"): ActionSpec(_apply_robot, "optional"),
    ("robot", "stop"): ActionSpec(_apply_robot, "optional"),
    ("robot", "pause"): ActionSpec(_apply_robot, "optional"),
    ("robot", "resume"): ActionSpec(_apply_robot, "never"),
    ("robot", "restart"): ActionSpec(_apply_robot, "never"),
}

BASE_KEYS = ("at", "target", "action", "duration")
FAMILY_WORDS = {"site": "a site", "process": "a server or the router", "robot": "robots"}


# --- the parser --------------------------------------------------------------------------------


def _closest(word, options) -> str:
    return did_you_mean(word, options)


def _parse_target(i: int, raw) -> tuple[str, str, int | None]:
    if raw is None:
        raise TimelineError(i, "target", f"`target` is missing: add e.g. `target: site:eu`; forms: {TARGET_FORMS}")
    m = _TARGET_RE.match(raw) if isinstance(raw, str) else None
    if not m:
        raise TimelineError(i, "target", f"target {raw!r} is not one of {TARGET_FORMS}")
    if m.group("router"):  # `router`: every router of the run; `router:hub`: the driver's alone (bench.run.mesh)
        return "router", "hub" if m.group("hub") else "", None
    kind, name, index = m.group("kind"), m.group("name"), m.group("index")
    if index is not None and kind != "robot":
        raise TimelineError(i, "target", f"target {raw!r}: only robot targets take /INDEX; forms: {TARGET_FORMS}")
    if index is not None and not index.isdigit():
        raise TimelineError(
            i, "target", f"target {raw!r}: the robot index must be a whole number >= 0, e.g. robot:{name}/0"
        )
    return ("robot" if kind == "group" else kind), name, (int(index) if index is not None else None)


def parse_entry(i: int, entry) -> FaultEvent:
    """One timeline entry as a FaultEvent, or TimelineError naming the key and the fix."""
    if not isinstance(entry, Mapping):
        raise TimelineError(
            i,
            None,
            f"expected a mapping like {{at: 10, target: site:eu, action: partition, duration: 5}}, "
            f"got {type(entry).__name__} {entry!r}",
        )
    kind, name, robot_index = _parse_target(i, entry.get("target"))
    family = FAMILY_OF_KIND[kind]
    action = entry.get("action")
    family_actions = [a for f, a in ACTIONS if f == family]
    if action is None:
        raise TimelineError(
            i, "action", f"`action` is missing: add one of {', '.join(family_actions)} (for {FAMILY_WORDS[family]})"
        )
    spec = ACTIONS.get((family, action))
    if spec is None:
        if any(a == action for _f, a in ACTIONS):
            raise TimelineError(
                i,
                "action",
                f"action {action!r} does not apply to target {entry['target']!r}; "
                f"actions for {FAMILY_WORDS[family]}: {', '.join(family_actions)}",
            )
        raise TimelineError(
            i,
            "action",
            f"unknown action {action!r}{_closest(action, family_actions)}; "
            f"actions for {FAMILY_WORDS[family]}: {', '.join(family_actions)}",
        )
    allowed = [*BASE_KEYS, *spec.params]
    for key in entry:
        if key not in allowed:
            raise TimelineError(
                i,
                str(key),
                f"unknown key {key!r}{_closest(key, allowed)} for {action} on "
                f"{FAMILY_WORDS[family]}; keys: {', '.join(allowed)}",
            )
    if entry.get("at") is None:
        raise TimelineError(i, "at", "`at` is missing: add `at: SECONDS` (time after t=0, >= 0)")
    try:
        at = _number(0, what=" (seconds after t=0)")(entry["at"])
    except ValueError as exc:
        raise TimelineError(i, "at", f"at: {exc}") from None
    duration = entry.get("duration")
    if duration is None and spec.window == "required":
        raise TimelineError(
            i, "duration", f"`duration` is missing: {action} is undone after it; add e.g. `duration: 5` (seconds)"
        )
    if duration is not None:
        if spec.window == "never":
            raise TimelineError(
                i, "duration", f"`duration` does not apply to {action} (it has nothing to undo): remove it"
            )
        try:
            duration = _number(0, above=True, what=" (seconds)")(duration)
        except ValueError as exc:
            raise TimelineError(i, "duration", f"duration: {exc}") from None
    params = {}
    for key, p in spec.params.items():
        if key not in entry:
            if p.required:
                raise TimelineError(i, key, f"`{key}` is missing: the {action} action needs it, e.g. `{p.example}`")
            continue
        try:
            params[key] = p.check(entry[key])
        except ValueError as exc:
            raise TimelineError(i, key, f"{key}: {exc}") from None
    if action == "restart_with" and len(params) != 1:
        raise TimelineError(i, "manifest", "restart_with needs exactly one of `manifest: PATH` or `checkpoint: NAME`")
    return FaultEvent(
        index=i,
        at=at,
        target=entry["target"],
        action=action,
        duration=duration,
        params=params,
        kind=kind,
        name=name,
        robot_index=robot_index,
    )


def parse_timeline(entries) -> list[FaultEvent]:
    """Every entry checked (the first bad one raises TimelineError); events sorted by `at`."""
    if entries is None:
        return []
    if not isinstance(entries, (list, tuple)):
        raise TimelineError(0, None, f"the timeline is a list of entries, got {type(entries).__name__}")
    events = [parse_entry(i, e) for i, e in enumerate(entries)]
    return sorted(events, key=lambda e: e.at)  # stable: same `at` keeps file order
