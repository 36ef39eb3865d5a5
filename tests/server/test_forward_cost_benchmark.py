"""benchmarks.forward_cost counts a call's FLOPs and dispatched ops on the meta device, exactly: the counts follow
the batch the call really runs (its bucket) and the passes' work, and a bad preset is a clear error."""

from __future__ import annotations

import json

import pytest

from benchmarks import forward_cost


def test_counts_are_exact_per_bucket_and_per_pass(tmp_path, capsys):
    out = tmp_path / "forward_cost.json"
    # tiny's benchmark buckets are 1, 8, 16, ...: a batch of 2 runs as 8 rows
    rc = forward_cost.main(
        ["--preset", "tiny", "--cameras", "1", "--image-size", "32", "--batches", "1", "2", "8", "--out", str(out)]
    )
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


def test_an_attention_call_counts_as_the_one_kernel_a_gpu_runs_and_flops_match_torchs_counter():
    """The meta device runs attention as its math decomposition (~16 ops); counted as one op, with torch's FLOPs.
    A whole plain or training-time call's FLOPs are torch.utils.flop_counter's."""
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    q, k, v = (torch.empty(2, 4, n, 8, device="meta") for n in (30, 17, 17))
    counted = forward_cost.count_call(lambda: F.scaled_dot_product_attention(q, k, v))
    assert counted["ops"] == 1 and counted["gflop"] * 1e9 == sdpa_flop_count(q.shape, k.shape, v.shape)
    policy = forward_cost.build("tiny", 1, 32, "meta", False)
    assert {p.device.type for p in policy.parameters()} == {"meta"}
    batch = {
        "observation.state": torch.zeros(2, 10, device="meta"),
        "observation.images.front": torch.zeros(2, 3, 32, 32, device="meta"),
    }
    prefix = torch.zeros(10, 2, device="meta")
    for mode, prefixes in (("guidance", [None, None]), ("training_time", [prefix, None])):  # plain; training-time

        def call():
            policy.predict_action_chunk(batch, [3, 3], prefixes)

        with forward_cost.rtc_mode(policy, mode):
            reference = FlopCounterMode(display=False)
            with reference:
                call()
            assert forward_cost.count_call(call)["gflop"] * 1e9 == pytest.approx(reference.get_total_flops(), rel=1e-12)
