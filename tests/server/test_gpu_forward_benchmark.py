"""benchmarks.gpu_forward runs end to end at tiny size on a CPU (the H100 run is the same code at vla_300m)."""

from __future__ import annotations

import json

import torch

from benchmarks import gpu_forward


def test_the_gpu_benchmark_runs_at_tiny_size_and_writes_every_figure(tmp_path, capsys):
    out = tmp_path / "gpu_forward.json"
    rc = gpu_forward.main(
        [
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--cameras",
            "1",
            "--image-size",
            "32",
            "--batches",
            "1",
            "4",
            "--repeat",
            "1",
            "--warmup",
            "0",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    report = json.loads(out.read_text())
    assert set(report["forward"]) == {"1", "4"} and set(report["runtime"]) >= {"1", "4"}
    assert report["forward"]["4"]["guided"]["median_ms"] > 0 and report["micro_batching"]["sessions"] == 4
    # micro-batching's gain for each pass: the guided one, and the plain and training-time ones capacity_gpu serves
    assert all(report["micro_batching"][k]["gain"] > 0 for k in ("guided", "plain", "training_time"))
    assert report["runtime"]["gpu_jpeg_decode"] is False and report["passes"] == ["guided", "plain", "training_time"]
    printed = capsys.readouterr().out
    assert "micro-batching at 4 sessions, the guided pass" in printed
    assert "micro-batching at 4 sessions, the training-time pass" in printed


def test_bf16_weights_are_timed_through_every_path(tmp_path):
    """--dtype bfloat16: the policy's weights in bf16 (the manifest's model.dtype), the server's batched path too;
    the chunks still come back float32."""
    out = tmp_path / "gpu_forward.json"
    rc = gpu_forward.main(
        [
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--cameras",
            "1",
            "--image-size",
            "32",
            "--batches",
            "2",
            "--repeat",
            "1",
            "--warmup",
            "0",
            "--dtype",
            "bfloat16",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["dtype"] == "bfloat16" and report["forward"]["2"]["training_time"]["median_ms"] > 0
    assert report["runtime"]["2"]["training_time_ms"] > 0
    policy = gpu_forward.build("tiny", 1, 32, "cpu", False, "bfloat16")
    assert {p.dtype for p in policy.parameters()} == {torch.bfloat16}
    chunk = policy.predict_action_chunk(
        {"observation.state": torch.zeros(1, 10), "observation.images.front": torch.zeros(1, 3, 32, 32)}, [0], [None]
    )
    assert chunk.dtype == torch.float32 and torch.isfinite(chunk).all()


def test_the_training_time_pass_is_timed_on_the_same_weights_and_the_mode_is_put_back():
    """capacity_gpu's checkpoint serves training-time RTC; the benchmark times that pass too, reading the
    guidance-built network as training-time for the while (timing only), then restores it."""
    import torch

    policy = gpu_forward.build("tiny", 1, 32, "cpu", False)
    before = (policy.hp["rtc_mode"], policy.prefix_conditioned)
    row = gpu_forward.forward_figures(policy, [2], repeat=1, warmup=0)["2"]
    assert set(row) == {"guided", "plain", "training_time"} and row["training_time"]["median_ms"] > 0
    assert (policy.hp["rtc_mode"], policy.prefix_conditioned) == before
    with gpu_forward.rtc_mode(policy, "training_time"):  # the prefix rows come back as given: clean tokens
        batch = {"observation.state": torch.zeros(1, policy.config.state_dim)}
        for name, shape in policy.config.image_features.items():
            batch[f"observation.images.{name}"] = torch.zeros(1, *shape)
        prefix = torch.full((policy.config.execution_horizon, policy.config.action_dim), 0.25)
        out = policy.predict_action_chunk(batch, [3], [prefix])
    assert torch.allclose(out[0, :3], prefix[:3].float(), atol=1e-5)
    assert (policy.hp["rtc_mode"], policy.prefix_conditioned) == before


def test_a_compiled_policy_is_timed_eager_too_and_its_compiled_network_is_put_back(capsys):
    """--compile: the compile's gain is measured in the same process (eager rows beside the compiled ones); the
    eager stretch leaves the policy's velocity network and its compile state as they were."""
    policy = gpu_forward.build("tiny", 1, 32, "cpu", True)
    marker, grad_marker = object(), object()
    policy._velocity_fn, policy._grad_path = marker, grad_marker  # stand for the compiled network and its VJP's
    with gpu_forward.eager(policy):
        assert policy._velocity_fn == policy.velocity and policy._compiled and policy._grad_path is None
    assert policy._velocity_fn is marker and policy._grad_path is grad_marker and policy._compiled is False
    policy._grad_path = None
    # the rows' bookkeeping only: marked compiled, the network stays eager (tests/server/test_policies_flow_transformer.py
    # compiles; ~40 s of inductor here would prove nothing more)
    policy._velocity_fn, policy._compiled = policy.velocity, True
    row = gpu_forward.forward_figures(policy, [2], repeat=1, warmup=0)["2"]
    assert set(row) == {"guided", "plain", "training_time", "guided_eager", "plain_eager", "training_time_eager"}
    assert all(row[k]["compile_gain"] > 0 for k in ("guided", "plain", "training_time"))


def test_the_gpu_decodes_gain_is_timed_against_the_cpu_decoder_and_the_decoder_put_back(monkeypatch):
    """Where frames decode on the GPU, the runtime path is timed again with the CPU decoder (issue 19: each
    step's gain). A stand-in decoder (PIL, on the CPU) takes nvjpeg's place on this host."""
    import io

    import numpy as np
    import torch
    from PIL import Image

    import server.runtime as runtime_module
    from server.accel import GpuJpegDecoder

    used = []

    def pil_decode(data, device):
        frames = data if isinstance(data, list) else [data]
        out = [
            torch.from_numpy(np.array(Image.open(io.BytesIO(bytes(f.numpy()))).convert("RGB"))).permute(2, 0, 1)
            for f in frames
        ]
        used.append(len(out))
        return out if isinstance(data, list) else out[0]

    stand_in = GpuJpegDecoder(torch.device("cpu"), pil_decode)
    monkeypatch.setattr(runtime_module.GpuJpegDecoder, "for_device", classmethod(lambda cls, device: stand_in))
    policy = gpu_forward.build("tiny", 1, 32, "cpu", False)
    out = gpu_forward.runtime_figures(policy, [2], repeat=1, warmup=0)
    row = out["2"]
    assert out["gpu_jpeg_decode"] is True and row["training_time_cpu_jpeg_ms"] > 0 and row["gpu_jpeg_gain"] > 0
    assert used == [2, 2]  # one call of the guided path, one of the training-time path; the CPU timing none


def test_a_pass_that_fails_is_named_and_the_others_still_timed(capsys):
    """On the device a pass never tried there (a compile) may fail: its row says why, the other passes and sizes
    keep their figures, and the summary names it (a failure used to end the step, and the lease's figures)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "device_helper", Path(__file__).resolve().parents[2] / "scripts/device/device.py"
    )
    device = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(device)
    policy = gpu_forward.build("tiny", 1, 32, "cpu", False)
    eager_velocity = policy.velocity

    def velocity(*args):
        if torch.is_grad_enabled():
            raise RuntimeError("no backward on this device")
        return eager_velocity(*args)

    policy._velocity_fn = velocity
    out = gpu_forward.forward_figures(policy, [1, 2], repeat=1, warmup=0)
    for n in ("1", "2"):
        assert out[n]["guided"] == {"error": "RuntimeError: no backward on this device"}
        assert out[n]["plain"]["median_ms"] > 0 and out[n]["training_time"]["median_ms"] > 0
    assert "the guided pass at batch 1 failed" in capsys.readouterr().err
    report = {
        "preset": "tiny",
        "parameters": 1e5,
        "device": "cpu",
        "torch": "x",
        "autocast": "none",
        "cameras": 1,
        "image_size": 32,
        "compile": False,
        "forward": out,
        "runtime": {},
    }
    text = "\n".join(device.forward_lines(report, "forward"))
    assert "guided ms -/-" in text and "FAILED: the guided pass at batch 2: RuntimeError: no backward" in text
    # micro-batching too: the failed pass named, the others' gains kept
    gain = gpu_forward.gain_figures(policy, 2, repeat=1, warmup=0)
    assert gain["guided"] == {"error": "RuntimeError: no backward on this device"}
    assert gain["plain"]["gain"] > 0 and gain["training_time"]["gain"] > 0
    report.update(micro_batching=gain, load_avg_before=[0.5])
    text = "\n".join(device.forward_lines(report, "forward"))
    assert (
        "micro-batching at 2 sessions, requests/s one at a time -> micro-batched: guided FAILED: RuntimeError" in text
    )
    assert "; plain " in text and "; training-time " in text


def test_stages_time_only_what_a_short_lease_lacks(tmp_path, capsys):
    """--stages runtime: the JPEG path (the GPU decoder's gain) alone, without the forward sizes and the serial
    micro-batching pass a lease already measured; the table says what was not run."""
    out = tmp_path / "gpu_forward.json"
    rc = gpu_forward.main(
        [
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--cameras",
            "1",
            "--image-size",
            "32",
            "--batches",
            "1",
            "2",
            "--repeat",
            "1",
            "--warmup",
            "0",
            "--stages",
            "runtime",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["stages"] == ["runtime"] and report["complete"] is True
    assert "forward" not in report and "micro_batching" not in report
    assert report["runtime"]["2"]["training_time_ms"] > 0
    printed = capsys.readouterr().out
    assert "stages timed: runtime" in printed and "micro-batching at" not in printed
    assert any(line.split()[:4] == ["2", "-", "-", "-"] for line in printed.splitlines())


def test_the_runtime_stage_calls_the_policy_on_the_thread_of_the_other_stages(monkeypatch):
    """A replica calls a CUDA-graph policy from its device's one thread; the benchmark's forward and micro-batching
    stages call it on the calling thread, and torch 2.11 asserts on a CUDA-graph replay from another thread than
    its capture's. The runtime stage must call it where the others did: on the H100 (fp32 weights) it replayed
    from the device thread, fell back to eager and timed eager passes as compiled ones. The CUDA-graph case is
    made here by telling the runtime that this CPU policy replays CUDA graphs."""
    import threading

    import server.runtime as runtime_module

    monkeypatch.setattr(runtime_module, "compiles_on_cuda", lambda policy: True)
    policy = gpu_forward.build("tiny", 1, 32, "cpu", False)
    threads = []
    real = policy.predict_action_chunk

    def predict(*args, **kwargs):
        threads.append(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(policy, "predict_action_chunk", predict)
    out = gpu_forward.runtime_figures(policy, [2], repeat=1, warmup=0, which=("training_time",))
    assert out["2"]["training_time_ms"] > 0
    assert threads and set(threads) == {threading.current_thread()}
