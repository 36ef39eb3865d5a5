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
