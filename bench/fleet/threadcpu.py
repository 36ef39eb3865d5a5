"""Where a shard's CPU goes, by the role of each thread: the control loop, the engines' network workers, the
records writer, the status thread, Zenoh's runtime, anything else.

A process's CPU time alone cannot tell a busy control loop from busy engines, and Python on Linux names
every thread it starts after the process ("python"), so a per-thread /proc listing lumps the loop's
helpers together with the engines. Here each thread of this process is read from
/proc/self/task/<tid>/stat (utime + stime) and given a role from its Python name (`threading` knows
each thread's native id) or, for a thread Python did not start, its kernel name (Zenoh's runtime
threads: app-N, net-N, acc-N, rx-N, tx-N).

A thread that ended between two snapshots takes its CPU time with it: the figures are a lower bound for
short-lived threads (the shard's start-up pool ends before the first snapshot).
"""

from __future__ import annotations

import os
import re
import threading

ROLES = ("loop", "engine", "records", "status", "control", "zenoh", "python_other", "native")
_ZENOH_COMM = re.compile(r"^(app|net|acc|rx|tx|tokio-runtime-w?|zenoh)[-\w]*$")
try:
    _HZ = os.sysconf("SC_CLK_TCK")
except (AttributeError, ValueError, OSError):  # not a POSIX system
    _HZ = 100


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


def _stat_cpu_s(tid: str) -> tuple[str, float] | None:
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            text = f.read()
        with open(f"/proc/self/task/{tid}/comm") as f:
            comm = f.read().strip()
    except OSError:  # the thread ended while we read
        return None
    fields = text.rsplit(")", 1)[1].split()
    return comm, (int(fields[11]) + int(fields[12])) / _HZ  # utime, stime (after the state field)


def snapshot() -> dict[int, tuple[str, float]]:
    """Every live thread of this process: native id -> (role, CPU seconds so far). Empty where /proc has no
    per-thread stat (not Linux)."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return {}
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    main = threading.main_thread().native_id
    out: dict[int, tuple[str, float]] = {}
    for tid in tids:
        got = _stat_cpu_s(tid)
        if got is None:
            continue
        comm, cpu = got
        n = int(tid)
        out[n] = (role_of(names.get(n), comm, n == main), cpu)
    return out


def by_role(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per role between two snapshots. A thread born in between counts from zero; one that died
    in between is lost (see the module's note)."""
    out = {r: 0.0 for r in ROLES}
    for tid, (role, cpu) in after.items():
        start = before.get(tid, (role, 0.0))[1]
        out[role] += max(cpu - start, 0.0)
    return {r: round(v, 3) for r, v in out.items()}


def combine(reports: list[dict]) -> dict:
    """The shards' `thread_cpu` reports as one: cores per role (summed over shards, each over its own loop's
    wall time), the loop's CPU per robot-tick and the engines' per request. {} when no shard reported."""
    reports = [r for r in reports if r and r.get("wall_s")]
    if not reports:
        return {}
    cores = {role: round(sum(r["cpu_s"].get(role, 0.0) / r["wall_s"] for r in reports), 3) for role in ROLES}
    cpu = {role: sum(r["cpu_s"].get(role, 0.0) for r in reports) for role in ROLES}
    ticks = sum(int(r.get("ticks", 0)) for r in reports)
    requests = sum(int(r.get("requests", 0)) for r in reports)
    out = {"shards": len(reports), "cores": cores, "ticks": ticks, "requests": requests}
    if ticks:
        out["loop_us_per_robot_tick"] = round(cpu["loop"] / ticks * 1e6, 1)
        out["records_us_per_robot_tick"] = round(cpu["records"] / ticks * 1e6, 1)
    if requests:
        out["engine_ms_per_request"] = round(cpu["engine"] / requests * 1e3, 3)
        out["zenoh_ms_per_request"] = round(cpu["zenoh"] / requests * 1e3, 3)
    return out
