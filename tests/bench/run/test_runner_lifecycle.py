"""The runner owns its processes: a finished, failed or interrupted run leaves none behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _start(run_dir: Path, duration: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.bench.lifecycle_main", str(run_dir), str(duration)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.1)  # polling a file the child writes; no event to wait on


def test_failed_assertion_exits_1_and_leaves_no_process(tmp_path):
    proc = _start(tmp_path / "run", 2)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 1, out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["verdict"] == "fail"
    assert [a["result"] for a in summary["assertions"]] == ["pass", "pass", "fail"]
    table = json.loads((tmp_path / "run" / "processes.json").read_text())
    assert {r["name"] for r in table} >= {"router", "shard:0", "shard:1"}
    assert not [r for r in table if _alive(r["pid"])]


def test_ctrl_c_stops_every_child_and_still_reports(tmp_path):
    proc = _start(tmp_path / "run", 60)
    _wait_for(tmp_path / "run" / "processes.json", 60)
    time.sleep(1.5)  # let the measured window begin
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out
    table = json.loads((tmp_path / "run" / "processes.json").read_text())
    assert not [r for r in table if _alive(r["pid"])]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["verdict"] == "error" and "interrupted" in summary["error"]
