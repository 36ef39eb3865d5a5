"""CPU accounting from /proc: the host's use and each named process tree's share.

Owns the "CPU split" of a run (router, proxy, each server, each shard, the runner). Invariant:
a sample never raises because a process vanished (it counts as 0 from then on); percentages are
of ONE core for processes and of ALL cores for the host.
"""

from __future__ import annotations

import math
import os
import threading
import time

_CLK = os.sysconf("SC_CLK_TCK")


def host_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    with open("/proc/stat") as f:
        parts = f.readline().split()[1:]
    vals = [int(x) for x in parts[:8]]
    idle = vals[3] + vals[4]
    return sum(vals) - idle, sum(vals)


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                s = f.read()
            ppid = int(s[s.rindex(")") + 2:].split()[1])
        except (OSError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(name))
    return kids


def proc_cpu_s(pid: int, children: bool = True) -> float:
    """utime + stime (seconds) of a process, with its reaped children's unless `children` is False."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return 0.0
    fields = s[s.rindex(")") + 2:].split()
    utime, stime, cutime, cstime = (int(fields[i]) for i in (11, 12, 13, 14))
    return (utime + stime + ((cutime + cstime) if children else 0)) / _CLK


def tree_cpu_s(pid: int, kids: dict[int, list[int]] | None = None) -> float:
    kids = kids if kids is not None else _children_map()
    total, stack, seen = 0.0, [pid], set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        total += proc_cpu_s(p)
        stack.extend(kids.get(p, []))
    return total


class CpuSampler:
    """Samples host and per-process-tree CPU once per `period_s` on its own thread."""

    def __init__(self, period_s: float = 1.0, clock=time.monotonic, t0: float = 0.0, probe_every: int = 10):
        self.period_s = period_s
        self.probe_every = probe_every  # every n-th sample also times the speed probe (0: never)
        self.clock = clock
        self.t0 = t0
        self.pids: dict[str, int] = {}
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._last: dict[str, float] = {}
        self._pid_of: dict[str, int] = {}
        self._last_host: tuple[int, int] | None = None
        self._last_t: float | None = None
        self.cores = os.cpu_count() or 1

    def track(self, name: str, pid) -> None:
        """`pid`: a process id, or a callable returning the current one (a replica the fault timeline
        restarts gets a new pid under the same name)."""
        if pid:
            self.pids[name] = pid

    def start(self) -> "CpuSampler":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.sample()
            except Exception:  # sampling is diagnostics: never take the run down
                pass

    def sample(self) -> dict | None:
        now = self.clock()
        busy, total = host_jiffies()
        kids = _children_map()
        cur, last = {}, dict(self._last)
        for name, pid in list(self.pids.items()):
            pid = pid() if callable(pid) else pid
            if not pid:
                continue
            if self._pid_of.get(name, pid) != pid:
                last[name] = 0.0  # restarted: everything the new process used is new
            self._pid_of[name] = pid
            cur[name] = tree_cpu_s(pid, kids)
        # the runner's own threads only: a process it reaps (a replica killed by a fault) adds its whole
        # lifetime to the runner's cutime, which is not the runner's work
        cur["runner"] = proc_cpu_s(os.getpid(), children=False)
        out = None
        if self._last_t is not None and now > self._last_t:
            dt = now - self._last_t
            db, dt_j = busy - self._last_host[0], total - self._last_host[1]
            host_pct = 100.0 * db / dt_j if dt_j > 0 else 0.0
            procs = {n: max(0.0, 100.0 * (v - last.get(n, v)) / dt) for n, v in cur.items()}
            out = {"t": now - self.t0, "host_percent": host_pct, "processes": procs}
            if self.probe_every and len(self.samples) % self.probe_every == 0:
                out["speed_probe_ms"] = speed_probe_cpu_ms()
            self.samples.append(out)
        self._last, self._last_host, self._last_t = cur, (busy, total), now
        return out

    def probes(self, t_from: float = -math.inf, t_to: float = math.inf) -> dict:
        """The in-run speed probes over [t_from, t_to]: min, median, max (ms), and how many."""
        v = sorted(s["speed_probe_ms"] for s in self.samples if "speed_probe_ms" in s and t_from <= s["t"] <= t_to)
        if not v:
            return {}
        return {"min_ms": round(v[0], 1), "median_ms": round(v[len(v) // 2], 1), "max_ms": round(v[-1], 1),
                "count": len(v)}

    def latest(self) -> dict | None:
        return self.samples[-1] if self.samples else None

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2)

    def split(self, t_from: float, t_to: float) -> dict:
        """Mean % of one core per process over [t_from, t_to], and the host mean %."""
        win = [s for s in self.samples if t_from <= s["t"] <= t_to] or self.samples
        if not win:
            return {"host_percent": None, "split": {}}
        names = sorted({n for s in win for n in s["processes"]})
        split = {n: sum(s["processes"].get(n, 0.0) for s in win) / len(win) for n in names}
        return {"host_percent": sum(s["host_percent"] for s in win) / len(win), "split": split,
                "cores": self.cores, "samples": len(win)}


PROBE_ITERATIONS = 1_000_000


def speed_probe_ms(repeats: int = 3) -> float:
    """Median milliseconds of a fixed pure-Python loop (PROBE_ITERATIONS additions) on this thread.

    The same code on the same 2-core VM has measured 0.26 s and 0.53 s for five million iterations a
    minute apart with the host otherwise idle: the hypervisor's share moves under us. A run reports the
    probe before and after (`summary.json` → `host.speed_probe_ms`) so figures from a slow phase of the
    host are recognised as such, not compared blindly with a fast one."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _probe_loop(PROBE_ITERATIONS)
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def _probe_loop(n: int) -> int:
    s = 0
    for i in range(n):
        s += i
    return s


def speed_probe_cpu_ms(fraction: float = 0.25) -> float:
    """The speed probe during a run: `fraction` of its loop, timed in this thread's CPU time and scaled to a
    whole probe (ms), so it compares with `speed_probe_ms`. CPU time, not wall time: on a busy host the wall
    time would mostly say how long the thread waited for a core; the CPU time says how fast the core ran
    when it had one (this VM's slow phases slow both; a saturated host only the first)."""
    n = max(1, int(PROBE_ITERATIONS * fraction))
    t0 = time.thread_time()
    _probe_loop(n)
    return (time.thread_time() - t0) * 1e3 * PROBE_ITERATIONS / n
