"""The fault timeline's runner: a parsed `faults:` list applied and undone on time, and the live actuators.

    faults: [{at, target, action, duration?, params...}]      (YAML, times in s from t=0)
        │ parse_timeline: every entry checked, errors "faults[i]: ..."
        ▼
    [FaultEvent] ──► TimelineRunner ──► Actuators (proxy per site, processes, robots)
                         │  one thread per target; apply at `at`, undo at `at + duration`
                         └─► fault log: {t_start, t_end, target, action, params, error}

Targets: `site:NAME`, `server:REPLICA_ID`, `router`, `robot:GROUP`, `robot:GROUP/INDEX`,
`group:NAME` (= `robot:NAME`, the whole group). Actions are registered in `ACTIONS` by
(target family, action word); docs/chaos-faults.md tables them.

The grammar (FaultEvent, ACTIONS, parse_timeline) is chaos.grammar's, re-exported here.

Invariants: `parse_timeline` accepts an entry only if the runner can execute it; events of one
target run in timeline order on that target's thread, so a slow restart never delays another
target; when `stop()` returns, every windowed fault the runner applied has been undone.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from chaos import profiles
from chaos.grammar import (  # noqa: F401 - re-exported
    ACTIONS,
    BASE_KEYS,
    FAMILY_OF_KIND,
    FAMILY_WORDS,
    ROBOT_UNDO,
    TARGET_FORMS,
    TOXIC_ACTIONS,
    ActionSpec,
    Actuators,
    FaultEvent,
    Param,
    TimelineError,
    Undo,
    Undoable,
    parse_entry,
    parse_timeline,
)

# --- the runner --------------------------------------------------------------------------------


class TimelineActionError(RuntimeError):
    """An actuator failed; the message names the entry, `__cause__` is the actuator's exception."""


class TimelineRunner:
    """Runs events against actuators from t0: one thread per target, waits on an Event, no polling.

    `log` (pass a list to share it) gets one dict per applied event when it starts:
    {index, target, action, params, at, duration, t_start, t_end, error}; times are seconds after
    t0, `t_end` is None while the fault is in effect (until its undo, or until an instant action
    returns). `error` (here and on the runner) is the first actuator failure; the other events
    still run. `clock` stamps t0 and the log and must tick in real seconds (waits are real time).
    """

    def __init__(
        self,
        events: list[FaultEvent],
        actuators: Actuators,
        clock: Callable[[], float] = time.monotonic,
        log: list | None = None,
    ):
        self.events = sorted(events, key=lambda e: e.at)
        self.actuators = actuators
        self.clock = clock
        self.log: list[dict] = log if log is not None else []
        self.error: BaseException | None = None
        self.t0: float | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self, t0: float | None = None) -> TimelineRunner:
        if self.t0 is not None:
            raise RuntimeError("this timeline runner was already started")
        self.t0 = self.clock() if t0 is None else t0
        lanes: dict[str, list[FaultEvent]] = {}
        for ev in self.events:  # `router` and `router:hub` share the driver's router: one lane, in timeline order
            lanes.setdefault("router" if ev.kind == "router" else ev.target, []).append(ev)
        for target, events in lanes.items():
            t = threading.Thread(target=self._run_lane, args=(events,), name=f"faults {target}", daemon=True)
            self._threads.append(t)
            t.start()
        return self

    def now(self) -> float:
        return self.clock() - self.t0

    def wait(self, timeout: float | None = None) -> bool:
        """Until every event has run and been undone; False if `timeout` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self.done

    @property
    def done(self) -> bool:
        return self.t0 is not None and not any(t.is_alive() for t in self._threads)

    def stop(self, timeout: float | None = None) -> None:
        """Skip what has not started; undo every fault still in effect; return when all is undone."""
        self._stopping.set()
        self.wait(timeout)

    # --- one lane: the events of one target, in order -------------------------------------------

    def _run_lane(self, events: list[FaultEvent]) -> None:
        seq = itertools.count()
        steps: list = [(ev.at, next(seq), ev, None) for ev in events]  # (due, tie, event, undo or None)
        heapq.heapify(steps)
        in_effect: dict[int, tuple[dict, Undo]] = {}
        while steps and not self._wait_until(steps[0][0]):
            _due, key, ev, pending = heapq.heappop(steps)
            if pending is None:
                entry, undo = self._apply(ev)
                if undo is not None:
                    undo_key = next(seq)
                    in_effect[undo_key] = (entry, undo)
                    heapq.heappush(steps, (ev.end, undo_key, ev, (entry, undo)))
            else:
                in_effect.pop(key, None)
                self._undo(*pending)
        for entry, undo in reversed(list(in_effect.values())):  # stopping: newest fault first
            self._undo(entry, undo)

    def _wait_until(self, due: float) -> bool:
        """Block until t0 + due; True if stop() came first."""
        while True:
            remaining = self.t0 + due - self.clock()
            if remaining <= 0:
                return self._stopping.is_set()
            if self._stopping.wait(remaining):
                return True

    def _apply(self, ev: FaultEvent) -> tuple[dict, Undo | None]:
        entry = {
            "index": ev.index,
            "target": ev.target,
            "action": ev.action,
            "params": dict(ev.params),
            "at": ev.at,
            "duration": ev.duration,
            "t_start": self.now(),
            "t_end": None,
            "error": None,
        }
        with self._lock:
            self.log.append(entry)
        undo = None
        try:
            undo = ACTIONS[(ev.family, ev.action)].apply(self.actuators, ev)
        except Exception as exc:
            self._fail(entry, "apply", exc)
        if undo is None or ev.duration is None:
            entry["t_end"] = self.now()
            return entry, None
        return entry, undo

    def _undo(self, entry: dict, undo: Undo) -> None:
        try:
            undo()
        except Exception as exc:
            self._fail(entry, "undo", exc)
        entry["t_end"] = self.now()

    def _fail(self, entry: dict, phase: str, exc: Exception) -> None:
        what = f"faults[{entry['index']}] {entry['action']} {entry['target']} ({phase} at t={self.now():.3f}s)"
        err = TimelineActionError(f"{what}: {type(exc).__name__}: {exc}")
        err.__cause__ = exc
        with self._lock:
            entry["error"] = (entry["error"] + "; " if entry["error"] else "") + f"{phase}: {type(exc).__name__}: {exc}"
            if self.error is None:
                self.error = err


def run_timeline(
    entries,
    actuators: Actuators,
    t0: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    log: list | None = None,
) -> TimelineRunner:
    """Parse `entries` and start a runner on them: what the bench calls at t=0."""
    return TimelineRunner(parse_timeline(entries), actuators, clock=clock, log=log).start(t0)


# --- actuators for a live run: the chaos proxy and ManagedProcesses ------------------------------


class LiveActuators:
    """Actuators over a ChaosClient (one proxy per site) and `chaos.faults.ManagedProcess`es.

    `processes` maps targets ("server:r0", "router") to ManagedProcesses; `site_toxics` holds each
    site's current profile toxics (what `set_profile` takes off; given: the sites' own profiles, which come back
    when no `profile` fault is in effect); partitions of a site are counted (it heals when the last one ends) and
    `profile` faults stacked (the latest still in effect holds the site), so overlapping windows on one site
    compose as the Actuators protocol says; `robot_fault` forwards robot
    actions (the bench sends them to its shards); `manifest_for_checkpoint(target, checkpoint)`
    writes a manifest for `restart_with: {checkpoint}` and returns its path. With
    `real_toxiproxy=True` toxics the real binary lacks (`loss`) are sent as their stand-ins.
    """

    def __init__(
        self,
        client,
        processes: Mapping[str, Any] | None = None,
        site_toxics: Mapping[str, list[dict]] | None = None,
        robot_fault: Callable[[str, int | None, str], None] | None = None,
        manifest_for_checkpoint: Callable[[str, str], str] | None = None,
        proxy_name: Callable[[str], str] = lambda site: f"site-{site}",
        real_toxiproxy: bool = False,
    ):
        self.client = client
        self.processes = dict(processes or {})
        self.site_toxics = {k: list(v) for k, v in (site_toxics or {}).items()}
        self._robot_fault = robot_fault
        self.manifest_for_checkpoint = manifest_for_checkpoint
        self.proxy_name = proxy_name
        self.real_toxiproxy = real_toxiproxy
        self._own_toxics = dict(self.site_toxics)  # each site's own profile (the same lists: nothing swapped yet)
        self._partitions: dict[str, int] = {}  # site -> partitions in effect
        self._profiles: dict[str, list[tuple[object, list[dict]]]] = {}  # site -> (handle, toxics), oldest first
        self._lock = threading.Lock()  # one lane a target, but `site:eu` faults and a bench caller may meet here

    def _send(self, site: str, toxic: dict) -> str:
        if self.real_toxiproxy:
            toxic = profiles.real_toxiproxy_equivalent([toxic])[0]
        self.client.add_toxic(self.proxy_name(site), **toxic)
        return toxic["name"]

    def partition(self, site: str, on: bool) -> None:
        with self._lock:
            before = self._partitions.get(site, 0)
            self._partitions[site] = max(0, before + (1 if on else -1))
            if before == (0 if on else 1):  # the first partition starts, or the last one ends
                self.client.set_enabled(self.proxy_name(site), not on)

    def add_toxic(self, site: str, toxic: dict) -> str:
        return self._send(site, toxic)

    def remove_toxic(self, site: str, handle: str) -> None:
        self.client.remove_toxic(self.proxy_name(site), handle)

    def set_profile(self, site: str, profile: str) -> object:
        handle = object()
        with self._lock:
            self._profiles.setdefault(site, []).append((handle, profiles.profile_toxics(profile)))
            self._show_profile(site)
        return handle

    def restore_profile(self, site: str, handle: object) -> None:
        with self._lock:
            self._profiles[site] = [p for p in self._profiles.get(site, []) if p[0] is not handle]
            self._show_profile(site)

    def _show_profile(self, site: str) -> None:
        """The site's proxy given the toxics of the latest profile fault in effect, or of its own profile."""
        stack = self._profiles.get(site)
        toxics = stack[-1][1] if stack else self._own_toxics.get(site, [])
        current = self.site_toxics.get(site, [])
        if toxics is current:  # a fault below the latest ended: the site keeps what it has
            return
        for t in current:
            self.client.remove_toxic(self.proxy_name(site), t["name"])
        for t in toxics:
            self._send(site, t)
        self.site_toxics[site] = toxics

    def process_fault(self, target: str, action: str, params: Mapping[str, Any]):
        from chaos import faults

        params = dict(params)
        if action == "restart_with":
            proc = self.processes.get(target)
            if proc is None:
                return faults.apply_fault(self.processes, target, action)  # raises UnknownProcess
            manifest = params.get("manifest")
            if manifest is None:
                if self.manifest_for_checkpoint is None:
                    raise faults.ProcessFaultError(
                        f"{target}: restart_with checkpoint needs a manifest_for_checkpoint "
                        "callback; give `manifest:` instead"
                    )
                manifest = self.manifest_for_checkpoint(target, params["checkpoint"])
            params = {"argv": faults.replace_arg(proc.argv, "--manifest", str(manifest))}
        return faults.apply_fault(self.processes, target, action, **params)

    def robot_fault(self, group: str, index: int | None, action: str) -> None:
        if self._robot_fault is None:
            raise RuntimeError(
                f"robot faults are not wired: {action} robot:{group}{'' if index is None else f'/{index}'}"
            )
        self._robot_fault(group, index, action)
