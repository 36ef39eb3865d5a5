"""The bench runs its replicas' dispatch loops at normal priority unless BENCH_REPLICA_PRIORITY or the scenario
says otherwise (manifest `dispatch_priority`); a bad word is named."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.run.manifests import replica_manifest, replica_priority
from server.manifest import Manifest


def test_normal_unless_the_environment_names_another(monkeypatch):
    monkeypatch.delenv("BENCH_REPLICA_PRIORITY", raising=False)
    assert replica_priority() == "normal"
    monkeypatch.setenv("BENCH_REPLICA_PRIORITY", "fifo")
    assert replica_priority() == "fifo"
    monkeypatch.setenv("BENCH_REPLICA_PRIORITY", "realtime")
    with pytest.raises(ValueError, match="BENCH_REPLICA_PRIORITY='realtime': expected one of fifo, nice, normal"):
        replica_priority()


def test_a_scenario_s_manifest_wins_over_the_run_s_default():
    replica = SimpleNamespace(id="r0", checkpoint=None, manifest={}, emulated_latency=None)
    run_keys = {"dispatch_priority": "normal"}
    plain = SimpleNamespace(server_manifest={})
    assert replica_manifest(plain, replica, run_keys)["dispatch_priority"] == "normal"
    said = SimpleNamespace(server_manifest={"dispatch_priority": "fifo"})
    assert replica_manifest(said, replica, run_keys)["dispatch_priority"] == "fifo"


def test_the_manifest_takes_the_three_words_and_names_a_fourth(tmp_path):
    base = {"model": {"repo_or_path": str(tmp_path)}, "zenoh": {"connect_endpoints": ["tcp/127.0.0.1:7447"]}}
    assert Manifest.from_dict(base).dispatch_priority == "normal"
    assert Manifest.from_dict({**base, "dispatch_priority": "fifo"}).dispatch_priority == "fifo"
    with pytest.raises(Exception, match="dispatch_priority"):
        Manifest.from_dict({**base, "dispatch_priority": "realtime"})


def test_a_bad_word_stops_the_run_before_any_process_starts(tmp_path, monkeypatch):
    from bench.run.runner import preflight
    from bench.scenario.load import load_scenario

    monkeypatch.setenv("BENCH_REPLICA_PRIORITY", "realtime")
    problems = preflight(load_scenario(Path(__file__).resolve().parents[3] / "scenarios" / "smoke.yaml"))
    assert any("BENCH_REPLICA_PRIORITY='realtime'" in p for p in problems), problems


def test_judging_reads_the_replicas_priority_line_without_importing_torch(tmp_path):
    """bench.run.verdict holds the replica's log words itself (importing server.service for them imported torch
    into every run's judging): the same words as the replica writes, read without torch in the runner."""
    import subprocess
    import sys

    from bench.run.verdict import REPLICA_PRIORITY_LOG_TEXT
    from server.service import DISPATCH_PRIORITY_LOG_TEXT

    assert REPLICA_PRIORITY_LOG_TEXT == DISPATCH_PRIORITY_LOG_TEXT
    line = f"... INFO policy_server: {DISPATCH_PRIORITY_LOG_TEXT}nice -10 (asked: nice)\n"
    (tmp_path / "server-r0.log").write_text(line)
    probe = (
        "import sys, types; from bench.run.verdict import replica_priorities; "
        f"got = replica_priorities(types.SimpleNamespace(logs=__import__('pathlib').Path({str(tmp_path)!r}), "
        "servers={'r0': None})); print(got, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert out.stdout.split() == ["['nice", "-10']", "False"], out.stdout + out.stderr
