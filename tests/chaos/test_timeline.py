"""chaos.timeline: the strict entry grammar, the runner's schedule and undo, and LiveActuators."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from chaos import faults, timeline
from chaos.timeline import FaultEvent, LiveActuators, TimelineActionError, TimelineError, TimelineRunner, parse_timeline

# --- parsing: good entries -------------------------------------------------------------------

GOOD = [
    ({"at": 10, "target": "site:eu", "action": "partition", "duration": 3}, {"kind": "site", "name": "eu"}),
    ({"at": 0, "target": "site:eu", "action": "latency", "latency": 200, "duration": 5}, {"params": {"latency": 200}}),
    (
        {"at": 1.5, "target": "site:eu", "action": "jitter", "jitter": 30, "latency": 10, "duration": 2},
        {"params": {"jitter": 30, "latency": 10}},
    ),
    (
        {"at": 1, "target": "site:eu", "action": "bandwidth", "rate": 100, "stream": "upstream", "duration": 2},
        {"params": {"rate": 100, "stream": "upstream"}},
    ),
    (
        {"at": 1, "target": "site:eu", "action": "loss", "probability": 0.05, "rto_ms": 100, "duration": 2},
        {"params": {"probability": 0.05, "rto_ms": 100}},
    ),
    ({"at": 1, "target": "site:eu", "action": "slicer", "average_size": 64, "delay": 1, "duration": 2}, {}),
    ({"at": 1, "target": "site:eu", "action": "reset_peer", "duration": 2}, {"params": {}}),
    (
        {"at": 1, "target": "site:eu", "action": "timeout", "timeout": 500, "toxicity": 0.5, "duration": 2},
        {"params": {"timeout": 500, "toxicity": 0.5}},
    ),
    (
        {"at": 1, "target": "site:eu", "action": "profile", "profile": "satellite", "duration": 2},
        {"params": {"profile": "satellite"}},
    ),
    ({"at": 80, "target": "server:r1", "action": "restart"}, {"kind": "server", "name": "r1", "duration": None}),
    ({"at": 80, "target": "server:r1", "action": "kill"}, {"duration": None}),
    ({"at": 80, "target": "server:r1", "action": "kill", "duration": 4}, {"duration": 4.0}),
    ({"at": 80, "target": "server:r1", "action": "term", "grace_s": 2}, {"params": {"grace_s": 2.0}}),
    (
        {"at": 80, "target": "server:r1", "action": "restart_with", "checkpoint": "arm"},
        {"params": {"checkpoint": "arm"}},
    ),
    ({"at": 80, "target": "server:r1", "action": "restart_with", "manifest": "m.yaml", "duration": 5}, {}),
    ({"at": 5, "target": "server:r1", "action": "pause", "duration": 1}, {}),
    ({"at": 5, "target": "router", "action": "restart"}, {"kind": "router", "name": ""}),
    ({"at": 5, "target": "router:hub", "action": "kill", "duration": 4}, {"kind": "router", "name": "hub"}),
    ({"at": 5, "target": "robot:eu", "action": "kill"}, {"kind": "robot", "name": "eu", "robot_index": None}),
    ({"at": 5, "target": "robot:eu/3", "action": "pause", "duration": 2}, {"kind": "robot", "robot_index": 3}),
    ({"at": 5, "target": "robot:eu/0", "action": "resume"}, {"robot_index": 0}),
    ({"at": 5, "target": "group:eu", "action": "stop"}, {"kind": "robot", "name": "eu", "robot_index": None}),
]


@pytest.mark.parametrize("entry, expected", GOOD, ids=[f"{e['action']}-{e['target']}" for e, _ in GOOD])
def test_good_entry_parses(entry, expected):
    (ev,) = parse_timeline([entry])
    assert isinstance(ev, FaultEvent)
    assert ev.at == entry["at"] and ev.action == entry["action"] and ev.target == entry["target"]
    for key, value in expected.items():
        assert getattr(ev, key) == value, key


def test_events_are_sorted_frozen_and_keep_their_index():
    events = parse_timeline(
        [
            {"at": 5, "target": "router", "action": "restart"},
            {"at": 1, "target": "site:a", "action": "partition", "duration": 1},
            {"at": 5, "target": "site:a", "action": "partition", "duration": 1},
        ]
    )
    assert [(e.at, e.index) for e in events] == [(1, 1), (5, 0), (5, 2)]
    with pytest.raises(AttributeError):
        events[0].at = 3
    with pytest.raises(TypeError):
        events[0].params["x"] = 1
    assert events[0].end == 2 and events[1].end is None
    hash(events[0])


def test_empty_timeline():
    assert parse_timeline([]) == [] and parse_timeline(None) == []


# --- parsing: bad entries, each naming the key ---------------------------------------------------

BAD = [
    ("not a mapping", None, r"expected a mapping"),
    ({"target": "site:eu", "action": "partition", "duration": 3}, "at", r"`at` is missing"),
    ({"at": -1, "target": "site:eu", "action": "partition", "duration": 3}, "at", r"at: must be a number >= 0"),
    ({"at": "soon", "target": "site:eu", "action": "partition", "duration": 3}, "at", r"at: must be a number"),
    ({"at": True, "target": "site:eu", "action": "partition", "duration": 3}, "at", r"at: must be a number"),
    ({"at": 1, "action": "partition", "duration": 3}, "target", r"`target` is missing"),
    ({"at": 1, "target": "moon", "action": "partition", "duration": 3}, "target", r"target 'moon' is not one of"),
    ({"at": 1, "target": "site:", "action": "partition", "duration": 3}, "target", r"is not one of"),
    (
        {"at": 1, "target": "site:eu/2", "action": "partition", "duration": 3},
        "target",
        r"only robot targets take /INDEX",
    ),
    ({"at": 1, "target": "robot:eu/x", "action": "kill"}, "target", r"robot index must be a whole number"),
    ({"at": 1, "target": "site:eu", "duration": 3}, "action", r"`action` is missing: add one of partition"),
    (
        {"at": 1, "target": "site:eu", "action": "partiton", "duration": 3},
        "action",
        r"unknown action 'partiton' \(did you mean 'partition'\?\)",
    ),
    ({"at": 1, "target": "site:eu", "action": "kill"}, "action", r"action 'kill' does not apply to target 'site:eu'"),
    (
        {"at": 1, "target": "server:r1", "action": "partition", "duration": 3},
        "action",
        r"does not apply to target 'server:r1'; actions for a server or the router: kill, term",
    ),
    ({"at": 1, "target": "robot:eu", "action": "restart_with", "manifest": "m"}, "action", r"does not apply"),
    (
        {"at": 1, "target": "site:eu", "action": "partition", "durration": 3},
        "durration",
        r"unknown key 'durration' \(did you mean 'duration'\?\) for partition on a site; keys: at, target, action, duration",
    ),
    ({"t": 1, "target": "router", "action": "restart"}, "t", r"unknown key 't' \(did you mean 'at'\?\)"),
    (
        {"at": 1, "target": "site:eu", "action": "latency", "jitter": 5, "rate": 3, "duration": 1},
        "rate",
        r"unknown key 'rate'.*keys: .*latency, jitter, stream, toxicity",
    ),
    (
        {"at": 1, "target": "site:eu", "action": "partition"},
        "duration",
        r"`duration` is missing: partition is undone after it",
    ),
    ({"at": 1, "target": "site:eu", "action": "latency", "latency": 100}, "duration", r"`duration` is missing"),
    ({"at": 1, "target": "server:r0", "action": "pause"}, "duration", r"`duration` is missing"),
    (
        {"at": 1, "target": "site:eu", "action": "partition", "duration": 0},
        "duration",
        r"duration: must be a number > 0",
    ),
    (
        {"at": 1, "target": "site:eu", "action": "partition", "duration": -2},
        "duration",
        r"duration: must be a number > 0",
    ),
    (
        {"at": 1, "target": "server:r0", "action": "restart", "duration": 5},
        "duration",
        r"does not apply to restart.*remove it",
    ),
    ({"at": 1, "target": "robot:eu", "action": "resume", "duration": 5}, "duration", r"remove it"),
    (
        {"at": 1, "target": "site:eu", "action": "latency", "duration": 2},
        "latency",
        r"`latency` is missing: the latency action needs it, e.g. `latency: 200`",
    ),
    (
        {"at": 1, "target": "site:eu", "action": "latency", "latency": "200ms", "duration": 2},
        "latency",
        r"latency: must be a number >= 0",
    ),
    ({"at": 1, "target": "site:eu", "action": "latency", "latency": 2.5, "duration": 2}, "latency", r"whole number"),
    ({"at": 1, "target": "site:eu", "action": "loss", "probability": 2, "duration": 2}, "probability", r"0..1"),
    (
        {"at": 1, "target": "site:eu", "action": "loss", "probability": 0.1, "stream": "up", "duration": 2},
        "stream",
        r"stream: must be both, upstream",
    ),
    ({"at": 1, "target": "site:eu", "action": "timeout", "toxicity": 1.5, "duration": 2}, "toxicity", r"0..1"),
    ({"at": 1, "target": "site:eu", "action": "profile", "duration": 2}, "profile", r"`profile` is missing"),
    (
        {"at": 1, "target": "site:eu", "action": "profile", "profile": "sattelite", "duration": 2},
        "profile",
        r"unknown network profile 'sattelite'; profiles: lan",
    ),
    (
        {"at": 1, "target": "server:r0", "action": "restart_with"},
        "manifest",
        r"exactly one of `manifest: PATH` or `checkpoint",
    ),
    (
        {"at": 1, "target": "server:r0", "action": "restart_with", "manifest": "a", "checkpoint": "b"},
        "manifest",
        r"exactly one of",
    ),
    ({"at": 1, "target": "server:r0", "action": "restart_with", "manifest": ""}, "manifest", r"non-empty string"),
    ({"at": 1, "target": "server:r0", "action": "term", "grace_s": 0}, "grace_s", r"grace_s: must be a number > 0"),
]


@pytest.mark.parametrize("entry, key, message", BAD, ids=[f"{k}-{i}" for i, (_e, k, _m) in enumerate(BAD)])
def test_bad_entry_names_index_key_and_fix(entry, key, message):
    good = {"at": 0, "target": "router", "action": "restart"}
    with pytest.raises(TimelineError, match=r"^faults\[1\]: .*" + message) as info:
        parse_timeline([good, entry])
    assert info.value.index == 1
    assert info.value.key == key
    assert isinstance(info.value, ValueError)


def test_timeline_must_be_a_list():
    with pytest.raises(ValueError, match=r"faults\[0\]: the timeline is a list"):
        parse_timeline({"at": 1})


def test_shipped_scenarios_parse():
    from bench.scenario.load import SCENARIOS_DIR, load_scenario

    for path in sorted(SCENARIOS_DIR.glob("*.yaml")):
        parse_timeline(load_scenario(path).faults)


# --- the runner ------------------------------------------------------------------------------


class Handle:
    def __init__(self, rec, what):
        self.rec, self.what = rec, what

    def undo(self):
        self.rec.call("undo", self.what)


class Recorder:
    """A fake world: every actuator call recorded with the runner's time; optional failures/delays, and gates (a
    call named in `gates` waits, once recorded, until the test sets its event)."""

    def __init__(
        self,
        fail: set[str] = frozenset(),
        slow: dict[str, float] | None = None,
        gates: dict[str, threading.Event] | None = None,
    ):
        self.calls: list[tuple] = []
        self.fail, self.slow, self.gates = set(fail), dict(slow or {}), dict(gates or {})
        self.runner: TimelineRunner | None = None
        self._lock = threading.Lock()
        self._n = 0

    def call(self, name, *args):
        with self._lock:
            self.calls.append((round(self.runner.now(), 3), name, *args))
        if name in self.gates:
            assert self.gates[name].wait(10), f"the test never released {name}"
        if name in self.fail:
            raise OSError(f"{name} broke")
        if name in self.slow:
            time.sleep(self.slow[name])  # stands for a process that takes this long to restart

    def names(self):
        return [c[1:] for c in self.calls]

    def partition(self, site, on):
        self.call("partition", site, on)

    def add_toxic(self, site, toxic):
        self.call("add_toxic", site, toxic["name"])
        return toxic["name"]

    def remove_toxic(self, site, handle):
        self.call("remove_toxic", site, handle)

    def set_profile(self, site, profile):
        self.call("set_profile", site, profile)
        return "previous-of-" + site

    def restore_profile(self, site, handle):
        self.call("restore_profile", site, handle)

    def process_fault(self, target, action, params):
        self.call("process_fault", target, action, dict(params))
        return Handle(self, f"{action} {target}")

    def robot_fault(self, group, index, action):
        self.call("robot_fault", group, index, action)


def run(entries, rec=None, wait_s=2.0, **kw):
    rec = rec or Recorder()
    runner = TimelineRunner(parse_timeline(entries), rec, **kw)
    rec.runner = runner
    runner.start()
    assert runner.wait(wait_s), "timeline did not finish in time"
    return runner, rec


def test_windowed_partition_is_undone_at_at_plus_duration():
    runner, rec = run([{"at": 0.05, "target": "site:eu", "action": "partition", "duration": 0.15}])
    (t_on, *on), (t_off, *off) = rec.calls
    assert on == ["partition", "eu", True] and off == ["partition", "eu", False]
    assert 0.05 <= t_on < 0.25 and 0.2 <= t_off < 0.6  # loose: other tests may load the 2 cores
    (entry,) = runner.log
    assert entry["target"] == "site:eu" and entry["action"] == "partition" and entry["error"] is None
    assert entry["t_start"] == pytest.approx(t_on, abs=0.01) and entry["t_end"] == pytest.approx(t_off, abs=0.05)
    assert runner.error is None


def test_toxic_action_adds_one_toxic_per_stream_and_removes_them():
    _runner, rec = run([{"at": 0, "target": "site:eu", "action": "latency", "latency": 200, "duration": 0.05}])
    assert rec.names() == [
        ("add_toxic", "eu", "fault0_latency_upstream"),
        ("add_toxic", "eu", "fault0_latency_downstream"),
        ("remove_toxic", "eu", "fault0_latency_downstream"),
        ("remove_toxic", "eu", "fault0_latency_upstream"),
    ]


def test_toxic_action_builds_the_proxy_toxic():
    seen = []

    class Capture(Recorder):
        def add_toxic(self, site, toxic):
            seen.append(toxic)
            return super().add_toxic(site, toxic)

    run(
        [
            {
                "at": 0,
                "target": "site:eu",
                "action": "jitter",
                "jitter": 40,
                "stream": "downstream",
                "toxicity": 0.5,
                "duration": 0.02,
            }
        ],
        Capture(),
    )
    assert seen == [
        {
            "type": "latency",
            "name": "fault0_latency_downstream",
            "stream": "downstream",
            "toxicity": 0.5,
            "attributes": {"latency": 0, "jitter": 40},
        }
    ]


def test_profile_switch_restores_with_the_actuators_handle():
    _runner, rec = run([{"at": 0, "target": "site:ap", "action": "profile", "profile": "satellite", "duration": 0.05}])
    assert rec.names() == [("set_profile", "ap", "satellite"), ("restore_profile", "ap", "previous-of-ap")]


def test_process_faults_undo_only_when_windowed():
    _runner, rec = run(
        [
            {"at": 0, "target": "server:r0", "action": "kill", "duration": 0.1},
            {"at": 0, "target": "server:r1", "action": "kill"},
            {"at": 0, "target": "router", "action": "pause", "duration": 0.05},
            {"at": 0, "target": "server:r2", "action": "restart_with", "checkpoint": "arm"},
        ]
    )
    names = rec.names()
    assert ("process_fault", "server:r2", "restart_with", {"checkpoint": "arm"}) in names
    assert ("undo", "kill server:r0") in names and ("undo", "pause router") in names
    assert not any(n == ("undo", "kill server:r1") for n in names)


def test_robot_faults_pass_through_and_windowed_ones_are_reversed():
    _runner, rec = run(
        [
            {"at": 0, "target": "robot:eu/2", "action": "pause", "duration": 0.05},
            {"at": 0, "target": "group:us", "action": "kill", "duration": 0.05},
            {"at": 0, "target": "robot:ap", "action": "restart"},
        ]
    )
    assert sorted(rec.names(), key=str) == sorted(
        [
            ("robot_fault", "eu", 2, "pause"),
            ("robot_fault", "eu", 2, "resume"),
            ("robot_fault", "us", None, "kill"),
            ("robot_fault", "us", None, "restart"),
            ("robot_fault", "ap", None, "restart"),
        ],
        key=str,
    )


def test_one_target_runs_in_timeline_order():
    _runner, rec = run(
        [
            {
                "at": 0.0,
                "target": "site:eu",
                "action": "latency",
                "latency": 100,
                "duration": 0.2,
                "stream": "upstream",
            },
            {"at": 0.05, "target": "site:eu", "action": "partition", "duration": 0.05},
        ]
    )
    assert rec.names() == [
        ("add_toxic", "eu", "fault0_latency_upstream"),
        ("partition", "eu", True),
        ("partition", "eu", False),
        ("remove_toxic", "eu", "fault0_latency_upstream"),
    ]


def test_a_slow_restart_does_not_delay_other_targets():
    rec = Recorder(slow={"process_fault": 0.4})
    runner, rec = run(
        [
            {"at": 0, "target": "server:r0", "action": "restart"},
            {"at": 0.05, "target": "site:eu", "action": "partition", "duration": 0.05},
        ],
        rec,
    )
    t_partition = next(c[0] for c in rec.calls if c[1] == "partition")
    assert t_partition < 0.3
    restart = next(e for e in runner.log if e["action"] == "restart")
    assert restart["t_end"] - restart["t_start"] >= 0.35  # the window spans the restart


def test_router_and_router_hub_faults_run_in_one_lane_in_timeline_order():
    """Both act on the driver's router: a `router:hub` kill due while a slow `router` restart is still running waits
    for it (in two lanes it ran beside the restart, on the same process)."""
    rec = Recorder(slow={"process_fault": 0.3})
    _runner, rec = run(
        [
            {"at": 0, "target": "router", "action": "restart"},
            {"at": 0.05, "target": "router:hub", "action": "kill", "duration": 0.05},
        ],
        rec,
    )
    calls = [c for c in rec.calls if c[1] in ("process_fault", "undo")]
    assert [c[1:3] for c in calls] == [
        ("process_fault", "router"),
        ("process_fault", "router:hub"),
        ("undo", "kill router:hub"),
    ]
    assert calls[1][0] >= 0.3  # the kill waited for the restart's apply to return


def test_stop_undoes_active_faults_and_skips_pending_ones():
    rec = Recorder()
    runner = TimelineRunner(
        parse_timeline(
            [
                {"at": 0, "target": "site:eu", "action": "partition", "duration": 100},
                {"at": 0, "target": "site:us", "action": "loss", "probability": 0.1, "duration": 100},
                {"at": 50, "target": "router", "action": "restart"},
            ]
        ),
        rec,
    )
    rec.runner = runner
    runner.start()
    deadline = time.monotonic() + 2
    while len(rec.calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    t = time.monotonic()
    runner.stop(timeout=2)
    assert time.monotonic() - t < 1.0
    assert runner.done
    names = rec.names()
    assert ("partition", "eu", False) in names
    assert ("remove_toxic", "us", "fault1_loss_upstream") in names and (
        "remove_toxic",
        "us",
        "fault1_loss_downstream",
    ) in names
    assert not any(n[0] == "process_fault" for n in names)
    assert all(e["t_end"] is not None for e in runner.log) and len(runner.log) == 2


def test_log_shows_a_fault_in_effect_with_t_end_none():
    shared_log: list = []
    release = threading.Event()  # the undo waits for it: the check below cannot come after the fault ended, however
    rec = Recorder(gates={"undo": release})  # late a loaded host runs this thread
    runner = TimelineRunner(
        parse_timeline([{"at": 0, "target": "server:r1", "action": "kill", "duration": 0.3}]), rec, log=shared_log
    )
    rec.runner = runner
    runner.start()
    deadline = time.monotonic() + 2
    while not shared_log and time.monotonic() < deadline:
        time.sleep(0.01)  # the runner's thread appends to a plain list: nothing to wait on
    assert shared_log[0]["t_end"] is None and shared_log[0]["target"] == "server:r1"
    release.set()
    runner.wait(5)
    (undo,) = [c for c in rec.calls if c[1] == "undo"]
    assert 0.3 <= undo[0] < 0.6  # the runner undid it at its duration, on the runner's clock
    assert shared_log[0]["t_end"] >= undo[0] - 0.0005  # the Recorder rounds its times to the ms, maybe up


def test_actuator_error_is_recorded_and_the_rest_still_runs():
    rec = Recorder(fail={"partition"})
    runner, rec = run(
        [
            {"at": 0, "target": "site:eu", "action": "partition", "duration": 0.05},
            {"at": 0.02, "target": "router", "action": "restart"},
        ],
        rec,
    )
    assert isinstance(runner.error, TimelineActionError)
    assert str(runner.error).startswith("faults[0] partition site:eu (apply at t=")
    assert "OSError: partition broke" in str(runner.error)
    assert isinstance(runner.error.__cause__, OSError)
    failed = next(e for e in runner.log if e["action"] == "partition")
    assert failed["error"] == "apply: OSError: partition broke" and failed["t_end"] is not None
    assert ("process_fault", "router", "restart", {}) in rec.names()
    assert sum(1 for n in rec.names() if n[0] == "partition") == 1  # a fault that never landed is not undone


def test_undo_error_is_recorded():
    rec = Recorder(fail={"remove_toxic"})
    runner, _ = run(
        [{"at": 0, "target": "site:eu", "action": "bandwidth", "rate": 10, "stream": "upstream", "duration": 0.02}], rec
    )
    assert runner.log[0]["error"].startswith("undo: OSError")
    assert "(undo at t=" in str(runner.error)


def test_injected_clock_and_t0_in_the_past():
    offset = 1e6
    rec = Recorder()
    runner = TimelineRunner(
        parse_timeline(
            [
                {"at": 0.5, "target": "site:eu", "action": "partition", "duration": 0.6},
                {"at": 2.0, "target": "router", "action": "restart"},
            ]
        ),
        rec,
        clock=lambda: time.monotonic() + offset,
    )
    rec.runner = runner
    runner.start(t0=time.monotonic() + offset - 1.0)  # t=0 was a second ago: the partition is due now
    assert runner.wait(2)
    first = rec.calls[0]
    assert first[1:] == ("partition", "eu", True) and 1.0 <= first[0] < 1.4
    assert [c[1:] for c in rec.calls[1:]] == [("partition", "eu", False), ("process_fault", "router", "restart", {})]


def test_run_timeline_parses_and_starts():
    rec = Recorder()
    rec.runner = type("R", (), {"now": staticmethod(lambda: 0.0)})()
    runner = timeline.run_timeline([{"at": 0, "target": "robot:eu/1", "action": "stop"}], rec)
    assert runner.wait(2) and rec.names() == [("robot_fault", "eu", 1, "stop")]


def test_runner_starts_once():
    runner = TimelineRunner([], Recorder()).start()
    with pytest.raises(RuntimeError, match="already started"):
        runner.start()


# --- LiveActuators over a fake ChaosClient and a real process -----------------------------------


class FakeClient:
    def __init__(self):
        self.calls = []

    def set_enabled(self, proxy, enabled):
        self.calls.append(("set_enabled", proxy, enabled))

    def add_toxic(self, proxy, type, name, stream="downstream", toxicity=1.0, attributes=None):
        self.calls.append(("add_toxic", proxy, type, name, stream, toxicity, attributes))

    def remove_toxic(self, proxy, name):
        self.calls.append(("remove_toxic", proxy, name))


def test_live_actuators_drive_the_proxy_per_site():
    from chaos import profiles

    client = FakeClient()
    act = LiveActuators(client, site_toxics={"eu": profiles.profile_toxics("wan_50ms")})
    act.partition("eu", True)
    act.partition("eu", False)
    handle = act.add_toxic("eu", profiles.toxic("latency", "upstream", name="f0", latency=9))
    act.remove_toxic("eu", handle)
    assert client.calls == [
        ("set_enabled", "site-eu", False),
        ("set_enabled", "site-eu", True),
        ("add_toxic", "site-eu", "latency", "f0", "upstream", 1.0, {"latency": 9, "jitter": 0}),
        ("remove_toxic", "site-eu", "f0"),
    ]


def test_live_actuators_profile_switch_swaps_and_restores_the_toxics():
    from chaos import profiles

    client = FakeClient()
    act = LiveActuators(client, site_toxics={"eu": profiles.profile_toxics("wan_50ms")})
    previous = act.set_profile("eu", "lan")
    assert [c[0] for c in client.calls] == ["remove_toxic", "remove_toxic"]
    act.restore_profile("eu", previous)
    assert [c[:3] for c in client.calls[2:]] == [("add_toxic", "site-eu", "latency")] * 2
    assert act.site_toxics["eu"] == profiles.profile_toxics("wan_50ms")


def test_overlapping_partitions_of_a_site_heal_when_the_last_one_ends():
    """Two partition windows that overlap (nested or crossing) are one partition from the first start to the last
    end: the inner window's end used to heal the site while the outer one still held it."""
    client = FakeClient()
    runner = TimelineRunner(
        parse_timeline(
            [
                {"at": 0.0, "target": "site:eu", "action": "partition", "duration": 0.6},
                {"at": 0.1, "target": "site:eu", "action": "partition", "duration": 0.2},  # nested: ends at 0.3
                {"at": 0.5, "target": "site:eu", "action": "partition", "duration": 0.3},
            ]
        ),  # crossing: ends at 0.8
        LiveActuators(client),
    )
    runner.start()
    assert runner.wait(5) and runner.error is None
    assert client.calls == [("set_enabled", "site-eu", False), ("set_enabled", "site-eu", True)]
    ends = [e["t_end"] for e in sorted(runner.log, key=lambda e: e["index"])]
    assert ends[1] < ends[0] < ends[2]  # each window still logs its own end (0.3, 0.6, 0.8 s)
    # a partition that starts after the last ended is a new one; other sites are their own
    act = LiveActuators(client)
    client.calls.clear()
    act.partition("eu", True)
    act.partition("us", True)
    act.partition("eu", False)
    act.partition("eu", True)
    act.partition("eu", False)
    act.partition("us", False)
    assert client.calls == [
        ("set_enabled", "site-eu", False),
        ("set_enabled", "site-us", False),
        ("set_enabled", "site-eu", True),
        ("set_enabled", "site-eu", False),
        ("set_enabled", "site-eu", True),
        ("set_enabled", "site-us", True),
    ]


def test_crossing_profile_windows_leave_the_latest_in_effect_and_then_the_sites_own():
    """profile A 0-10 s and B 5-15 s: B from 5, still B after A ends at 10 (the swap used to put the site's own
    profile back there), the site's own from 15 (it used to put A back for good)."""
    from chaos import profiles

    client = FakeClient()
    own = profiles.profile_toxics("wan_50ms")
    act = LiveActuators(client, site_toxics={"eu": own})

    def on_proxy():  # the toxics the fake proxy holds now, by name -> attributes
        held = {}
        for call in client.calls:
            if call[0] == "add_toxic":
                held[call[3]] = call[6]
            elif call[0] == "remove_toxic":
                held.pop(call[2])
        return held

    def named(toxics):
        return {t["name"]: t["attributes"] for t in toxics}

    client.calls += [("add_toxic", "site-eu", t["type"], t["name"], t["stream"], 1.0, t["attributes"]) for t in own]
    a = act.set_profile("eu", "satellite")
    assert on_proxy() == named(profiles.profile_toxics("satellite"))
    b = act.set_profile("eu", "lte")
    assert on_proxy() == named(profiles.profile_toxics("lte"))
    act.restore_profile("eu", a)  # A ends first: B stays
    assert on_proxy() == named(profiles.profile_toxics("lte"))
    act.restore_profile("eu", b)
    assert on_proxy() == named(own) and act.site_toxics["eu"] == own
    # nested: the inner one's end gives the outer one back
    a = act.set_profile("eu", "satellite")
    b = act.set_profile("eu", "lan")
    act.restore_profile("eu", b)
    assert on_proxy() == named(profiles.profile_toxics("satellite"))
    act.restore_profile("eu", a)
    assert on_proxy() == named(own)


def test_live_actuators_send_loss_stand_ins_to_real_toxiproxy():
    from chaos import profiles

    client = FakeClient()
    act = LiveActuators(client, real_toxiproxy=True)
    act.add_toxic("eu", profiles.toxic("loss", "upstream", probability=0.05))
    (call,) = client.calls
    assert call[2] == "latency" and call[3] == "loss_upstream"


SLEEPER = "import sys, time\nprint('ready', *sys.argv[1:], flush=True)\nwhile True: time.sleep(1)\n"


def test_live_actuators_restart_with_manifest_replaces_the_flag(tmp_path):
    proc = faults.ManagedProcess.launch(
        [sys.executable, "-c", SLEEPER, "--manifest", "a.yaml"],
        tmp_path / "s.log",
        ready_text="ready",
        name="server:r0",
    )
    try:
        act = LiveActuators(
            FakeClient(), processes={"server:r0": proc}, manifest_for_checkpoint=lambda target, ckpt: f"{ckpt}.yaml"
        )
        handle = act.process_fault("server:r0", "restart_with", {"manifest": "b.yaml"})
        assert proc.argv[-2:] == ["--manifest", "b.yaml"] and proc.alive()
        act.process_fault("server:r0", "restart_with", {"checkpoint": "arm"})
        assert proc.argv[-1] == "arm.yaml"
        handle.undo()
        assert proc.argv[-1] == "a.yaml"
        with pytest.raises(faults.UnknownProcess, match=r"no process 'server:r9'.*known: server:r0"):
            act.process_fault("server:r9", "kill", {})
        with pytest.raises(RuntimeError, match="robot faults are not wired"):
            act.robot_fault("eu", 1, "kill")
    finally:
        proc.stop()
    assert "ready --manifest b.yaml" in (tmp_path / "s.log").read_text()
