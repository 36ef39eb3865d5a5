"""chaos.faults on real child processes: each fault observed through the kernel's process state."""

from __future__ import annotations

import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from chaos.faults import (
    FAULTS,
    ManagedProcess,
    ProcessFaultError,
    ProcessGone,
    UnknownFault,
    UnknownProcess,
    apply_fault,
    replace_arg,
)

# Prints its helper's pid and "ready"; on SIGTERM prints "draining" and exits 0 (a graceful drain).
SLEEPER = """
import signal, subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
def drain(*_):
    print("draining", flush=True)
    helper.kill()
    sys.exit(0)
signal.signal(signal.SIGTERM, drain)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
print("helper", helper.pid, flush=True)
print("sleeper ready", *sys.argv[1:], flush=True)
while True:
    time.sleep(1)
"""
STUBBORN = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("sleeper ready", flush=True)
time.sleep(600)
"""


def proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def helper_pid(proc: ManagedProcess) -> int:
    lines = [ln for ln in proc.child.log_path.read_text().splitlines() if ln.startswith("helper ")]
    return int(lines[-1].split()[1])


def gone(pid: int) -> bool:
    return proc_state(pid) in (None, "Z")  # an orphaned helper may wait as a zombie for a reaper


@pytest.fixture
def sleeper(tmp_path):
    proc = ManagedProcess.launch(
        [sys.executable, "-c", SLEEPER],
        tmp_path / "sleeper.log",
        ready_text="sleeper ready",
        name="sleeper",
        ready_timeout_s=10,
        stop_grace_s=2,
    )
    try:
        yield proc
    finally:
        proc.stop()


def test_kill_sigkills_the_group_and_undo_starts_it_again(sleeper):
    pid, helper = sleeper.pid, helper_pid(sleeper)
    handle = sleeper.kill()
    assert not sleeper.alive() and sleeper.child.proc.returncode == -signal.SIGKILL
    assert proc_state(pid) is None
    deadline = time.monotonic() + 2
    while not gone(helper) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gone(helper), "the kill must reach the process group"
    handle.undo()
    assert sleeper.alive() and sleeper.pid != pid and proc_state(sleeper.pid) in ("S", "R")
    pid2 = sleeper.pid
    handle.undo()  # idempotent: no second start
    assert sleeper.pid == pid2
    assert sleeper.child.log_path.read_text().count("sleeper ready") == 2


def test_pause_stops_the_group_and_resume_continues_it(sleeper):
    helper = helper_pid(sleeper)
    handle = sleeper.pause()
    assert proc_state(sleeper.pid) == "T" and sleeper.state() == "T"
    deadline = time.monotonic() + 2
    while proc_state(helper) != "T" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc_state(helper) == "T"
    assert sleeper.alive()
    handle.undo()
    assert proc_state(sleeper.pid) in ("S", "R")
    deadline = time.monotonic() + 2
    while proc_state(helper) == "T" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc_state(helper) in ("S", "R")


def test_term_lets_the_process_drain(sleeper):
    handle = sleeper.term()
    assert not sleeper.alive() and sleeper.child.proc.returncode == 0
    assert "draining" in sleeper.child.log_path.read_text()
    handle.undo()
    assert sleeper.alive()


def test_term_kills_a_process_that_ignores_it_after_the_grace(tmp_path):
    proc = ManagedProcess.launch([sys.executable, "-c", STUBBORN], tmp_path / "s.log", ready_text="sleeper ready")
    try:
        t = time.monotonic()
        proc.term(grace_s=0.3)
        assert 0.25 < time.monotonic() - t < 3
        assert proc.child.proc.returncode == -signal.SIGKILL
    finally:
        proc.stop()


def test_term_reaches_a_paused_process(sleeper):
    sleeper.pause()
    sleeper.term()
    assert sleeper.child.proc.returncode == 0


def test_restart_waits_for_a_new_ready_line(tmp_path):
    proc = ManagedProcess.launch(
        [sys.executable, "-c", SLEEPER, "0.3"], tmp_path / "s.log", ready_text="sleeper ready", name="sleeper"
    )
    try:
        pid = proc.pid
        t = time.monotonic()
        handle = proc.restart()
        assert time.monotonic() - t >= 0.3, "the previous run's ready line must not count"
        assert proc.pid != pid and proc.alive()
        text = (tmp_path / "s.log").read_text()
        assert text.count("sleeper ready") == 2 and "--- chaos: start sleeper" in text
        assert not handle.reversible
        with pytest.raises(ProcessFaultError, match="restart has no undo"):
            handle.undo()
    finally:
        proc.stop()


def test_restart_keeps_the_child_object_so_its_owner_still_stops_it(sleeper):
    child = sleeper.child
    sleeper.restart()
    new_pid = sleeper.pid
    assert sleeper.child is child
    child.stop()  # what the bench's ProcessSet does at teardown
    assert proc_state(new_pid) is None


def test_restart_with_other_argv_and_undo_back(sleeper):
    original = sleeper.argv
    handle = sleeper.restart_with([*original, "0", "other-model"])
    assert sleeper.argv[-1] == "other-model" and sleeper.alive()
    assert "sleeper ready 0 other-model" in sleeper.child.log_path.read_text()
    handle.undo()
    assert sleeper.argv == original and sleeper.alive()


def test_restart_with_a_broken_argv_fails_clearly_and_keeps_the_old_argv(sleeper):
    original = sleeper.argv
    with pytest.raises(ProcessFaultError, match=r"sleeper exited with 3 before ready"):
        sleeper.restart_with([sys.executable, "-c", "raise SystemExit(3)"])
    assert sleeper.argv == original
    sleeper.restart()
    assert sleeper.alive()


def test_faults_on_a_dead_process_are_clear_errors(sleeper):
    sleeper.kill()
    for fault in (sleeper.kill, sleeper.pause, sleeper.resume, sleeper.term):
        with pytest.raises(
            ProcessGone,
            match=r"sleeper: cannot \w+: pid \d+ is not running \(exited with -9\); "
            r"restart it first",
        ):
            fault()
    sleeper.restart()  # a restart is how a dead process comes back
    assert sleeper.alive()


def test_faults_on_a_never_started_process_are_clear_errors(tmp_path):
    from wire.procs import ChildProcess

    proc = ManagedProcess(ChildProcess([sys.executable, "-c", "pass"], tmp_path / "x.log", name="idle"))
    with pytest.raises(ProcessGone, match="idle: cannot pause: it was never started"):
        proc.pause()
    assert proc.state() is None and not proc.alive()


def test_apply_fault_by_name(sleeper):
    procs = {"server:r0": sleeper}
    handle = apply_fault(procs, "server:r0", "pause")
    assert sleeper.state() == "T"
    handle.undo()
    with pytest.raises(
        UnknownProcess, match=r"no process 'server:r1' \(did you mean 'server:r0'\?\); known: server:r0"
    ):
        apply_fault(procs, "server:r1", "kill")
    with pytest.raises(UnknownFault, match=r"unknown process fault 'explode'; faults: kill, term"):
        apply_fault(procs, "server:r0", "explode")
    with pytest.raises(ProcessFaultError, match=r"server:r0: kill takes no parameters, got signal"):
        apply_fault(procs, "server:r0", "kill", signal=9)
    assert set(FAULTS) == {"kill", "term", "restart", "start", "restart_with", "pause", "resume"}


def test_replace_arg():
    assert replace_arg(["p", "--manifest", "a"], "--manifest", "b") == ["p", "--manifest", "b"]
    assert replace_arg(["p", "--manifest=a"], "--manifest", "b") == ["p", "--manifest=b"]
    assert replace_arg(["p"], "--manifest", "b") == ["p", "--manifest", "b"]


def test_router_restarts_on_the_same_port(tmp_path):
    router, endpoint = ManagedProcess.router(tmp_path / "router.log")
    try:
        host, port = endpoint.split("/", 1)[1].rsplit(":", 1)
        pid = router.pid
        router.restart()
        assert router.pid != pid and router.alive()
        with socket.create_connection((host, int(port)), timeout=2):
            pass
        assert (tmp_path / "router.log").read_text().count("router ready") == 2
        router.kill()
        with pytest.raises(OSError):
            socket.create_connection((host, int(port)), timeout=1).close()
    finally:
        router.stop()


def test_start_new_starts_a_process_never_started_and_refuses_a_running_one(tmp_path):
    """The `start` fault (a replica added mid-run): the child registered but not started comes up and is ready;
    a second start of it is refused by name, not run twice."""
    from wire.procs import ChildProcess

    child = ChildProcess(
        [sys.executable, "-c", SLEEPER], tmp_path / "late.log", ready_text="sleeper ready", name="late"
    )
    proc = ManagedProcess(child, name="late", ready_timeout_s=10, stop_grace_s=2)
    try:
        assert child.proc is None and not proc.alive()
        handle = FAULTS["start"](proc)
        assert handle.action == "start" and not handle.reversible
        assert proc.alive() and proc_state(child.pid) in ("S", "R")
        assert "sleeper ready" in child.log_path.read_text()
        with pytest.raises(ProcessFaultError, match="late: start of a process that is already running"):
            apply_fault({"server:late": proc}, "server:late", "start")
    finally:
        proc.stop()
