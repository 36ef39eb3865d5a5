"""Process accounting of a run on psutil: the host's CPU, and each named process tree's CPU, memory and descriptors.

Owns the "CPU split" and the memory record of a run (router, proxy, each server, each shard, the
runner): every sample holds, per name, % of one core, resident set (MB, the tree's sum) and open file
descriptors (the tree's sum), and what is left at the end (`Leftovers`: child processes still alive,
new /dev/shm entries, the runner's descriptors). Invariants: a sample never raises because a process
vanished (it counts as absent from then on); percentages are of ONE core for processes and of ALL cores
for the host; a name whose pid changes (a restarted replica) starts afresh, and psutil's process
identity (pid + start time) keeps a reused pid from being taken for the old process.

A process on another host (`bench run --cluster ray`) is not in this host's /proc: its ChildActor reads
it there (`node_usage`, the same tree sum) with its node's CPU, and the sampler pulls that every sample
(`track_remote`; a node that does not answer in time leaves that sample without it). Such a process's
% is over its node's clock, and each node's own host % sits beside this host's (`nodes`).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench.evidence.figures import rss_growth_ratio
from bench.run.samplelog import SampleLog

SHM = Path("/dev/shm")


def host_cpu_times() -> tuple[float, float]:
    """(busy, total) CPU seconds of all cores since boot."""
    t = psutil.cpu_times()
    total = sum(t)
    idle = t.idle + getattr(t, "iowait", 0.0)
    return total - idle, total


def _cpu_s(p: psutil.Process, children: bool = True) -> float:
    t = p.cpu_times()
    return t.user + t.system + ((t.children_user + t.children_system) if children else 0.0)


def children_map() -> dict[int, list[psutil.Process]]:
    """ppid -> processes, read once per sample (one pass over /proc, not one per tracked process)."""
    kids: dict[int, list[psutil.Process]] = {}
    for q in psutil.process_iter(["ppid"]):
        kids.setdefault(q.info["ppid"], []).append(q)
    return kids


def _tree(p: psutil.Process, kids: dict[int, list[psutil.Process]]) -> list[psutil.Process]:
    out, stack, seen = [], [p], set()
    while stack:
        q = stack.pop()
        if q.pid in seen:
            continue
        seen.add(q.pid)
        out.append(q)
        stack.extend(kids.get(q.pid, []))
    return out


def tree_usage(p: psutil.Process, kids: dict[int, list[psutil.Process]] | None = None) -> tuple[float, float, int]:
    """(CPU seconds with reaped children's, resident bytes, open fds) summed over the process and its descendants."""
    cpu, rss, fds = 0.0, 0.0, 0
    for q in _tree(p, kids if kids is not None else children_map()):
        try:
            with q.oneshot():
                cpu += _cpu_s(q)
                rss += q.memory_info().rss
                fds += q.num_fds()
        except psutil.Error:
            continue  # gone between the listing and the read
    return cpu, rss, fds


def node_usage(pid: int | None) -> dict:
    """This host's CPU times and cores, and `pid`'s process tree (CPU seconds, resident MB, fds) when it runs:
    what a node's ChildActor answers the driver's sampler with. `mono` dates the reading on this host's clock."""
    busy, total = host_cpu_times()
    out = {"mono": time.monotonic(), "host_busy_s": busy, "host_total_s": total, "cores": os.cpu_count() or 1}
    if pid:
        try:
            p = psutil.Process(pid)
            cpu, rss, fds = tree_usage(p)
            out.update(pid=pid, cpu_s=cpu, rss_mb=rss / 2**20, fds=fds)
        except psutil.Error:
            pass  # gone: absent from this sample, as a local process would be
    return out


class CpuSampler:
    """Samples host and per-process-tree CPU, RSS and descriptors once per `period_s` on its own thread.

    A sample: {t, host_percent, processes: {name: % of a core}, rss_mb: {name: MB}, fds: {name: n},
    speed_probe_ms (every `probe_every`-th; every sample by default)}."""

    def __init__(self, period_s: float = 1.0, clock=time.monotonic, t0: float = 0.0, probe_every: int = 1):
        self.period_s = period_s
        self.probe_every = probe_every  # every n-th sample also times the speed probe (0: never)
        self.clock = clock
        self.t0 = t0
        self.pids: dict[str, object] = {}
        self.samples = SampleLog()  # columns, read back as the sample dicts below (~250 B a second, not ~2.5 KB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._last: dict[str, float] = {}
        self._procs: dict[str, psutil.Process] = {}
        self._fresh: set[str] = set()
        self._last_host: tuple[float, float] | None = None
        self._last_t: float | None = None
        self._me = psutil.Process()
        self.cores = os.cpu_count() or 1
        self.remote: dict[str, str] = {}  # name -> node label, for processes on other hosts
        # names -> {name: node_usage() dict}, called once a sample (bench.run.cluster.Cluster.usage)
        self.remote_usage: Callable[[list[str]], dict[str, dict]] | None = None
        self._remote_last: dict[str, dict] = {}
        self._node_cores: dict[str, int] = {}

    def track(self, name: str, pid) -> None:
        """`pid`: a process id, or a callable returning the current one (a replica the fault timeline
        restarts gets a new pid under the same name)."""
        if pid:
            self.pids[name] = pid

    def track_remote(self, name: str, node: str) -> None:
        """`name` runs on another host, on `node` (its label in the summary); its readings come from `remote_usage`."""
        self.remote[name] = node

    def _sample_remote(self, procs: dict, rss: dict, fds: dict, pids: dict) -> dict[str, float]:
        """Remote processes' % of a core (over their node's clock) into `procs`; returns each node's host %."""
        if not self.remote or self.remote_usage is None:
            return {}
        try:
            got = self.remote_usage(list(self.remote))
        except Exception:
            return {}
        nodes: dict[str, float] = {}
        for name, u in got.items():
            prev, node = self._remote_last.get(name), self.remote.get(name, "?")
            self._remote_last[name] = u
            if prev is None or not u.get("mono", 0) > prev.get("mono", 0):
                continue
            dt = u["mono"] - prev["mono"]
            self._node_cores[node] = int(u.get("cores") or 1)
            d_total = u["host_total_s"] - prev["host_total_s"]
            if node not in nodes and d_total > 0:
                nodes[node] = 100.0 * (u["host_busy_s"] - prev["host_busy_s"]) / d_total
            if "cpu_s" not in u:
                continue
            before = prev.get("cpu_s", 0.0) if prev.get("pid") == u["pid"] else 0.0  # restarted: all of it is new
            procs[name] = max(0.0, 100.0 * (u["cpu_s"] - before) / dt)
            rss[name], fds[name], pids[name] = round(u["rss_mb"], 2), u["fds"], u["pid"]
        return nodes

    def start(self) -> CpuSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.sample()
            except Exception:  # sampling is diagnostics: never take the run down
                pass

    def _process(self, name: str, pid: int) -> psutil.Process | None:
        p = self._procs.get(name)
        if p is not None and p.pid == pid and p.is_running():
            return p
        try:
            p = psutil.Process(pid)
        except psutil.Error:
            return None
        if name in self._procs or name in self._last:
            self._fresh.add(name)  # restarted: everything the new process used is new
        self._procs[name] = p
        return p

    def sample(self) -> dict | None:
        now = self.clock()
        busy, total = host_cpu_times()
        cur, rss, fds, pids = {}, {}, {}, {}
        kids = children_map()
        for name, pid in list(self.pids.items()):
            pid = pid() if callable(pid) else pid
            p = self._process(name, pid) if pid else None
            if p is None or not p.is_running():
                continue
            cur[name], r, fds[name] = tree_usage(p, kids)
            rss[name], pids[name] = r / 2**20, p.pid
        # the runner's own threads only: a process it reaps (a replica killed by a fault) adds its whole
        # lifetime to the runner's children times, which is not the runner's work
        with self._me.oneshot():
            cur["runner"] = _cpu_s(self._me, children=False)
            rss["runner"] = self._me.memory_info().rss / 2**20
            fds["runner"] = self._me.num_fds()
        remote: tuple[dict, dict, dict, dict] = ({}, {}, {}, {})  # % of a core, MB, fds, pid
        nodes = self._sample_remote(*remote)
        out = None
        if self._last_t is not None and now > self._last_t:
            dt = now - self._last_t
            db, dt_s = busy - self._last_host[0], total - self._last_host[1]
            host_pct = 100.0 * db / dt_s if dt_s > 0 else 0.0
            last = {**self._last, **{n: 0.0 for n in self._fresh}}
            procs = {n: max(0.0, 100.0 * (v - last.get(n, v)) / dt) for n, v in cur.items()}
            rss = {n: round(v, 2) for n, v in rss.items()}
            procs.update(remote[0])
            rss.update(remote[1])
            fds.update(remote[2])
            pids.update(remote[3])
            out = {
                "t": now - self.t0,
                "host_percent": host_pct,
                "processes": procs,
                "rss_mb": rss,
                "fds": fds,
                "pids": pids,
            }
            if nodes:
                out["nodes"] = nodes
            if self.probe_every and len(self.samples) % self.probe_every == 0:
                out["speed_probe_ms"] = speed_probe_cpu_ms(IN_RUN_PROBE_FRACTION)
            self.samples.append(out)
        self._last, self._last_host, self._last_t = cur, (busy, total), now
        self._fresh.clear()
        return out

    def probes(self, t_from: float = -math.inf, t_to: float = math.inf) -> dict:
        """The in-run speed probes over [t_from, t_to]: min, median, mean, max (ms), and how many. The mean is the
        window's speed: the VM flips between a fast and a slow phase within seconds (see IN_RUN_PROBE_FRACTION),
        and the median picks one of them."""
        v = sorted(s["speed_probe_ms"] for s in self.samples if "speed_probe_ms" in s and t_from <= s["t"] <= t_to)
        if not v:
            return {}
        return {
            "min_ms": round(v[0], 1),
            "median_ms": round(v[len(v) // 2], 1),
            "mean_ms": round(sum(v) / len(v), 1),
            "max_ms": round(v[-1], 1),
            "count": len(v),
        }

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
        out = {
            "host_percent": sum(s["host_percent"] for s in win) / len(win),
            "split": split,
            "cores": self.cores,
            "samples": len(win),
        }
        if self.remote:  # where the remote processes ran, and each of those nodes' own CPU
            out["node_of"] = dict(sorted(self.remote.items()))
            out["nodes"] = {}
            for node in sorted(set(self.remote.values())):
                vals = [s["nodes"][node] for s in win if node in (s.get("nodes") or {})]
                out["nodes"][node] = {
                    "host_percent": sum(vals) / len(vals) if vals else None,
                    "cores": self._node_cores.get(node),
                    "samples": len(vals),
                    "processes": sorted(n for n, v in self.remote.items() if v == node),
                }
        return out

    def memory(self, t_from: float, t_to: float) -> dict:
        """Per process over [t_from, t_to]: RSS at start and end (MB), max, growth ratio after warm-up (of its last
        incarnation: a restarted replica is judged from its restart), fds start/end, restarts."""
        out = {}
        ts = self.samples.column("t")
        for n in self.samples.keys("rss_mb"):
            rss, fds, pids = (self.samples.column(k, n) for k in ("rss_mb", "fds", "pids"))
            # a process exiting between two samples (a zombie) reads 0 MB and 0 fds: not a sample of it alive
            win = [i for i, t in enumerate(ts) if rss[i] and t_from <= t <= t_to]
            if not win:
                continue
            last_pid = pids[win[-1]]
            restarts = len({pids[i] for i in win}) - 1
            pts = [i for i in win if pids[i] == last_pid]
            rs = [rss[i] for i in pts]
            out[n] = {
                "rss_mb_start": rs[0],
                "rss_mb_end": rs[-1],
                "rss_mb_max": max(rs),
                "rss_growth_ratio": rss_growth_ratio(rs),
                "fds_start": fds[pts[0]],
                "fds_end": fds[pts[-1]],
                "restarts": restarts,
            }
        return out


@dataclass
class Leftovers:
    """What a run left behind: its child processes still alive, /dev/shm entries it created, the runner's fds."""

    shm_before: set[str] = field(default_factory=set)
    fds_before: int = 0

    @classmethod
    def begin(cls) -> Leftovers:
        return cls(_shm_entries(), psutil.Process().num_fds())

    def end(self) -> dict:
        me = psutil.Process()
        try:
            kids = [p for p in me.children(recursive=True) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        except psutil.Error:
            kids = []
        shm = sorted(_shm_entries() - self.shm_before)
        return {
            "leftover_processes": len(kids),
            "leftover_process_names": sorted({_name(p) for p in kids}),
            "leftover_shm": len(shm),
            "leftover_shm_entries": shm[:20],
            "runner_fds_start": self.fds_before,
            "runner_fds_end": me.num_fds(),
        }


def _shm_entries() -> set[str]:
    try:
        return {e.name for e in SHM.iterdir()}
    except OSError:
        return set()


def _name(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline()[:3]) or p.name()
    except psutil.Error:
        return str(p.pid)


PROBE_ITERATIONS = 1_000_000
# The in-run probe: a tenth of the loop (3-5 ms of CPU) every sample, i.e. every second. On the 2-core VM the speed
# flips between two phases (probe ~30 and ~47 ms) within seconds: probes 10 s apart in the soak had a
# lag-1 autocorrelation of -0.01, so a probe every 10 s (the former rate) sampled the phases, not the run's speed.
# Bench-like work follows the probe: 150 interleaved pairs (docs/results/2026-11-26-speed-probe.md), reacher physics and the records' Python
# (dicts, crc32, the latency tracker) against the probe around them, correlation 0.93-0.96, elasticity 1.4-1.5.
# A tenth reads 3 % faster than a quarter (150 pairs, median ratio 0.97); a twentieth 8 %.
IN_RUN_PROBE_FRACTION = 0.1
# the probe on the 2-core VM the CPU cost model was fitted on (bench.run.sizing): costs are kept in ms at this probe
COST_REFERENCE_PROBE_MS = 29.6


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
