"""benchmarks.forward_cost counts a call's FLOPs and dispatched ops on the meta device, exactly: the counts follow
the batch the call really runs (its bucket) and the passes' work, and a bad preset is a clear error."""

from __future__ import annotations

import json

import pytest

from benchmarks import forward_cost


def test_counts_are_exact_per_bucket_and_per_pass(tmp_path, capsys):
    out = tmp_path / "forward_cost.json"
    # tiny's benchmark buckets are 1, 8, 16, ...: a batch of 2 runs as 8 rows
    rc = forward_cost.main(["--preset", "tiny", "--cameras", "1", "--image-size", "32", "--batches", "1", "2", "8",
                            "--out", str(out)])
    assert rc == 0
    cost = json.loads(out.read_text())["cost"]
    for label in forward_cost.PASSES:
        one, two, eight = (cost[n][label] for n in ("1", "2", "8"))
        assert one["gflop"] > 0 and one["ops"] > one["view_ops"] > 0
        assert two["gflop"] == eight["gflop"]  # padded to the same bucket (the ops differ: per-prefix copies, the pad)
        assert eight["gflop"] == pytest.approx(8 * one["gflop"], rel=1e-9)  # every matmul is per sample
    assert cost["1"]["guided"]["gflop"] > cost["1"]["plain"]["gflop"]  # the VJP's backward
    assert cost["1"]["guided"]["ops"] > cost["1"]["plain"]["ops"]
    assert "training-time GFLOP" in capsys.readouterr().out


def test_an_unknown_preset_is_refused_with_the_presets(tmp_path, capsys):
    assert forward_cost.main(["--preset", "huge", "--out", str(tmp_path / "x.json")]) == 2
    assert "preset 'huge' unknown" in capsys.readouterr().err and not (tmp_path / "x.json").exists()
