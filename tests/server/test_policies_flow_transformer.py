"""flow_transformer: sizes from config (tiny on CPU, >= 300M preset counted on the meta device), RTC
guidance through autograd, per-sample batching with bucket padding, cameras, no host sync in the loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from server.policies import (
    POLICY_REGISTRY,
    PolicyConfig,
    PolicyConfigError,
    classify,
    load_checkpoint,
    make_policy,
    save_checkpoint,
)
from server.policies.flow_matching import prefix_mask, sample_committed
from server.policies.flow_transformer import (
    COMPILE_BUCKETS,
    CompiledPath,
    FlowTransformerPolicy,
    check_cpu_compiler,
    count_parameters,
    graph_safe,
    preset_hyper_params,
)
from server.policies.stats import compute_stats

S, A, T, H = 6, 3, 12, 6
TINY = {"d_model": 32, "num_heads": 4, "num_layers": 2, "obs_layers": 1, "mlp_ratio": 2, "num_steps": 4}


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def config(**kw) -> PolicyConfig:
    hp = {**TINY, **kw.pop("hyper_params", {})}
    return PolicyConfig(
        type="flow_transformer",
        state_dim=S,
        action_dim=A,
        chunk_size=T,
        fps=10,
        execution_horizon=H,
        hyper_params=hp,
        **kw,
    )


def policy(**kw) -> FlowTransformerPolicy:
    torch.manual_seed(0)
    return make_policy(config(**kw)).eval().requires_grad_(False)  # type: ignore[return-value]


def states(size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    return {"observation.state": torch.randn(size, S, generator=torch.Generator().manual_seed(seed))}


def rows(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, A, generator=torch.Generator().manual_seed(100 + seed))


def test_registered_stateless_with_rtc():
    assert POLICY_REGISTRY["flow_transformer"] is FlowTransformerPolicy
    assert classify(FlowTransformerPolicy) == "stateless" and FlowTransformerPolicy.supports_rtc


def test_the_vla_preset_has_at_least_300m_parameters_counted_without_allocating():
    cfg = PolicyConfig(
        type="flow_transformer",
        state_dim=32,
        action_dim=32,
        chunk_size=50,
        fps=50,
        image_features={"front": [3, 224, 224], "wrist": [3, 224, 224]},
        hyper_params=preset_hyper_params("vla_300m"),
    )
    assert count_parameters(cfg) >= 300_000_000
    tiny = PolicyConfig(
        type="flow_transformer",
        state_dim=10,
        action_dim=2,
        chunk_size=30,
        fps=30,
        hyper_params=preset_hyper_params("tiny"),
    )
    assert count_parameters(tiny) < 500_000  # the same class, trainable on one CPU thread


def test_bad_sizes_are_refused_naming_the_field():
    with pytest.raises(PolicyConfigError, match="multiple of num_heads"):
        make_policy(config(hyper_params={"d_model": 30, "num_heads": 4}))
    with pytest.raises(PolicyConfigError, match="patch_size"):
        make_policy(
            config(image_features={"front": [3, 20, 20]}, hyper_params={"image_encoder": "vit", "patch_size": 8})
        )
    with pytest.raises(PolicyConfigError, match="image_encoder"):
        make_policy(config(hyper_params={"image_encoder": "resnet"}))


def test_output_is_deterministic_and_each_sample_is_computed_as_if_alone():
    p = policy()
    batch = states(4)
    delays = [0, 2, 5, 1]
    prefixes = [rows(8, 0), None, rows(3, 2), rows(12, 3)]
    together = p.predict_action_chunk(batch, delays, prefixes)
    assert together.shape == (4, T, A) and together.dtype == torch.float32
    torch.testing.assert_close(together, p.predict_action_chunk(batch, delays, prefixes), rtol=0, atol=0)
    for b in range(4):
        alone = p.predict_action_chunk(
            {"observation.state": batch["observation.state"][b : b + 1]}, [delays[b]], [prefixes[b]]
        )
        torch.testing.assert_close(together[b], alone[0], rtol=1e-5, atol=1e-5)


def test_bucket_padding_changes_no_sample():
    plain = policy()
    padded = policy(hyper_params={"batch_buckets": [4, 8]})
    assert [padded.bucket(n) for n in (1, 4, 5, 8, 9)] == [4, 4, 8, 8, 9]
    batch = states(3)
    args = ([1, 0, 3], [rows(6, 1), None, rows(6, 2)])
    out = padded.predict_action_chunk(batch, *args)
    assert out.shape == (3, T, A)
    torch.testing.assert_close(out, plain.predict_action_chunk(batch, *args), rtol=1e-5, atol=1e-5)


def test_guidance_pulls_the_frozen_rows_toward_the_prefix_and_none_is_unguided():
    p = policy()
    batch = states(1, seed=3)
    free = p.predict_action_chunk(batch, [0], [None])
    prefix = free[0, :H] + 2.0  # far from where the unguided chunk goes
    guided = p.predict_action_chunk(batch, [3], [prefix])
    before = (free[0, :3] - prefix[:3]).abs().mean()
    after = (guided[0, :3] - prefix[:3]).abs().mean()
    assert after < 0.5 * before
    empty = p.predict_action_chunk(batch, [3], [torch.zeros(0, A)])
    torch.testing.assert_close(empty, free, rtol=0, atol=0)


def test_network_guidance_is_the_vjp_of_x1_hat():
    """The correction is (I - t J_v)^T err: checked against torch.func.vjp of the same function."""
    p = policy()
    context = p.context(p.encode(states(2)))
    gen = torch.Generator().manual_seed(7)
    x_t = torch.randn(2, T, A, generator=gen)
    weights = torch.rand(2, T, 1, generator=gen)
    target = torch.randn(2, T, A, generator=gen)
    t = 0.6
    t_batch = torch.full((2,), t)
    guided = p._guided_velocity(p.velocity, x_t, t, t_batch, context, 1.0, weights, target)

    def x1_hat(x):
        return x - t * p.velocity(x, t_batch, context)

    value, vjp = torch.func.vjp(x1_hat, x_t)
    (expected,) = vjp((target - value) * weights)
    torch.testing.assert_close(p.velocity(x_t, t_batch, context) - guided, expected, rtol=1e-5, atol=1e-5)


def test_runs_under_inference_mode_callers():
    p = policy()
    with torch.inference_mode():
        batch = states(2)
        out = p.predict_action_chunk(batch, [1, 1], [rows(6, 0), None])
    torch.testing.assert_close(out, p.predict_action_chunk(states(2), [1, 1], [rows(6, 0), None]), rtol=0, atol=0)


class ReplayStandIn:
    """What a CUDA-graph replay does to its caller (torch.compile's reduce-overhead): every call writes into the
    same output buffer and returns it. Counts the calls that came with autograd on."""

    def __init__(self, velocity):
        self.velocity, self.buffer, self.calls, self.grad_calls = velocity, None, 0, 0

    def __call__(self, *args):
        self.calls += 1
        self.grad_calls += torch.is_grad_enabled()
        with torch.no_grad():
            out = self.velocity(*args)
        if self.buffer is None or self.buffer.shape != out.shape:
            self.buffer = torch.empty_like(out)
        return self.buffer.copy_(out)


@pytest.mark.parametrize("rtc_mode", ["guidance", "training_time"])
def test_a_graph_replayed_velocity_gives_the_eager_chunks(rtc_mode):
    """graph_safe: plain and training-time calls go to the replayed network and keep their output past the next
    replay; the guided sampler's VJP runs eager. Chunks equal the eager policy's, guided or not."""
    eager = policy(hyper_params={"rtc_mode": rtc_mode})
    replayed = policy(hyper_params={"rtc_mode": rtc_mode})
    stand_in = ReplayStandIn(replayed.velocity)
    replayed._velocity_fn = graph_safe(stand_in, replayed.velocity)
    batch = states(3, seed=5)
    args = ([2, 0, 3], [rows(6, 1), None, rows(6, 2)])
    torch.testing.assert_close(
        replayed.predict_action_chunk(batch, *args), eager.predict_action_chunk(batch, *args), rtol=1e-5, atol=1e-5
    )
    assert stand_in.grad_calls == 0
    assert stand_in.calls == (int(TINY["num_steps"]) if rtc_mode == "training_time" else 0)  # guided: all eager
    unguided = ([0, 0, 0], [None, None, None])
    torch.testing.assert_close(
        replayed.predict_action_chunk(batch, *unguided),
        eager.predict_action_chunk(batch, *unguided),
        rtol=1e-5,
        atol=1e-5,
    )
    assert stand_in.calls >= int(TINY["num_steps"])
    context = replayed.context(replayed.encode(states(2)))
    x_t = torch.randn(2, T, A, generator=torch.Generator().manual_seed(4))
    first = replayed._velocity_fn(x_t, torch.full((2,), 0.9), context)
    kept = first.clone()
    replayed._velocity_fn(x_t + 1.0, torch.full((2,), 0.5), context)
    torch.testing.assert_close(first, kept, rtol=0, atol=0)  # not overwritten by the next replay


def _cpu_compiler_or_skip():
    try:
        check_cpu_compiler()
    except PolicyConfigError as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("rtc_mode", ["guidance", "training_time"])
def test_compile_on_a_cpu_runs_inductor_kernels_per_bucket_with_the_eager_chunks(rtc_mode):
    """`compile` on a CPU: the velocity network is compiled (inductor's C++) once per bucket; the plain, the
    training-time and the guided sampler (its VJP through the compiled backward) call it; no path fell back to
    eager, and chunks equal the eager policy's."""
    _cpu_compiler_or_skip()
    from torch._dynamo.utils import counters

    hp = {"rtc_mode": rtc_mode, "batch_buckets": [4]}
    eager, compiled = policy(hyper_params=hp), policy(hyper_params={**hp, "compile": True})
    graphs = counters["stats"]["unique_graphs"]
    batch = states(3, seed=7)
    for args in (([2, 0, 3], [rows(6, 1), None, rows(6, 2)]), ([0, 0, 0], [None, None, None])):
        torch.testing.assert_close(
            compiled.predict_action_chunk(batch, *args), eager.predict_action_chunk(batch, *args), rtol=1e-4, atol=1e-4
        )
    assert compiled._compiled and compiled._velocity_fn is not compiled.velocity
    assert counters["stats"]["unique_graphs"] > graphs  # Dynamo captured (and inductor built) the network
    assert compiled.compile_fallbacks == []  # compiled, not eager behind the same chunks
    torch.testing.assert_close(
        compiled.predict_action_chunk(states(4, seed=8), [0] * 4, [None] * 4),
        eager.predict_action_chunk(states(4, seed=8), [0] * 4, [None] * 4),
        rtol=1e-4,
        atol=1e-4,
    )
    compiled.override_hyper_params({"compile": False})  # turned off again: the eager network from the next call
    compiled.predict_action_chunk(states(1), [0], [None])
    assert not compiled._compiled and compiled._velocity_fn == compiled.velocity


def test_compiled_policies_of_one_process_share_graphs_but_each_runs_its_own_weights():
    """Dynamo's graphs of `velocity` take the weights as inputs, so a second model of the same size reuses the
    first's compiled graph (no new graph): with its own weights, and the recompile limit counts both."""
    _cpu_compiler_or_skip()
    import torch._dynamo.config as dynamo_config
    from torch._dynamo.utils import counters

    first, second = policy(hyper_params={"compile": True}), policy(hyper_params={"compile": True})
    with torch.no_grad():
        for p in second.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    before = FlowTransformerPolicy.compiled_shapes
    chunks = [first.predict_action_chunk(states(2), [0, 0], [None, None])]
    graphs = counters["stats"]["unique_graphs"]
    chunks.append(second.predict_action_chunk(states(2), [0, 0], [None, None]))
    assert counters["stats"]["unique_graphs"] == graphs and second.compile_fallbacks == []
    assert FlowTransformerPolicy.compiled_shapes == before + 2 * (
        3 * len(COMPILE_BUCKETS) + 2
    )  # per bucket and signature
    assert dynamo_config.recompile_limit >= FlowTransformerPolicy.compiled_shapes
    for p, chunk in zip((first, second), chunks):
        p._velocity_fn = p.velocity  # its eager network
        torch.testing.assert_close(chunk, p.predict_action_chunk(states(2), [0, 0], [None, None]), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(chunks[0], chunks[1])


def test_the_guided_vjp_runs_the_differentiable_compile_where_one_is_given():
    """On CUDA the guided sampler's autograd calls go to a compile without CUDA graphs (`differentiable`), never to
    the replayed network; chunks equal the eager policy's."""
    eager = policy()
    replayed_policy = policy()
    stand_in = ReplayStandIn(replayed_policy.velocity)
    grads = []

    def differentiable(*args):
        grads.append(torch.is_grad_enabled())
        return replayed_policy.velocity(*args)

    replayed_policy._velocity_fn = graph_safe(stand_in, replayed_policy.velocity, differentiable)
    batch, args = states(2, seed=3), ([2, 1], [rows(6, 1), rows(6, 2)])
    torch.testing.assert_close(
        replayed_policy.predict_action_chunk(batch, *args),
        eager.predict_action_chunk(batch, *args),
        rtol=1e-5,
        atol=1e-5,
    )
    assert grads == [True] * int(TINY["num_steps"]) and stand_in.calls == 0


def test_a_compile_that_fails_runs_eager_says_why_and_is_not_retried(caplog):
    """A backend error at the first call (here a backend that raises, as inductor would on a broken toolchain):
    that path runs the eager network from then on, the chunk is the eager one, and the reason is logged once."""
    calls = []

    def broken_backend(gm, example_inputs):
        calls.append(1)
        raise RuntimeError("no toolchain")

    p, eager = policy(), policy()
    fn = CompiledPath(
        torch.compile(p.velocity, backend=broken_backend, dynamic=False),
        p.velocity,
        "the test network",
        p.compile_fallbacks,
    )
    p._velocity_fn, p._compiled, p.hp["compile"] = fn, True, True
    out = [p.predict_action_chunk(states(2), [0, 0], [None, None]) for _ in range(2)]
    for chunk in out:
        torch.testing.assert_close(chunk, eager.predict_action_chunk(states(2), [0, 0], [None, None]), rtol=0, atol=0)
    assert len(calls) == 1 and len(p.compile_fallbacks) == 1
    assert "compiling the test network failed, it runs eager" in p.compile_fallbacks[0]
    assert "no toolchain" in p.compile_fallbacks[0] and "runs eager" in caplog.text


def test_a_compiled_backward_that_fails_leaves_the_guided_vjp_eager():
    """The guided VJP's backward is compiled at its first autograd.grad, after the compiled forward returned: a
    failure there (a backward compiler that raises) gives the eager step's chunk, once recorded, and later guided
    calls run eager without trying it again."""
    from torch._dynamo.backends.common import aot_autograd

    forwards, backwards = [], []

    def fw(gm, example_inputs):
        forwards.append(1)
        return gm

    def bw(gm, example_inputs):
        backwards.append(1)
        raise RuntimeError("no backward compiler")

    p, eager = policy(), policy()
    path = CompiledPath(
        torch.compile(p.velocity, backend=aot_autograd(fw_compiler=fw, bw_compiler=bw), dynamic=False),
        p.velocity,
        "the guided network",
        p.compile_fallbacks,
    )
    p._velocity_fn, p._grad_path, p._compiled, p.hp["compile"] = path, path, True, True
    args = ([2, 1], [rows(6, 1), rows(6, 2)])
    for _ in range(2):
        torch.testing.assert_close(
            p.predict_action_chunk(states(2, seed=3), *args),
            eager.predict_action_chunk(states(2, seed=3), *args),
            rtol=1e-5,
            atol=1e-5,
        )
    assert forwards and len(backwards) == 1 and path.failed
    assert len(p.compile_fallbacks) == 1
    assert p.compile_fallbacks[0].startswith("compiling the guided network failed, it runs eager: ")
    assert "no backward compiler" in p.compile_fallbacks[0]


def test_the_recompile_limit_holds_in_the_thread_that_calls():
    """torch's config overrides are per thread: a limit raised where the policy loaded (the main thread) must hold
    in a dispatch thread too, or its 9th graph runs eager (seen in a replica: "hit config.recompile_limit (8)")."""
    import threading

    import torch._dynamo.config as dynamo_config

    p = policy(hyper_params={"compile": True})
    p._compiled = True  # as after a compile (none needed to set the limit)
    p._maybe_compile(torch.device("cpu"))
    seen = []

    def dispatch():
        p._maybe_compile(torch.device("cpu"))  # what each predict_action_chunk does first
        seen.append(int(dynamo_config.recompile_limit))

    t = threading.Thread(target=dispatch)
    t.start()
    t.join()
    assert seen and seen[0] >= FlowTransformerPolicy.compiled_shapes > 8


def test_compile_without_buckets_pads_to_powers_of_two_and_eager_never_pads():
    """Without `batch_buckets` every batch size would compile a graph of its own (past Dynamo's limit, silently
    eager): under `compile` a batch is padded to COMPILE_BUCKETS; an eager pass, which padding only slows, is not."""
    assert policy(hyper_params={"compile": True}).bucket(5) == 8
    assert policy(hyper_params={"compile": True}).bucket(65) == 65  # past the largest: its own size
    assert policy().bucket(5) == 5
    assert policy(hyper_params={"compile": True, "batch_buckets": [6, 12]}).bucket(5) == 6


def test_buckets_changed_after_a_compile_raise_the_recompile_limit_again():
    """An override of `batch_buckets` after the network compiled adds specialisations: they are counted too, so
    Dynamo's limit never silently sends the new buckets to eager."""
    import torch._dynamo.config as dynamo_config

    p = policy(hyper_params={"compile": True})
    p._compiled = True  # as after a compile (none needed to count)
    p._maybe_compile(torch.device("cpu"))
    before = FlowTransformerPolicy.compiled_shapes
    p._maybe_compile(torch.device("cpu"))
    assert FlowTransformerPolicy.compiled_shapes == before  # the same buckets: counted once
    p.override_hyper_params({"batch_buckets": [1, 8, 16]})
    p._maybe_compile(torch.device("cpu"))
    assert FlowTransformerPolicy.compiled_shapes == before + 3 * 3 + 2
    assert dynamo_config.recompile_limit >= FlowTransformerPolicy.compiled_shapes


def test_a_failure_the_eager_network_shares_is_raised_and_the_compile_kept():
    """Bad inputs fail eager too: that error is raised, and the compiled path stays (nothing recorded)."""
    fallbacks = []

    def compiled(x):
        raise ValueError("compiled: bad shape")

    def eager_fn(x):
        raise ValueError("eager: bad shape")

    path = CompiledPath(compiled, eager_fn, "the network", fallbacks)
    with pytest.raises(ValueError, match="eager: bad shape"):
        path(torch.zeros(1))
    assert not path.failed and fallbacks == []


def test_compile_on_a_cpu_without_a_cpp_compiler_is_refused_saying_what_to_do():
    import torch._inductor.config as inductor_config

    p = policy(hyper_params={"compile": True})
    with inductor_config.patch({"cpp.cxx": ("/nonexistent/cxx",)}):
        with pytest.raises(PolicyConfigError, match=r"needs a C\+\+ compiler.*install g\+\+.*compile: false"):
            p.predict_action_chunk(states(1), [0], [None])
    assert not p._compiled and p._velocity_fn == p.velocity  # nothing half-set: a fixed host can try again


@pytest.mark.parametrize("encoder", ["conv", "vit"])
def test_cameras_become_tokens_that_change_the_chunk(encoder):
    p = policy(
        image_features={"front": [3, 32, 32], "wrist": [3, 32, 32]},
        hyper_params={"image_encoder": encoder, "patch_size": 8},
    )
    memory_tokens = 1 + 2 * (4 if encoder == "conv" else 16)
    batch = {
        **states(2),
        "observation.images.front": torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)),
        "observation.images.wrist": torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(2)),
    }
    assert p.encode(batch).shape == (2, memory_tokens, TINY["d_model"])
    out = p.predict_action_chunk(batch, [0, 0], [None, None])
    other = dict(batch, **{"observation.images.front": torch.zeros(2, 3, 32, 32)})
    assert not torch.allclose(out, p.predict_action_chunk(other, [0, 0], [None, None]))


def test_the_written_out_attention_is_multihead_attentions():
    """The blocks keep nn.MultiheadAttention's weights and compute what it computes (a checkpoint trained before
    serves the same chunks), the cross-attention from keys and values projected once (`memory_kv`)."""
    p = policy(image_features={"front": [3, 32, 32]}, hyper_params={"image_encoder": "vit", "patch_size": 8})
    gen = torch.Generator().manual_seed(3)
    for block in [*p.obs_blocks, *p.blocks]:  # zero-initialised weights would hide a swapped q/k/v
        for param in block.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    memory, h = torch.randn(2, 17, TINY["d_model"], generator=gen), torch.randn(2, T, TINY["d_model"], generator=gen)
    for block in p.obs_blocks:
        torch.testing.assert_close(
            block._self_attention(memory), block.attn(memory, memory, memory, need_weights=False)[0]
        )
    for block in p.blocks:
        torch.testing.assert_close(block._self_attention(h), block.attn(h, h, h, need_weights=False)[0])
        torch.testing.assert_close(
            block._cross_attention(h, *block.memory_kv(memory)),
            block.cross_attn(h, memory, memory, need_weights=False)[0],
        )
    assert p.context(memory)[1].shape == (2, TINY["num_heads"], 17, TINY["d_model"] // TINY["num_heads"])


@pytest.mark.parametrize("rtc_mode", ["guidance", "training_time"])
def test_the_observation_is_projected_once_per_call_not_per_euler_step(rtc_mode, monkeypatch):
    """Each action block projects the memory to its keys and values once per call (the context), whatever the
    number of Euler steps and whether the steps are guided."""
    p = policy(hyper_params={"rtc_mode": rtc_mode})
    calls = []
    real = type(p.blocks[0]).memory_kv
    monkeypatch.setattr(
        type(p.blocks[0]), "memory_kv", lambda block, memory: calls.append(block) or real(block, memory)
    )
    p.predict_action_chunk(states(2), [2, 0], [rows(H, 0), None])
    assert len(calls) == TINY["num_layers"] and set(map(id, calls)) == set(map(id, p.blocks))
    assert TINY["num_steps"] > 1


class HostSyncs(TorchDispatchMode):
    """Records the ops that make the host wait for the device: a tensor read back as a Python value."""

    SYNC_OPS = ("aten._local_scalar_dense", "aten.is_nonzero", "aten.item")

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name in self.SYNC_OPS:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def test_the_sampling_loop_never_reads_a_device_value_back():
    p = policy()
    with torch.no_grad():
        context = p.context(p.encode(states(3)))
        guidance = p._guidance_targets([1, 0, 2], [rows(6, 0), None, rows(4, 1)], 3)
        noise = p._noise(3)
    committed = prefix_mask([1, 0, 2], [rows(6, 0), None, rows(4, 1)], T, A, p.param_device, p.param_dtype)
    with HostSyncs() as mode:
        p.sample(context, noise, guidance)
        p.sample(context, noise, None)
        sample_committed(p.velocity, context, noise, *committed, 4)  # rtc_mode training_time's loop
    assert mode.seen == []
    with HostSyncs() as mode:  # the detector does see a read-back
        float(noise.sum())
    assert mode.seen


def test_checkpoint_round_trip_gives_identical_chunks(tmp_path):
    p = policy()
    rng = np.random.default_rng(0)
    stats = compute_stats(rng.normal(size=(16, S)).astype(np.float32), rng.normal(size=(16, T, A)).astype(np.float32))
    save_checkpoint(p, stats, tmp_path / "ckpt")
    loaded = load_checkpoint(tmp_path / "ckpt")
    args = (states(2), [2, 0], [rows(6, 0), None])
    torch.testing.assert_close(loaded.policy.predict_action_chunk(*args), p.predict_action_chunk(*args), rtol=0, atol=0)


def test_training_loss_falls_on_a_fixed_batch():
    torch.manual_seed(0)
    p = make_policy(config())
    optimizer = torch.optim.AdamW(p.parameters(), lr=3e-3)
    batch = states(32)
    target = batch["observation.state"][:, None, :A].expand(32, T, A).contiguous()
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(60):
        loss = p.training_loss(batch, target, generator=gen)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the bf16 autocast path runs only on a GPU")
def test_bf16_autocast_on_cuda_returns_float32_close_to_float32():
    p = policy().to("cuda")
    batch = {k: v.cuda() for k, v in states(4).items()}
    out = p.predict_action_chunk(batch, [1] * 4, [rows(6, 0).cuda(), None, None, rows(6, 1).cuda()])
    assert out.dtype == torch.float32 and out.is_cuda
    p.hp["autocast"] = "none"
    reference = p.predict_action_chunk(batch, [1] * 4, [rows(6, 0).cuda(), None, None, rows(6, 1).cuda()])
    torch.testing.assert_close(out, reference, rtol=0.1, atol=0.1)


def test_the_shipped_vla_checkpoint_config_is_the_300m_preset_with_two_224_cameras():
    from pathlib import Path

    directory = Path(__file__).resolve().parents[2] / "bench" / "checkpoints" / "reacher_vla"
    cfg = PolicyConfig.from_json((directory / "config.json").read_text())
    assert cfg.type == "flow_transformer" and cfg.fps == 15.0
    assert cfg.image_features == {"front": [3, 224, 224], "wrist": [3, 224, 224]}
    assert count_parameters(cfg) >= 300_000_000
    # training-time RTC: the guided eager pass (354 ms p50 on an H200) is longer than capacity_gpu's 333 ms budget
    assert cfg.hyper_params["rtc_mode"] == "training_time"


def test_init_weights_makes_a_loadable_seeded_checkpoint_from_config_and_stats(tmp_path):
    from server.policies.checkpoint import CheckpointError, init_weights

    p = policy()
    rng = np.random.default_rng(0)
    save_checkpoint(
        p,
        compute_stats(rng.normal(size=(8, S)).astype(np.float32), rng.normal(size=(8, T, A)).astype(np.float32)),
        tmp_path / "a",
    )
    (tmp_path / "a" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(tmp_path / "a")
    init_weights(tmp_path / "a", seed=3)
    first = load_checkpoint(tmp_path / "a")
    init_weights(tmp_path / "a", seed=3)
    assert load_checkpoint(tmp_path / "a").checkpoint_hash == first.checkpoint_hash
    out = first.policy.predict_action_chunk(states(1), [0], [None])
    assert out.shape == (1, T, A) and torch.isfinite(out).all()
    with pytest.raises(CheckpointError, match="stats.json"):
        init_weights(tmp_path / "empty")


def test_the_time_embeddings_frequencies_are_never_cached_from_inside_a_compile():
    """The embedding caches its frequencies per device, but one made inside torch.compile is the graph's output:
    under CUDA graphs the next replay overwrites it, and a replica whose first call was compiled (the server's
    warm-up) failed its second bucket on an H100 ("accessing tensor output of CUDAGraphs that has been
    overwritten"). Computed in the graph there, cached only by an eager call."""
    from server.policies import layers

    layers._FREQS.clear()
    try:
        compiled = torch.compile(lambda t: layers.time_embedding(t, 8), backend="eager", dynamic=False)
        t = torch.tensor([0.0, 0.5, 1.0])
        out = compiled(t)
        assert layers._FREQS == {}
        assert torch.equal(out, layers.time_embedding(t, 8))  # the same features, eager
        assert list(layers._FREQS) == [(4, "cpu")]
    finally:
        layers._FREQS.clear()
