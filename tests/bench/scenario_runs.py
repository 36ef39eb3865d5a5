"""Shortened runs of shipped scenarios for the scenario tests, started together and run a few at a time.

Each entry is a `bench` command line (a shipped file plus `--set`s that shorten it and, for negative
checks, break what it tests). The first test that asks for any run submits all of them, so they
overlap instead of queueing behind each other: the scenario tests cost about a third of their
serial time. Every assertion these tests read is far from its threshold (DEAD or not, 0 or 15 %),
so running a few bench runs side by side on two cores does not change their outcome.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PARALLEL = 3
# Three runs side by side on two cores starve each other by design: the negative checks read the system's
# assertions, so the host's own error (fidelity) must not turn their `fail` into `inconclusive`.
SHORT = (
    "--set",
    "warmup_s=3",
    "--set",
    "fidelity={host_late_ratio: 1, loop_overrun_ratio: 1, scheduler_wait_ms: "
    "100000, forward_ratio: 1000, leg_error_ms: 100000, bandwidth_ratio: 0}",
)
INCIDENT = REPO / "scenarios" / "incidents" / "stutter_robot1"
INCIDENT_DATASET = REPO / "scenarios" / "incidents" / "stutter_dataset"

RUNS: dict[str, tuple[str, ...]] = {  # the longest first
    # incident replay (positive): the shipped example's stutter comes back
    "incident_replay": (
        "incident",
        "--edge",
        str(INCIDENT / "edge-log.jsonl"),
        "--audit",
        str(INCIDENT / "audit.jsonl"),
        "--from",
        "0",
        "--to",
        "26",
        "--out",
        "{tmp}/replay.yaml",
    ),
    # incident replay from a LeRobotDataset (robot 1 of the same source run, recorded with its provenance)
    "incident_replay_dataset": (
        "incident",
        "--edge",
        str(INCIDENT_DATASET / "lab"),
        "--robot",
        "1",
        "--audit",
        str(INCIDENT_DATASET / "audit-r0.jsonl"),
        "--from",
        "0",
        "--to",
        "26",
        "--out",
        "{tmp}/replay_dataset.yaml",
    ),
    # fault family: robots that give up inside a 3 s server crash go DEAD
    "server_crash_gives_up": (
        "run",
        "scenarios/ci/server_crash.yaml",
        *SHORT,
        "--set",
        "duration_s=11",
        "--set",
        "fleet.groups.lab.engine.max_offline_s=1",
    ),
    # network family: a satellite link where the Wi-Fi was
    "wifi_on_satellite": (
        "run",
        "scenarios/wifi_jitter.yaml",
        *SHORT,
        "--set",
        "duration_s=8",
        "--set",
        "sites.floor.profile=satellite",
    ),
    # parity: the local engine with other weights of the same shapes
    "parity_other_weights": (
        "run",
        "scenarios/rtc_parity.yaml",
        *SHORT,
        "--set",
        "duration_s=5",
        "--set",
        "fleet.groups.rtc.shadow.policy=reacher_finetune_b",
    ),
    # rtc vs append: RTC off in the rtc group
    "rtc_off": (
        "run",
        "scenarios/rtc_vs_append.yaml",
        *SHORT,
        "--set",
        "sweep.values=[0]",
        "--set",
        "duration_s=8",
        "--set",
        "fleet.groups.rtc.engine.rtc_enabled=false",
    ),
    # capacity: a replica too slow for two sessions
    "capacity_too_slow": (
        "run",
        "scenarios/capacity_pi0.yaml",
        *SHORT,
        "--set",
        "sweep.values=[2]",
        "--set",
        "duration_s=6",
        "--set",
        "servers.replicas.r0.emulated_latency=900",
    ),
    # local baseline (positive): a local group runs beside its remote twin and reports its own task success
    "local_baseline": (
        "run",
        "scenarios/local_vs_lan.yaml",
        *SHORT,
        "--set",
        "duration_s=7",
        "--set",
        "fleet.groups.lan.count=1",
        "--set",
        "fleet.groups.local.count=1",
        "--set",
        'assertions=["group[local].episodes >= 2"]',
    ),
    # max_sessions: room for four sessions, six robots
    "max_sessions_short": (
        "run",
        "scenarios/max_sessions.yaml",
        *SHORT,
        "--set",
        "duration_s=6",
        "--set",
        "servers.replicas.r1.max_sessions=1",
    ),
}


@dataclass
class BenchRun:
    returncode: int
    stderr: str
    reports: Path
    summaries: list[dict] = field(default_factory=list)

    @property
    def assertions(self) -> list[dict]:
        return self.summaries[-1]["assertions"] if self.summaries else []

    def result_of(self, expression: str) -> dict:
        return next(r for r in self.assertions if r["expression"] == expression)

    def json_files(self, name: str) -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted(self.reports.glob(f"**/{name}"))]


def _run(name: str, args: tuple[str, ...], root: Path) -> BenchRun:
    tmp = root / name
    tmp.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), "MUJOCO_GL": "egl"}
    argv = [a.replace("{tmp}", str(tmp)) for a in args]
    reports = tmp / "reports"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.cli", *argv, "--reports", str(reports), "--quiet"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    summaries = [
        json.loads(p.read_text()) for p in sorted(reports.glob("**/summary.json"), key=lambda p: p.stat().st_mtime)
    ]
    return BenchRun(proc.returncode, proc.stderr, reports, summaries)


_futures: dict[str, Future] = {}


def bench_run(name: str) -> BenchRun:
    """The finished run `name`; the first call starts every run of RUNS (PARALLEL at a time)."""
    if not _futures:
        root = Path(tempfile.mkdtemp(prefix="scenario-runs-"))
        pool = ThreadPoolExecutor(max_workers=PARALLEL, thread_name_prefix="bench-run")
        for key, args in RUNS.items():
            _futures[key] = pool.submit(_run, key, args, root)
        pool.shutdown(wait=False)
    return _futures[name].result(timeout=900)
