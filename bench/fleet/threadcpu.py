"""Where a shard's CPU goes, by the role of each thread: the control loop, the engines' network workers, the
records writer, the status thread, Zenoh's runtime, anything else.

A process's CPU time alone cannot tell a busy control loop from busy engines, and Python on Linux names
every thread it starts after the process ("python"), so a per-thread /proc listing lumps the loop's
helpers together with the engines. Here each thread of this process (/proc/self/task) is read from its
CPU clock (the scheduler's ns runtime) and given a role from its Python name (`threading` knows each
thread's native id) or, for a thread Python did not start, its kernel name (Zenoh's runtime threads:
app-N, net-N, acc-N, rx-N, tx-N).

    Ledger()  ── base: the process's CPU, then every live thread's ──┐
    .sample() (the shard's status tick, each second; before a robot fault stops an engine)
              ── every live thread's CPU so far, kept under (tid, start time) ──► ledger
    .report() ── a last sample, then the process's CPU ──► CPU per role since the base, and `accounted`:
                 the threads' share of the process's CPU

A thread that ends takes its kernel counters with it: the ledger keeps what its last sample saw, so an ended
thread loses only the CPU it spent after that sample (at most one status period of it), and one born and ended
between two samples is lost whole. `accounted` (the threads' sum / the process's CPU, time.process_time, which
keeps ended threads' time) says how whole the split is. A thread is keyed by its tid and its start time
(stat field 22): the kernel reuses an ended thread's tid, and the new thread is another entry, not a
continuation whose counters went backwards.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable

ROLES = ("loop", "engine", "records", "status", "control", "zenoh", "python_other", "native")
_ZENOH_COMM = re.compile(r"^(app|net|acc|rx|tx|tokio-runtime-w?|zenoh)[-\w]*$")

ThreadKey = tuple[int, int]  # (tid, start time in clock ticks after boot): a reused tid is another thread
Threads = dict[ThreadKey, tuple[str, float]]  # -> (role, CPU seconds so far)


def role_of(python_name: str | None, comm: str, is_main: bool) -> str:
    """The role of one thread: from its Python name when Python started it, else its kernel name."""
    if is_main:
        return "loop"
    if python_name is None:
        return "zenoh" if _ZENOH_COMM.match(comm) else "native"
    if python_name.startswith(("remote-engine", "rtc-engine")):  # a network worker; a local engine's inference
        return "engine"
    if python_name.startswith("records-"):
        return "records"
    if python_name == "status":
        return "status"
    if python_name.startswith("control-"):
        return "control"
    return "python_other"


def _start_time(tid: int) -> int | None:
    """A thread's start time (clock ticks after boot, /proc stat field 22); None once it is gone."""
    try:  # os.open and os.read: half the CPU of open() here, and a sample reads one file a thread
        fd = os.open(f"/proc/self/task/{tid}/stat", os.O_RDONLY)
        try:
            text = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:  # the thread ended while we read
        return None
    return int(text.rsplit(b")", 1)[1].split()[19])  # fields[0] is field 3 (state): field N is fields[N - 3]


def _thread_cpu_s(tid: int) -> float | None:
    """A thread's CPU seconds from its CPU clock (Linux's clock id for a tid, as pthread_getcpuclockid makes it):
    the scheduler's runtime in ns, the figure time.process_time sums over the process. The stat file's utime +
    stime are 10 ms ticks truncated per thread: a fault-free shard's threads summed 0.95-0.97 of its CPU."""
    try:
        return time.clock_gettime((~tid << 3) | 6)  # CPUCLOCK_PERTHREAD_MASK | CPUCLOCK_SCHED
    except OSError:  # the thread ended
        return None


def _comm(tid: int) -> str | None:
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def process_cpu_s() -> float:
    """This process's CPU seconds: every thread's, ended ones included."""
    return time.process_time()


def threads(comms: dict[ThreadKey, str] | None = None) -> Threads:
    """Every live thread of this process: (tid, start time) -> (role, CPU seconds so far). Empty where /proc has
    no per-thread stat (not Linux). `comms` caches kernel names by key across calls (a sampler's), so a
    thread's comm is read once rather than every sample."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return {}
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    main = threading.main_thread().native_id
    out: Threads = {}
    for tid in map(int, tids):
        start = _start_time(tid)
        cpu = _thread_cpu_s(tid)
        if start is None or cpu is None:
            continue
        key = (tid, start)
        name = names.get(tid)
        comm = "" if name is not None or tid == main else (comms or {}).get(key)
        if comm is None:
            comm = _comm(tid)
            if comm is None:
                continue
            if comms is not None and _ZENOH_COMM.match(comm):  # a native thread may rename itself after its start
                comms[key] = comm
        out[key] = (role_of(name, comm, tid == main), cpu)
    return out


class Ledger:
    """Every thread's CPU since the ledger was made, kept after the thread ends (see the module's note).
    `sample` may be called from any thread."""

    def __init__(
        self, read: Callable[[], Threads] | None = None, read_process: Callable[[], float] = process_cpu_s
    ) -> None:
        self._comms: dict[ThreadKey, str] = {}
        self._read = read or (lambda: threads(self._comms))
        self._read_process = read_process
        self._lock = threading.Lock()
        self._process_base = read_process()  # first, so the threads' CPU is within the process's
        self._base = self._read()
        self._last: Threads = dict(self._base)

    def sample(self) -> None:
        now = self._read()
        with self._lock:
            for key, (role, cpu) in now.items():
                if role == "native" and key in self._last:  # a Python thread past its run() but not yet gone
                    role = self._last[key][0]
                self._last[key] = (role, cpu)

    def by_role(self) -> dict[str, float]:
        """CPU seconds per role from the base to the last sample; a thread born after the base counts from zero."""
        out = {r: 0.0 for r in ROLES}
        with self._lock:
            last = dict(self._last)
        for key, (role, cpu) in last.items():
            out[role] += max(cpu - self._base.get(key, (role, 0.0))[1], 0.0)
        return {r: round(v, 3) for r, v in out.items()}

    def report(self) -> dict:
        """A last sample, then `cpu_s` per role, the process's CPU over the same span (`process_cpu_s`) and
        `accounted`, the roles' sum / the process's CPU (both None where no thread could be read: not Linux)."""
        self.sample()
        process = self._read_process() - self._process_base
        cpu_s = self.by_role()
        out: dict = {"cpu_s": cpu_s, "process_cpu_s": None, "accounted": None}
        if self._last:
            out["process_cpu_s"] = round(process, 3)
            if process > 0:
                out["accounted"] = round(sum(cpu_s.values()) / process, 3)
        return out


def combine(reports: list[dict]) -> dict:
    """The shards' `thread_cpu` reports as one: cores per role (summed over shards, each over its own loop's
    wall time), the share of the shards' process CPU the threads account for, the loop's CPU per robot-tick
    and the engines' per request. {} when no shard reported."""
    reports = [r for r in reports if r and r.get("wall_s")]
    if not reports:
        return {}
    cores = {role: round(sum(r["cpu_s"].get(role, 0.0) / r["wall_s"] for r in reports), 3) for role in ROLES}
    cpu = {role: sum(r["cpu_s"].get(role, 0.0) for r in reports) for role in ROLES}
    ticks = sum(int(r.get("ticks", 0)) for r in reports)
    requests = sum(int(r.get("requests", 0)) for r in reports)
    out = {"shards": len(reports), "cores": cores, "ticks": ticks, "requests": requests}
    process = [r.get("process_cpu_s") for r in reports]
    if all(p is not None for p in process) and sum(process) > 0:
        out["process_cores"] = round(sum(r["process_cpu_s"] / r["wall_s"] for r in reports), 3)
        out["accounted"] = round(sum(cpu.values()) / sum(process), 3)
    if ticks:
        out["loop_us_per_robot_tick"] = round(cpu["loop"] / ticks * 1e6, 1)
        out["records_us_per_robot_tick"] = round(cpu["records"] / ticks * 1e6, 1)
    if requests:
        out["engine_ms_per_request"] = round(cpu["engine"] / requests * 1e3, 3)
        out["zenoh_ms_per_request"] = round(cpu["zenoh"] / requests * 1e3, 3)
    return out
