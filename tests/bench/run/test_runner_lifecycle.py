"""The runner owns its processes: a finished, failed or interrupted run leaves none behind."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.run.procset import group_alive

REPO = Path(__file__).resolve().parents[3]


def _start(run_dir: Path, duration: float, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.bench.lifecycle_main", str(run_dir), str(duration), *extra],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


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
    assert summary["fidelity"]["valid"] is True, summary["fidelity"]  # an idle-enough host: the system failed it
    assert {s["shard"] for s in summary["fidelity"]["shards"]} == {0, 1}
    table = json.loads((tmp_path / "run" / "processes.json").read_text())
    assert {r["name"] for r in table} >= {"router", "shard:0", "shard:1"}
    assert not [r for r in table if group_alive(r["pid"])]


def test_ctrl_c_stops_every_child_and_still_reports(tmp_path):
    proc = _start(tmp_path / "run", 60)
    _wait_for(tmp_path / "run" / "processes.json", 60)
    time.sleep(1.5)  # let the measured window begin
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out
    table = json.loads((tmp_path / "run" / "processes.json").read_text())
    assert not [r for r in table if group_alive(r["pid"])]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["verdict"] == "error" and "interrupted" in summary["error"]


def test_a_starved_shard_turns_a_failed_assertion_inconclusive(tmp_path):
    """The same failing scenario while the host starves the shards (SIGSTOP 80 ms of every 200): the
    failure may be the host's, so the verdict is inconclusive, exit 3, and the reasons name the shard."""
    import xml.etree.ElementTree as ET

    proc = _start(tmp_path / "run", 3, "stall")
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 3, out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["verdict"] == "inconclusive" and summary["exit_code"] == 3
    assert summary["fidelity"]["valid"] is False
    reasons = " ".join(summary["fidelity"]["reasons"])
    assert "shard 0" in reasons and "shard 1" in reasons, reasons
    suite = ET.parse(tmp_path / "run" / "junit.xml").getroot().find("testsuite")
    assert suite.get("failures") == "0" and suite.get("skipped") == "1"
    assert "shard 0" in suite.find("testcase/skipped").get("message")
    assert "INCONCLUSIVE" in (tmp_path / "run" / "report.html").read_text()


def test_replicas_on_other_hosts_listen_for_scrapes_and_are_read_at_their_node(tmp_path):
    from types import SimpleNamespace

    from bench.run.drive import health_url
    from bench.run.state import RunState

    runner = RunState()
    runner.host = "10.0.0.5"  # the driver's address on the cluster's network: nodes on other hosts
    info = {"child": SimpleNamespace(node={"ip": "10.0.0.7"}), "health_port": 9101}
    assert health_url(runner, info) == "http://10.0.0.7:9101"
    runner.host = "127.0.0.1"  # every process on this host
    assert health_url(runner, info) == "http://127.0.0.1:9101"


def test_the_summary_names_how_every_chaos_proxy_was_scheduled_local_or_on_a_node(tmp_path):
    from types import SimpleNamespace

    from bench.run.state import RunState
    from bench.run.verdict import proxy_priorities

    runner = RunState()
    runner.logs = tmp_path
    runner.proxy_servers = [SimpleNamespace(priority="SCHED_FIFO 5")]  # read from its process here
    (tmp_path / "chaos-proxy.log").write_text("INFO chaos.toxiproxy: event loop priority: normal (asked: fifo)\n")
    assert proxy_priorities(runner) == ["SCHED_FIFO 5"]  # a local proxy: its process, not its log
    # per_node routers: a node's proxies are known by their logs (a host without CAP_SYS_NICE falls back)
    (tmp_path / "chaos-proxy-0a1b2c3d4e5f.log").write_text(
        "INFO chaos.toxiproxy: event loop priority: nice -10 (asked: fifo)\n"
    )
    (tmp_path / "chaos-proxy-1-0a1b2c3d4e5f.log").write_text("toxiproxy-server-py ready: listening on x\n")
    assert proxy_priorities(runner) == ["SCHED_FIFO 5", "nice -10", "unknown"]


def test_the_process_table_appears_whole(tmp_path, monkeypatch):
    """processes.json is polled by people and tests while the run starts (a CI test read it empty and failed): it
    is written beside and renamed into place, never opened in place."""
    from types import SimpleNamespace

    from bench.run.starters import write_process_table

    opened_in_place = []
    write_text = Path.write_text

    def recording(self, *args, **kwargs):
        if self.name == "processes.json":
            opened_in_place.append(self)
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", recording)
    child = SimpleNamespace(pid=4242, log_path=tmp_path / "router.log")
    run = SimpleNamespace(
        procs=SimpleNamespace(children=[("router", child)]), proxy_servers=[], run_dir=tmp_path, logs=tmp_path
    )
    write_process_table(run)
    assert opened_in_place == []
    assert json.loads((tmp_path / "processes.json").read_text()) == [
        {"name": "router", "pid": 4242, "log": str(tmp_path / "router.log")}
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["processes.json"]
