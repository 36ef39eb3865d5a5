"""benchmarks.gpu_forward runs end to end at tiny size on a CPU (the H100 run is the same code at vla_300m)."""

from __future__ import annotations

import json

from benchmarks import gpu_forward


def test_the_gpu_benchmark_runs_at_tiny_size_and_writes_every_figure(tmp_path, capsys):
    out = tmp_path / "gpu_forward.json"
    rc = gpu_forward.main(["--device", "cpu", "--preset", "tiny", "--cameras", "1", "--image-size", "32",
                           "--batches", "1", "4", "--repeat", "1", "--warmup", "0", "--out", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert set(report["forward"]) == {"1", "4"} and set(report["runtime"]) >= {"1", "4"}
    assert report["forward"]["4"]["guided"]["median_ms"] > 0 and report["micro_batching"]["sessions"] == 4
    assert report["micro_batching"]["gain"] > 0 and report["runtime"]["gpu_jpeg_decode"] is False
    assert "micro-batching at 4 sessions" in capsys.readouterr().out
