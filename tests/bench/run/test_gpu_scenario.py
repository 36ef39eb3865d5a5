"""scenarios/capacity_gpu.yaml measures real GPU inference: on a host without CUDA `bench run` refuses it
with exit 2 and a message saying why, before any process starts; a CPU scenario is not affected."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.run.runner import cuda_problems
from bench.scenario.load import SCENARIOS_DIR, load_scenario

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has CUDA: the scenario would run, not be refused")
def test_capacity_gpu_is_refused_with_exit_2_on_a_host_without_cuda(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.cli",
            "run",
            str(SCENARIOS_DIR / "capacity_gpu.yaml"),
            "--reports",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "needs a CUDA GPU" in proc.stderr and "model.device: cuda" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not any(tmp_path.iterdir())  # refused before a run directory, a router or a server existed


def test_only_replicas_on_cuda_ask_for_it():
    assert cuda_problems(load_scenario(SCENARIOS_DIR / "capacity_act.yaml")) == []
    problems = cuda_problems(load_scenario(SCENARIOS_DIR / "capacity_gpu.yaml"))
    assert (problems == []) == torch.cuda.is_available()


def test_a_replica_that_compiles_gets_longer_to_start(tmp_path):
    """torch.compile at warm-up takes ~25 s a batch bucket on the H200 (and compiles on a CPU too since
    2026-11-27): such a replica's start (and restart) deadline is REPLICA_COMPILE_START_S, asked by the manifest
    or by the checkpoint's own config."""
    import json

    from bench.cli import load_with_overrides
    from bench.run.manifests import REPLICA_COMPILE_START_S, REPLICA_START_S, replica_manifest, replica_start_s

    s = load_with_overrides(
        str(SCENARIOS_DIR / "capacity_gpu.yaml"),
        ["servers.manifest.model.hyper_params={compile: false}"],
        check_checkpoints=False,
    )  # no weights in git
    assert replica_start_s(replica_manifest(s, s.replicas[0])) == REPLICA_START_S  # reacher_vla's own: compile false
    s = load_with_overrides(
        str(SCENARIOS_DIR / "capacity_gpu.yaml"), [], check_checkpoints=False
    )  # as shipped: compiled
    assert replica_start_s(replica_manifest(s, s.replicas[0])) == REPLICA_COMPILE_START_S > REPLICA_START_S
    (tmp_path / "config.json").write_text(json.dumps({"hyper_params": {"compile": True}}))
    assert replica_start_s({"model": {"repo_or_path": str(tmp_path), "device": "cuda"}}) == REPLICA_COMPILE_START_S
    # a CPU compiles too (inductor's C++, every bucket at warm-up): the same deadline; without compile, the plain one
    assert replica_start_s({"model": {"repo_or_path": str(tmp_path), "device": "cpu"}}) == REPLICA_COMPILE_START_S
    assert (
        replica_start_s({"model": {"repo_or_path": str(tmp_path), "device": "cpu", "hyper_params": {"compile": False}}})
        == REPLICA_START_S
    )
    assert replica_start_s({"model": {"repo_or_path": str(tmp_path / "gone"), "device": "cuda"}}) == REPLICA_START_S
