"""The batched inference path: batching changes nothing per session, failures stay per sample."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from server.policies import PolicyConfig, load_checkpoint, make_policy, save_checkpoint
from server.policies.base import PolicyLoadError
from server.runtime import EmulatedLatency, InferItem, LocalPredictor, ModelRuntime

S, A, T = 4, 3, 8
STATS = {
    "observation.state": {"mean": [0.5, -1.0, 0.0, 2.0], "std": [1.0, 0.5, 2.0, 1.0]},
    "action": {"mean": [0.1, 0.2, 0.3], "std": [1.0, 1.0, 0.25]},
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def checkpoint(tmp_path, policy_type="flow_matching", relative=False, cameras=None):
    cfg = PolicyConfig(
        type=policy_type,
        state_dim=S,
        action_dim=A,
        chunk_size=T,
        fps=30,
        execution_horizon=4,
        action_names=["x", "y", "grip"],
        relative_actions=relative,
        relative_state_indices=[0, 1, 2] if relative else [],
        image_features=cameras or {},
        hyper_params={"hidden_dim": 32, "obs_embed_dim": 16},
    )
    torch.manual_seed(0)
    return load_checkpoint(save_checkpoint(make_policy(cfg), STATS, tmp_path / policy_type))


def items_for(rt: ModelRuntime, states, rtc=True, delays=None):
    rng = np.random.default_rng(1)
    out = []
    for i, st in enumerate(states):
        prefix = rng.normal(size=(5, A)).astype(np.float32)
        out.append(InferItem(rt.new_pipeline(), st, {}, (delays or [2] * len(states))[i], prefix, prefix, rtc=rtc))
    return out


def test_batched_outputs_equal_unbatched_for_every_session(tmp_path):
    rt = ModelRuntime(checkpoint(tmp_path))
    states = [np.random.default_rng(i).normal(size=S).astype(np.float32) for i in range(8)]
    delays = [0, 1, 2, 3, 4, 1, 0, 2]
    batched = rt.infer(items_for(rt, states, delays=delays))
    for i, _st in enumerate(states):
        single = rt.infer([items_for(rt, states, delays=delays)[i]])[0]
        assert single.error is None and batched[i].error is None
        np.testing.assert_allclose(batched[i].chunk_robot, single.chunk_robot, rtol=0, atol=1e-5)
        np.testing.assert_allclose(batched[i].chunk_model, single.chunk_model, rtol=0, atol=1e-5)
        assert batched[i].rtc_applied


def test_each_sample_keeps_its_own_delay_and_prefix(tmp_path):
    rt = ModelRuntime(checkpoint(tmp_path))
    st = np.zeros(S, np.float32)
    a, b = rt.infer(items_for(rt, [st, st], delays=[0, 4]))
    assert not np.allclose(a.chunk_model, b.chunk_model)  # same obs and prefix, different delay


def test_eight_sessions_with_relative_actions_do_not_contaminate_each_other(tmp_path):
    """Design 13.6: per-session pipelines; each chunk is anchored at ITS session's state only."""
    rt = ModelRuntime(checkpoint(tmp_path, relative=True))
    states = [np.full(S, 10.0 * (i + 1), np.float32) for i in range(8)]
    pipes = [rt.new_pipeline() for _ in states]
    batched = rt.infer([InferItem(p, st, rtc=False) for p, st in zip(pipes, states)])
    for i, st in enumerate(states):
        solo = rt.infer([InferItem(rt.new_pipeline(), st, rtc=False)])[0]
        np.testing.assert_allclose(batched[i].chunk_robot, solo.chunk_robot, atol=1e-4)
        # the model-space chunk is relative; robot space = model-space unnormalised + this session's anchor
        assert abs(float(np.median(batched[i].chunk_robot[:, 0])) - st[0]) < 5.0


def test_a_bad_sample_fails_alone(tmp_path):
    rt = ModelRuntime(checkpoint(tmp_path))
    good = np.zeros(S, np.float32)
    bad = np.zeros(S + 2, np.float32)
    nan = np.full(S, np.nan, np.float32)
    res = rt.infer(
        [
            InferItem(rt.new_pipeline(), good),
            InferItem(rt.new_pipeline(), bad),
            InferItem(rt.new_pipeline(), nan),
            InferItem(rt.new_pipeline(), good),
        ]
    )
    assert res[0].error is None and res[3].error is None
    assert "expects 4" in res[1].error and res[1].error_code == "BAD_TENSOR"
    assert "non-finite" in res[2].error
    np.testing.assert_allclose(res[0].chunk_robot, res[3].chunk_robot, atol=1e-6)


def test_an_observation_that_overflows_the_model_gets_non_finite_action_and_its_batch_is_served(tmp_path):
    """A finite state (and an RTC prefix) far outside the training range overflow the model to NaN: that sample
    is refused NON_FINITE_ACTION with no chunk; its batch neighbour is served exactly as alone."""
    rt = ModelRuntime(checkpoint(tmp_path))
    ok = np.zeros(S, np.float32)
    huge_state = InferItem(rt.new_pipeline(), np.full(S, 3e38, np.float32), {}, 2, None, None, rtc=True)
    huge_prefix = InferItem(rt.new_pipeline(), ok, {}, 2, None, np.full((4, A), 3e38, np.float32), rtc=True)
    bad_state, fine, bad_prefix = rt.infer([huge_state, items_for(rt, [ok])[0], huge_prefix])
    for bad in (bad_state, bad_prefix):
        assert bad.error_code == "NON_FINITE_ACTION" and bad.chunk_robot is None and bad.chunk_model is None
        assert "non-finite actions" in bad.error and "withheld" in bad.error
    alone = rt.infer(items_for(rt, [ok]))[0]
    assert fine.error is None and np.isfinite(fine.chunk_robot).all()
    np.testing.assert_allclose(fine.chunk_robot, alone.chunk_robot, rtol=0, atol=1e-5)


def test_a_checkpoint_with_a_nan_weight_is_refused_at_warm_up_and_never_yields_a_chunk(tmp_path):
    loaded = checkpoint(tmp_path)
    with torch.no_grad():
        next(loaded.policy.parameters()).view(-1)[0] = float("nan")
    rt = ModelRuntime(loaded)
    res = rt.infer(items_for(rt, [np.zeros(S, np.float32)] * 2))
    assert [r.error_code for r in res] == ["NON_FINITE_ACTION"] * 2 and all(r.chunk_robot is None for r in res)
    with pytest.raises(
        PolicyLoadError, match="warm-up forward pass on a zero observation: the policy produced non-finite actions"
    ):
        rt.warmup(1)


def test_a_float64_state_beyond_float32s_range_is_bad_tensor_without_a_numpy_warning(tmp_path):
    import warnings

    rt = ModelRuntime(checkpoint(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an "overflow encountered in cast" would land in the server log
        res = rt.infer([InferItem(rt.new_pipeline(), np.full(S, 1e300), {}, 0, None, None)])[0]
    assert res.error_code == "BAD_TENSOR" and "beyond float32's range" in res.error


def test_append_mode_ignores_the_prefix(tmp_path):
    rt = ModelRuntime(checkpoint(tmp_path))
    st = np.ones(S, np.float32)
    with_prefix = rt.infer(items_for(rt, [st], rtc=False))[0]
    without = rt.infer([InferItem(rt.new_pipeline(), st, rtc=False)])[0]
    np.testing.assert_array_equal(with_prefix.chunk_model, without.chunk_model)
    assert not with_prefix.rtc_applied


def test_emulated_latency_sets_the_forward_time_and_is_reported(tmp_path):
    rt = ModelRuntime(checkpoint(tmp_path, policy_type="mlp_chunk"), EmulatedLatency(mean_ms=30.0))
    res = rt.infer([InferItem(rt.new_pipeline(), np.zeros(S, np.float32))])[0]
    assert res.emulated_ms == 30.0 and res.forward_ms >= 29.0


@pytest.mark.parametrize("dist", ["fixed", "normal", "lognormal", "uniform"])
def test_emulated_latency_distributions_respect_bounds(dist):
    e = EmulatedLatency(distribution=dist, mean_ms=20, std_ms=5, min_ms=10, max_ms=40, per_batch_item_ms=1, seed=3)
    xs = [e.sample_ms(1) for _ in range(500)]
    assert min(xs) >= 10 and max(xs) <= 40
    assert e.sample_ms(5) >= 14  # per-item cost on top of the 10 ms floor


def test_local_predictor_matches_the_server_path(tmp_path):
    loaded = checkpoint(tmp_path)
    rt = ModelRuntime(loaded)
    lp = LocalPredictor(rt)
    st = np.arange(S, dtype=np.float32)
    prefix = np.ones((4, A), np.float32)
    model, robot = lp.predict_action_chunk({"state": st}, 2, prefix)
    ref = rt.infer([InferItem(rt.new_pipeline(), st, {}, 2, prefix, None, rtc=True)])[0]
    assert model.tobytes() == ref.chunk_model.tobytes() and robot.tobytes() == ref.chunk_robot.tobytes()


def _omp_team_size_in_new_thread(setup=None) -> int:
    """OpenMP's team size (nthreads-var) as a thread the process starts after import sees it."""
    import ctypes
    import threading

    libs = {line.split()[-1] for line in open("/proc/self/maps") if "libgomp" in line}
    if not libs:
        pytest.skip("this torch does not use libgomp")
    omp = ctypes.CDLL(sorted(libs)[0])
    got = []

    def run():
        if setup is not None:
            setup()
        got.append(omp.omp_get_max_threads())

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return got[0]


def test_set_torch_threads_sets_the_calling_threads_openmp_team():
    """A dispatch thread does not inherit the main thread's torch.set_num_threads: OpenMP keeps the team size
    per thread, so a new thread starts with the default (one per core unless OMP_NUM_THREADS says otherwise)."""
    import os

    from server.runtime import set_torch_threads

    torch.set_num_threads(1)  # in this (the main) thread only
    default = _omp_team_size_in_new_thread()
    if os.cpu_count() > 1 and "OMP_NUM_THREADS" not in os.environ:
        assert default == os.cpu_count()  # the hazard: the new thread's first large op spawns a spinning team
    assert _omp_team_size_in_new_thread(lambda: set_torch_threads(1)) == 1
    assert _omp_team_size_in_new_thread(lambda: set_torch_threads(3)) == 3


def test_local_predictor_runs_each_calling_thread_at_the_replicas_torch_threads(tmp_path):
    """The parity baseline must be the server's numbers: a replica's forward runs at its manifest's torch_threads
    (1 by default), and on an AVX-512 host a 2-thread pass of the reacher differed from the 1-thread one by up to
    3e-3 (rtc_parity then failed 1,224 of 1,500 action checks). A caller's thread of any count gets the same
    bytes, and is left at the replica's count."""
    import threading

    lp = LocalPredictor(ModelRuntime(checkpoint(tmp_path)))
    st = np.arange(S, dtype=np.float32)
    prefix = np.ones((4, A), np.float32)
    out = {}

    def call(threads_before: int) -> None:
        torch.set_num_threads(threads_before)
        lp.reset()
        out[threads_before] = (lp.predict_action_chunk({"state": st}, 2, prefix)[0], torch.get_num_threads())

    for n in (1, 4):
        t = threading.Thread(target=call, args=(n,))
        t.start()
        t.join()
    assert out[1][0].tobytes() == out[4][0].tobytes()
    assert out[1][1] == out[4][1] == 1


def test_a_policy_that_replays_cuda_graphs_is_called_from_one_thread_of_its_own():
    """torch 2.11's CUDA-graph trees are per thread (pytorch#123177): the warm-up (main thread) and each dispatch
    loop must not replay one capture from two threads, so LocalForward hands every call to one forward thread.
    A CPU compile replays no CUDA graph: calls stay on the caller's thread."""
    import threading

    from server.runtime import LocalForward, compiles_on_cuda

    class Recorder:
        hp = {"compile": True}
        param_device = torch.device("cpu")

        def __init__(self):
            self.threads = []

        def predict_action_chunk(self, batch, delays, prefixes):
            self.threads.append(threading.get_ident())
            return torch.full((len(delays), 2, 1), float(len(self.threads)))

    policy = Recorder()
    assert not compiles_on_cuda(policy)  # compile asked, but not on CUDA
    same = LocalForward(policy)
    same([], [0], [None])
    assert policy.threads == [threading.get_ident()]

    policy.threads.clear()
    forward = LocalForward(policy, one_thread=True)
    callers = []

    def call():
        callers.append(threading.get_ident())
        forward([], [0, 0], [None, None])

    call()
    others = [threading.Thread(target=call) for _ in range(3)]
    for t in others:
        t.start()
    for t in others:
        t.join()
    out = forward([], [0], [None])
    assert out.shape == (1, 2, 1) and float(out[0, 0, 0]) == 5.0  # the result comes back to the caller
    assert len(set(policy.threads)) == 1 and not set(policy.threads) & set(callers + [threading.get_ident()])
    forward.close()


def test_compiled_models_on_one_device_share_its_forward_thread_at_the_replicas_torch_threads():
    """Two compiled models of one size share Dynamo's graphs, so their CUDA-graph replays must come from one
    thread: the device's (not the model's), which runs with the torch thread count of the replica that made it."""
    import threading
    import uuid

    from server.runtime import LocalForward

    device = f"test-device-{uuid.uuid4().hex[:8]}"  # a device of this test's own: the threads are the process's

    class Recorder:
        hp = {"compile": True}
        param_device = device

        def __init__(self):
            self.seen = []

        def predict_action_chunk(self, batch, delays, prefixes):
            self.seen.append((threading.get_ident(), torch.get_num_threads()))
            return torch.zeros(len(delays), 2, 1)

    first, second = Recorder(), Recorder()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        a, b = LocalForward(first, one_thread=True), LocalForward(second, one_thread=True)
    finally:
        torch.set_num_threads(threads)
    a([], [0], [None])
    b([], [0], [None])
    a.close()  # one model's close leaves the device's thread to the other
    b([], [0], [None])
    assert a._thread is b._thread
    assert {t for t, _ in first.seen + second.seen} == {first.seen[0][0]} != {threading.get_ident()}
    assert {n for _, n in first.seen + second.seen} == {1}


def _camera_runtime(decoder):
    """A tiny flow_transformer with one 32x32 camera, its frames decoded by `decoder` (a GpuJpegDecoder)."""
    from benchmarks.gpu_forward import build
    from server.policies.checkpoint import LoadedCheckpoint
    from server.policies.stats import stats_to_tensors

    policy = build("tiny", 1, 32, "cpu", False)
    cfg = policy.config
    stats = {
        "observation.state": {"mean": [0.0] * cfg.state_dim, "std": [1.0] * cfg.state_dim},
        "action": {"mean": [0.0] * cfg.action_dim, "std": [1.0] * cfg.action_dim},
    }
    runtime = ModelRuntime(LoadedCheckpoint(policy, cfg, stats_to_tensors(stats), "test", {}))
    runtime.jpeg_decoder = decoder
    return runtime


class _SlowDecoder:
    """Stands in for nvjpeg on this host (PIL on the CPU); each batch call takes `delay_s` and is counted."""

    def __init__(self, delay_s: float = 0.0):
        self.delay_s, self.calls = delay_s, []

    def __call__(self, data, device):
        import io
        import time

        from PIL import Image

        frames = data if isinstance(data, list) else [data]
        self.calls.append(len(frames))
        time.sleep(self.delay_s)
        out = [
            torch.from_numpy(np.array(Image.open(io.BytesIO(bytes(f.numpy()))).convert("RGB"))).permute(2, 0, 1)
            for f in frames
        ]
        return out if isinstance(data, list) else out[0]


def test_the_batchs_gpu_jpeg_decode_is_counted_in_each_items_server_time():
    """On the H200 the batch's nvjpeg call ran before the per-item clock: its time was in no server figure, so
    the bench read it as network. Every item waited for the whole call: it is in each one's preprocess time."""
    from server.accel import GpuJpegDecoder
    from wire.images import encode_image

    slow = _SlowDecoder(delay_s=0.05)
    runtime = _camera_runtime(GpuJpegDecoder(torch.device("cpu"), slow))
    frame = encode_image(np.full((32, 32, 3), 128, np.uint8), "jpeg", 90)
    items = [
        InferItem(
            runtime.new_pipeline(),
            np.zeros(runtime.config.state_dim, np.float32),
            {"front": frame},
            0,
            None,
            None,
            rtc=False,
        )
        for _ in range(3)
    ]
    results = runtime.infer(items, emulate=False)
    assert slow.calls == [3] and all(r.error is None for r in results)
    assert all(r.preprocess_ms >= 50.0 for r in results)
    assert all(r.inference_ms >= r.preprocess_ms + r.forward_ms for r in results)


def test_warm_up_sends_jpeg_frames_through_the_gpu_decoder():
    """The first request after a start paid ~0.7 s outside its forward pass on the H200 while warm-up frames were
    raw arrays: with a GPU decoder, warm-up frames are JPEGs and go through it."""
    from server.accel import GpuJpegDecoder

    slow = _SlowDecoder()
    runtime = _camera_runtime(GpuJpegDecoder(torch.device("cpu"), slow))
    runtime.warmup(2)
    assert len(slow.calls) == 4 and set(slow.calls) == {1}  # two rounds, guided and plain: one frame each call
    plain = _camera_runtime(None)
    assert plain.warmup(1) > 0  # no GPU decoder: raw frames, as before


def test_the_unloaded_reference_sends_frames_the_way_requests_do():
    """The unloaded forward time is the reference the bench reads a replica's passes against. On a GPU replica it
    passed raw frames (stacked on the host and copied over inside the timed pass) while requests' JPEGs decode
    on the GPU: a path no request takes. With a GPU decoder its frames are JPEGs through it, one call per pass;
    without one, raw frames as before."""
    from server.accel import GpuJpegDecoder

    slow = _SlowDecoder()
    runtime = _camera_runtime(GpuJpegDecoder(torch.device("cpu"), slow))
    table = runtime.unloaded_forward_ms(4, repeats=2)  # the tiny preset pads to buckets 1/8/...: a batch of 4 runs 8
    assert sorted(table) == [1, 2, 8] and all(v > 0 for v in table.values())
    assert slow.calls == [1, 1, 8, 8]  # each pass's frames through the decoder, as a batch of requests'
    plain = _camera_runtime(None)
    assert sorted(plain.unloaded_forward_ms(2, repeats=1)) == [1, 2, 8]


def test_a_padding_replicas_unloaded_reference_is_timed_at_its_buckets_and_read_as_steps():
    """A replica that pads each batch to a bucket runs a batch of 40 at bucket 64's cost. Its reference was timed
    at 1, 2, 4, ... and the bench interpolated: on an H100 at 128 sessions (p50 batch 40) it read ~53 ms for a 73 ms
    pass and called the 20 ms between them the bench's share. Now it is timed at each bucket, and each bucket's
    time is given at the smallest batch padded to it too, so the bench's reading is the bucket's time."""
    from bench.evidence.fidelity import _at_batch
    from server.accel import GpuJpegDecoder

    slow = _SlowDecoder()
    runtime = _camera_runtime(GpuJpegDecoder(torch.device("cpu"), slow))
    runtime.policy.hp["batch_buckets"] = [1, 4, 8]
    assert runtime.padding_buckets(8) == [1, 4, 8] and runtime.padding_buckets(3) == [1, 4]
    table = runtime.unloaded_forward_ms(8, repeats=1)
    assert set(slow.calls) == {1, 4, 8}  # one timed pass a bucket, at the bucket's size
    assert sorted(table) == [1, 2, 4, 5, 8]
    assert table[2] == table[4] and table[5] == table[8]
    read = _at_batch(table, np.array([2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]))
    assert list(read[:3]) == [table[4]] * 3 and list(read[3:]) == [table[8]] * 4
    runtime.policy.hp["batch_buckets"] = []  # no padding: every size its own, as before
    assert runtime.padding_buckets(8) == [] and sorted(runtime.unloaded_forward_ms(8, repeats=1)) == [1, 2, 4, 8]


class _LateChunks:
    """A batch of chunks whose copy to the host waits `delay_s`, as a CUDA pass's does: its kernels run after the
    call returns, and the copy waits for them."""

    def __init__(self, chunks: torch.Tensor, delay_s: float):
        self.chunks, self.delay_s = chunks, delay_s

    def detach(self):
        return self

    def to(self, *args, **kwargs):
        import time

        time.sleep(self.delay_s)
        return self.chunks.to(*args, **kwargs)


def test_the_forward_time_includes_the_wait_for_the_devices_results():
    """On an H100 the replica timed its pass before the chunks' copy to the host, which waits for the GPU: 14-35 ms
    p50 of every pass was in no server figure and the bench read it as network. The copy is in the pass's time."""
    runtime = _camera_runtime(None)
    eager = runtime.forward
    runtime.forward = lambda batch, delays, prefixes: _LateChunks(eager(batch, delays, prefixes), 0.05)
    items = runtime._dummy_items(2, runtime._warmup_frames(), False)
    results = runtime.infer(items, emulate=False)
    assert all(r.error is None and r.chunk_model is not None for r in results)
    assert all(r.forward_ms >= 50.0 for r in results)
    assert all(r.inference_ms >= r.forward_ms for r in results)


def test_a_missing_camera_frame_is_camera_mismatch_and_a_frame_of_another_form_is_bad_image():
    """The wire's codes say what is wrong with a camera's frame: none sent for a declared camera is CAMERA_MISMATCH,
    one that is no (H, W, 3) uint8 RGB image BAD_IMAGE; a good frame beside them is served."""
    runtime = _camera_runtime(None)
    name = next(iter(runtime.config.image_features))
    state = np.zeros(runtime.config.state_dim, np.float32)
    good = {name: np.zeros((32, 32, 3), np.uint8)}
    res = runtime.infer(
        [
            InferItem(runtime.new_pipeline(), state, {}),
            InferItem(runtime.new_pipeline(), state, {name: np.zeros((32, 32, 1), np.uint8)}),
            InferItem(runtime.new_pipeline(), state, {name: np.zeros((32, 32, 3), np.float32)}),
            InferItem(runtime.new_pipeline(), state, good),
        ]
    )
    assert res[0].error_code == "CAMERA_MISMATCH" and name in res[0].error
    assert res[1].error_code == "BAD_IMAGE" and res[2].error_code == "BAD_IMAGE" and "uint8 RGB" in res[1].error
    assert res[3].error is None and res[3].chunk_robot is not None
