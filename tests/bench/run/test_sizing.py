"""The bench's cost model (bench.run.sizing): shard count and preflight estimate from ticks, requests,
physics substeps and the replicas' forward passes; the request rate an engine keeps; the forward cost's cache
(bench.run.forwardcost)."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.run.forwardcost import ForwardCost, checkpoint_hash, constant, forward_cost
from bench.run.sizing import (
    REPLICA_FORWARD_MS,
    batch_size,
    estimate,
    group_request_rates,
    measured_by_kind,
    physics_ms_per_tick,
    replica_ms_per_s,
    requests_per_robot_s,
    shard_budget_ms,
    shard_count,
)

HEADLINE_ENGINE = {"buffer_time_s": 0.3, "max_action_age_s": 1.5, "trim": "consumed"}


def _scenario(
    count: int,
    fps: float,
    robot: str = "reacher",
    replicas: int = 3,
    manifest: dict | None = None,
    engine: dict | None = None,
    profile: str = "wan_50ms",
    checkpoint: str = "reacher",
):
    group = NS(
        name="g",
        count=count,
        fps=fps,
        robot=robot,
        site="lab",
        episode_s=2.0,
        model_id="m",
        engine=dict(HEADLINE_ENGINE if engine is None else engine),
        engine_kind="remote",
    )
    return NS(
        groups=[group],
        robots=count,
        sites={"lab": NS(profile=profile, overrides={})},
        replicas=[
            NS(id=f"r{i}", checkpoint=checkpoint, model_id="m", manifest={}, emulated_latency=None)
            for i in range(replicas)
        ],
        server_manifest=manifest or {},
        shards="auto",
    )


def _est(scenario, probe_ms: float = 29.6, forward: dict | None = None):
    return estimate(scenario, cores=2, probe_ms=probe_ms, forward=forward or {})


def test_physics_follows_the_substeps_a_tick_not_the_tick():
    # the reacher steps its MJCF's 10 ms 100 times a tick at 1 Hz and once (a 33 ms step) at 30 Hz
    assert physics_ms_per_tick("reacher", 1.0) > 50 * physics_ms_per_tick("reacher", 30.0)
    assert physics_ms_per_tick("no-such-robot", 30.0) > 0  # an unmeasured type gets the default step cost


def test_a_slow_fleet_gets_shards_for_its_physics():
    # 1,000 reacher robots at 1 Hz tick 1,000 times a second, a third of one shard's 3,000 at 30 Hz, but their
    # physics (100 substeps a tick) is several shards' work: the tick rule alone gave one shard
    assert shard_count(_scenario(1000, 1.0), cores=2) >= 5
    assert shard_count(_scenario(300, 30.0), cores=2) == 3  # the headline is unchanged
    assert shard_count(_scenario(100, 30.0), cores=2) == 1
    est = _est(_scenario(1000, 1.0))
    # their physics alone: 1,000 ticks a second x (100 substeps x 9.6 us + 5 us) = 0.97 of a core
    assert not est.real_time and est.split["shards"] > 0.97


@given(requests=st.floats(0.1, 5000), window=st.floats(0, 200), max_batch=st.integers(1, 256))
def test_forward_passes_are_between_one_per_batch_and_one_per_request(requests, window, max_batch):
    fwd = requests / batch_size(requests, window, max_batch)
    assert requests / max_batch - 1e-9 <= fwd <= requests + 1e-9


def test_many_lightly_loaded_replicas_cost_more_than_few_busy_ones():
    # the same fleet's requests over 8 replicas batch less (measured here: 0.50 of a core for 8, 100 robots)
    batching = {"scheduling": {"max_batch": 64, "batch_window_ms": 50.0}}
    few = _est(_scenario(300, 30.0, replicas=3, manifest=batching)).split["replicas"]
    many = _est(_scenario(300, 30.0, replicas=8, manifest=batching)).split["replicas"]
    unbatched = _est(_scenario(300, 30.0, replicas=3)).split["replicas"]
    assert many > few and unbatched > few


def test_the_estimate_scales_with_the_speed_probe():
    s = _scenario(300, 30.0)
    fast, slow = (_est(s, probe_ms=p).cores_needed for p in (29.6, 59.2))
    assert abs(slow - 2 * fast) < 1e-9
    assert shard_budget_ms(100) == 4 * shard_budget_ms(25)


def test_the_measured_split_is_summed_by_kind():
    split = {
        "shard:0": 50.0,
        "shard:1": 30.0,
        "server:r0": 10.0,
        "chaos-proxy": 6.0,
        "chaos-proxy-1": 4.0,
        "router": 5.0,
        "runner": 2.0,
    }
    assert measured_by_kind(split) == {"shards": 0.8, "replicas": 0.1, "proxy": 0.1, "router": 0.05}


def test_a_nodes_proxy_processes_follow_its_robots_requests_and_its_spare_cpus():
    from bench.run.sizing import node_proxy_processes, proxy_processes

    busy = 3000 * 1.27  # ~3,800 requests/s, ~1.1 cores of proxy work: more than four loops' 25 % each
    # 16 CPUs, 3 shards reserved and its router: cores for one loop per site
    assert node_proxy_processes(busy, sites=3, node_cpus=16, reserved_cpus=3.0) == 3
    # the same load on a node whose CPUs its shards and router take: one loop, as a local run with no core to spare
    assert node_proxy_processes(busy, sites=3, node_cpus=4, reserved_cpus=3.0) == 1
    assert node_proxy_processes(busy, sites=3, node_cpus=6, reserved_cpus=3.0) == 2  # as many as spare CPUs
    assert node_proxy_processes(busy, sites=1, node_cpus=64, reserved_cpus=3.0) == 1  # never more than sites
    assert node_proxy_processes(100 * 1.27, sites=3, node_cpus=64, reserved_cpus=1.0) == 1  # a small node
    # 2,400 robots at 1 Hz, 0.5 requests each: 0.41 cores of proxy work, two loops under 25 % busy
    assert node_proxy_processes(2400 * 0.5, sites=3, node_cpus=16, reserved_cpus=3.0) == 2


def test_a_local_runs_proxies_spread_over_the_cores_its_other_processes_leave():
    """The 1,000-robot run on 16 cores got one proxy loop while each shard and replica held a whole core in the
    rule (10 + 8 + 1 > 16), though the host was 44 % busy: its downlink ran up to 33 ms late at p99. Counted by
    their estimated work instead, three loops (one a site) fit; on the 2-core VM nothing changes."""
    from bench.run.sizing import proxy_processes
    from bench.scenario.load import load_scenario

    thousand = load_scenario("scenarios/1000_robots_wan.yaml")
    assert proxy_processes(thousand, cores=16) == 3
    assert proxy_processes(thousand, cores=2) == proxy_processes(thousand, cores=8) == 1  # no spare cores for more
    headline = load_scenario("scenarios/300_robots_wan.yaml")
    assert proxy_processes(headline, cores=2) == proxy_processes(headline, cores=64) == 1  # one loop under 25 % busy


def test_the_proxy_count_can_be_forced_and_never_exceeds_the_sites(monkeypatch):
    from bench.run.sizing import PROXY_PROCESSES_ENV, proxy_processes
    from bench.scenario.load import load_scenario

    headline = load_scenario("scenarios/300_robots_wan.yaml")
    monkeypatch.setenv(PROXY_PROCESSES_ENV, "2")
    assert proxy_processes(headline, cores=2) == 2
    monkeypatch.setenv(PROXY_PROCESSES_ENV, "9")
    assert proxy_processes(headline, cores=2) == 3  # three sites
    monkeypatch.setenv(PROXY_PROCESSES_ENV, "many")
    with pytest.raises(ValueError, match="BENCH_PROXY_PROCESSES='many'"):
        proxy_processes(headline)


# --- the request rate an engine keeps (edge.remote's request point, walked through an episode) ---------------------


@pytest.mark.parametrize(
    "fps, engine, rtt_s, per_s",
    [
        # measured per robot in runs on the 2-core VM (docs/bench.md "The cost model"): 30 Hz, 30-row chunks, 2 s episodes
        (30.0, {"buffer_time_s": 0.3}, 0.10, 1.5),  # wan_50ms, run A's eu/us: every 20.0 ticks
        (30.0, {"buffer_time_s": 0.4, "max_action_age_s": 2.0}, 0.16, 2.0),  # lte, run A's ap: every 15.1 ticks
        (30.0, {"buffer_time_s": 0.5, "max_action_age_s": 1.0}, 0.002, 2.5),  # smoke on lan: every 12.0 ticks
        # 10 Hz: the 30-row chunk goes stale at max_action_age_s, not at the buffer (run D: 0.996 and 0.501 a second)
        (10.0, {"buffer_time_s": 0.3, "max_action_age_s": 1.5}, 0.10, 1.0),
        (10.0, {"buffer_time_s": 0.4, "max_action_age_s": 2.0}, 0.16, 0.5),
        (1.0, {"buffer_time_s": 0.3, "max_action_age_s": 1.5}, 0.10, 0.5),  # 1 Hz, 2-tick episodes: one each (run k4)
    ],
)
def test_the_request_rate_follows_the_engines_request_point(fps, engine, rtt_s, per_s):
    assert requests_per_robot_s(fps, 2.0, 30, engine, rtt_s) == pytest.approx(per_s)


def test_a_longer_chunk_or_a_shorter_buffer_asks_less_often():
    base = requests_per_robot_s(30.0, 10.0, 30, {"buffer_time_s": 0.3}, 0.1)
    assert requests_per_robot_s(30.0, 10.0, 60, {"buffer_time_s": 0.3}, 0.1) < base / 1.8
    assert requests_per_robot_s(30.0, 10.0, 30, {"buffer_time_s": 0.1}, 0.1) < base
    # without episodes, every ceil(H - 1 - buffer steps) ticks: 30 rows, 9 rows of buffer: every 20
    assert requests_per_robot_s(30.0, float("inf"), 30, {"buffer_time_s": 0.3}, 0.1) == pytest.approx(1.5)
    # append mode: every chunk adds its 30 rows, so one request a chunk
    assert requests_per_robot_s(30.0, float("inf"), 30, {"buffer_time_s": 0.3, "rtc_enabled": False}, 0.1) == 1.0


def test_trimming_the_first_chunk_by_the_delay_asks_sooner():
    # 1.5 s episodes over a 300 ms round trip: `real_delay` drops the first chunk's first 9 rows (the robot stood
    # still meanwhile), `consumed` none, so the first chunk runs to the buffer 9 ticks sooner: 3 requests, not 2
    kw = dict(fps=30.0, episode_s=1.5, chunk_size=30, rtt_s=0.3)
    consumed = requests_per_robot_s(engine={"buffer_time_s": 0.3, "trim": "consumed"}, **kw)
    real_delay = requests_per_robot_s(engine={"buffer_time_s": 0.3, "trim": "real_delay"}, **kw)
    assert (consumed, real_delay) == (pytest.approx(2 * 30 / 45), pytest.approx(3 * 30 / 45))


def test_a_group_asks_at_the_rate_of_the_chunk_its_replicas_serve(tmp_path):
    long_chunk = tmp_path / "long"
    long_chunk.mkdir()
    (long_chunk / "config.json").write_text(json.dumps({"chunk_size": 90}))
    reacher = group_request_rates(_scenario(10, 30.0))[0]
    assert reacher == pytest.approx(1.5)  # bench/checkpoints/reacher: 30 rows
    assert group_request_rates(_scenario(10, 30.0, checkpoint=str(long_chunk)))[0] < reacher
    local = _scenario(10, 30.0)
    local.groups[0].engine_kind = "local"  # runs its policy in the shard: no request
    assert group_request_rates(local) == [0.0]


# --- a replica's forward cost: timed per checkpoint and host, cached, else the constant with the reason ----------


def test_the_forward_cost_is_linear_between_batch_one_and_max_batch():
    c = ForwardCost(2.0, 8.0, 4, "measured")
    assert (c.ms(1), c.ms(2.5), c.ms(4)) == (2.0, 5.0, 8.0)
    assert constant(4.8, "why").ms(64) == 4.8 and not constant(4.8, "why").measured


def test_a_dearer_checkpoint_costs_the_replicas_more_and_an_emulated_accelerator_batches_more():
    s = _scenario(300, 30.0, manifest={"scheduling": {"max_batch": 64, "batch_window_ms": 50.0}})
    cheap = {r.id: ForwardCost(2.0, 6.0, 64, "measured") for r in s.replicas}
    dear = {r.id: ForwardCost(6.0, 18.0, 64, "measured") for r in s.replicas}
    assert replica_ms_per_s(s, dear) > 1.3 * replica_ms_per_s(s, cheap)  # a request's own 0.76 ms is the same
    assert replica_ms_per_s(s, {}) == replica_ms_per_s(s, {r.id: constant(REPLICA_FORWARD_MS, "") for r in s.replicas})
    # an emulated 150 ms pass holds the dispatch thread: ~167 requests/s a replica batch ~33, not ~9
    assert batch_size(167.0, 50.0, 64, busy_ms=150.0) > 2 * batch_size(167.0, 50.0, 64)
    for r in s.replicas:
        r.emulated_latency = 150
    assert replica_ms_per_s(s, cheap) < replica_ms_per_s(_scenario(300, 30.0, manifest=s.server_manifest), cheap)


def test_the_estimate_says_where_each_forward_cost_came_from():
    s = _scenario(100, 30.0, replicas=2)
    est = _est(s, forward={"r0": ForwardCost(3.0, 9.0, 64, "measured"), "r1": constant(4.8, "cuda device: ...")})
    text = "\n".join(est.lines())
    assert "r0 3.00 at batch 1, 9.00 at 64 (measured)" in text and "r1 4.80 (constant: cuda device" in text
    assert est.to_json()["forward_cpu_ms"]["r1"]["source"].startswith("constant")
    assert est.to_json()["requests_per_s"] == pytest.approx(150.0)


def _fake_checkpoint(path, weights=b"w"):
    path.mkdir()
    for name, data in (("config.json", b"{}"), ("model.safetensors", weights), ("stats.json", b"{}")):
        (path / name).write_bytes(data)
    return path


def test_the_forward_cost_is_cached_by_the_checkpoints_content_and_not_measured_when_told_not_to(tmp_path):
    ckpt = _fake_checkpoint(tmp_path / "ckpt")
    manifest = {"model": {"repo_or_path": str(ckpt)}, "scheduling": {"max_batch": 8}}
    cache = tmp_path / "forward_ms.json"
    miss = forward_cost(manifest, 4.8, measure=False, cache=cache)
    assert miss.source == "constant: ckpt not measured on this host yet" and miss.at_1 == 4.8
    from bench.run import forwardcost

    key = {
        "checkpoint": checkpoint_hash(ckpt),
        "dtype": "float32",
        "execution_horizon": None,
        "host": forwardcost._host(),
        "hyper_params": {},
        "max_batch": 8,
        "torch_threads": 1,
    }
    # an entry timed the way 445e205 timed (its key had no `timing`): timed again, not read back
    cache.write_text(json.dumps({json.dumps(key, sort_keys=True): {"at_1": 2.0, "at_max": 9.0, "max_batch": 8}}))
    assert not forward_cost(manifest, 4.8, measure=False, cache=cache).measured
    # nor one timed before the key had the policy code's fingerprint
    cache.write_text(
        json.dumps(
            {
                json.dumps({**key, "timing": forwardcost.TIMING}, sort_keys=True): {
                    "at_1": 2.0,
                    "at_max": 9.0,
                    "max_batch": 8,
                }
            }
        )
    )
    assert not forward_cost(manifest, 4.8, measure=False, cache=cache).measured
    key = json.dumps({**key, "timing": forwardcost.TIMING, "code": forwardcost.code_fingerprint()}, sort_keys=True)
    cache.write_text(json.dumps({key: {"at_1": 2.0, "at_max": 9.0, "max_batch": 8}}))
    hit = forward_cost(manifest, 4.8, measure=False, cache=cache)
    assert (hit.at_1, hit.at_max, hit.source) == (2.0, 9.0, "cached")
    (ckpt / "model.safetensors").write_bytes(b"other weights")  # a finetune under the same name: timed anew
    assert not forward_cost(manifest, 4.8, measure=False, cache=cache).measured


def _copy_code(root):
    """The source files a timed pass runs, copied under `root` at the same paths: a tree the test may edit."""
    from bench.run import forwardcost

    for f in forwardcost.code_files():
        dest = root / f.relative_to(forwardcost.SOURCE_ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(f.read_bytes())
    return root


def test_a_change_to_the_policy_code_times_the_pass_again(tmp_path, monkeypatch):
    from bench.run import forwardcost

    monkeypatch.setattr(forwardcost, "SOURCE_ROOT", _copy_code(tmp_path / "src"))
    ckpt = _fake_checkpoint(tmp_path / "ckpt")
    manifest = {"model": {"repo_or_path": str(ckpt)}, "scheduling": {"max_batch": 8}}
    key = {
        "checkpoint": checkpoint_hash(ckpt),
        "code": forwardcost.code_fingerprint(),
        "dtype": "float32",
        "execution_horizon": None,
        "host": forwardcost._host(),
        "hyper_params": {},
        "max_batch": 8,
        "timing": forwardcost.TIMING,
        "torch_threads": 1,
    }
    cache = tmp_path / "forward_ms.json"
    cache.write_text(json.dumps({json.dumps(key, sort_keys=True): {"at_1": 2.0, "at_max": 9.0, "max_batch": 8}}))
    assert forward_cost(manifest, 4.8, measure=False, cache=cache).source == "cached"
    (tmp_path / "src" / "server" / "service.py").write_text("# not in a forward pass\n")
    assert forward_cost(manifest, 4.8, measure=False, cache=cache).source == "cached"
    guidance = tmp_path / "src" / "server" / "policies" / "flow_matching.py"  # the flow policy's RTC guidance
    guidance.write_text(guidance.read_text() + "\n# a faster guidance step\n")
    assert (
        forward_cost(manifest, 4.8, measure=False, cache=cache).source == "constant: ckpt not measured on this host yet"
    )


def test_the_code_fingerprint_covers_what_the_timing_child_imports_and_what_they_import():
    import ast
    import inspect

    from bench.run import forwardcost

    child = ast.parse(inspect.getsource(forwardcost._child).lstrip())
    imported = {n.module for n in ast.walk(child) if isinstance(n, ast.ImportFrom) and n.module.startswith("server")}
    assert imported == set(forwardcost.CHILD_IMPORTS)
    files = {f.relative_to(forwardcost.SOURCE_ROOT).as_posix() for f in forwardcost.code_files()}
    assert {
        "server/runtime.py",
        "server/processors.py",
        "server/policies/base.py",
        "server/policies/checkpoint.py",
        "server/policies/flow_matching.py",
        "server/policies/flow_transformer.py",
        "server/policies/mlp_chunk.py",
        "server/policies/stateful_chunk.py",
        "server/policies/no_chunk.py",
        "server/policies/layers.py",
    } <= files
    assert "server/service.py" not in files and not any(f.startswith(("bench/", "edge/")) for f in files)


def test_a_replica_whose_forward_runs_elsewhere_or_has_no_weights_gets_the_constant_and_why(tmp_path):
    cuda = forward_cost({"model": {"repo_or_path": str(tmp_path), "device": "cuda"}}, 4.8, cache=tmp_path / "c.json")
    assert cuda.at_1 == 4.8 and "cuda device" in cuda.source
    empty = forward_cost({"model": {"repo_or_path": str(tmp_path)}}, 4.8, cache=tmp_path / "c.json")
    assert empty.at_1 == 4.8 and "no weights" in empty.source


def test_the_cache_key_is_the_servers_checkpoint_hash(tmp_path):
    from server.policies.checkpoint import CHECKPOINT_FILES
    from server.policies.checkpoint import checkpoint_hash as server_hash

    ckpt = _fake_checkpoint(tmp_path / "ckpt", weights=b"\x00" * 1000)
    assert checkpoint_hash(ckpt) == server_hash({n: (ckpt / n).read_bytes() for n in CHECKPOINT_FILES})


@pytest.mark.integration
def test_a_real_checkpoint_is_timed_once_in_a_child_then_read_back(tmp_path):
    from bench.scenario.load import checkpoint_dir

    manifest = {"model": {"repo_or_path": str(checkpoint_dir("reacher"))}, "scheduling": {"max_batch": 4}}
    first = forward_cost(manifest, 4.8, cache=tmp_path / "forward_ms.json")
    assert first.source == "measured" and first.at_1 > 0 and first.at_max > 0 and first.max_batch == 4
    again = forward_cost(manifest, 4.8, measure=False, cache=tmp_path / "forward_ms.json")
    assert again.source == "cached" and (again.at_1, again.at_max) == (first.at_1, first.at_max)


@pytest.mark.parametrize("stdout", ["", "some library's notice\n", '{"at_1": 2.0}\n', '["at_1", 2.0]\n'])
def test_a_child_that_prints_no_timing_gives_the_constant_and_why_never_an_exception(tmp_path, monkeypatch, stdout):
    import subprocess

    from bench.run import forwardcost

    ckpt = _fake_checkpoint(tmp_path / "ckpt")
    monkeypatch.setattr(
        forwardcost.subprocess, "run", lambda *a, **kw: subprocess.CompletedProcess(a, 0, stdout=stdout, stderr="")
    )
    cache = tmp_path / "forward_ms.json"
    cost = forward_cost({"model": {"repo_or_path": str(ckpt)}}, 4.8, cache=cache)
    assert cost.at_1 == 4.8 and cost.source.startswith("constant: ckpt: timing its forward passes printed no timing")
    assert not cache.exists()  # nothing cached: the next preflight times it again


@pytest.mark.integration
def test_a_replica_without_batching_is_timed_at_batch_one_once(tmp_path):
    """max_batch 1 (most shipped scenarios): batch 1 is its max_batch, timed once, not twice with two readings."""
    from bench.scenario.load import checkpoint_dir

    manifest = {"model": {"repo_or_path": str(checkpoint_dir("reacher"))}}
    cost = forward_cost(manifest, 4.8, cache=tmp_path / "forward_ms.json")
    assert cost.source == "measured" and cost.max_batch == 1
    (entry,) = json.loads((tmp_path / "forward_ms.json").read_text()).values()
    assert entry["at_max"] == entry["at_1"] > 0


@pytest.mark.parametrize("batching", [{"scheduling": {"max_batch": 64, "batch_window_ms": 50.0}}, None])
def test_a_replica_priced_at_the_constant_costs_about_what_the_reacher_mlp_it_stands_for_costs(batching):
    """REPLICA_FORWARD_MS is the policy's own pass (REPLICA_PASS_MS is added to every pass, timed or not): a replica
    that cannot be timed is priced within 15 % of the reacher's timed pass (docs/bench.md: 2.30 ms at batch 1,
    10.4 at 64), batched or not, not at the 4.8 fitted all-in plus the 2.0 a second time."""
    s = _scenario(300, 30.0, manifest=batching)
    timed = replica_ms_per_s(s, {r.id: ForwardCost(2.30, 10.4, 64 if batching else 1, "measured") for r in s.replicas})
    priced = replica_ms_per_s(s, {r.id: constant(REPLICA_FORWARD_MS, "cuda device") for r in s.replicas})
    assert priced == pytest.approx(timed, rel=0.15)


def test_the_report_memory_of_a_run_follows_its_ticks_and_requests_and_refuses_past_the_host():
    from bench.run.sizing import REPORT_MEMORY_SHARE, ReportMemory, report_memory

    headline = _scenario(300, 30.0)
    headline.duration_s, headline.warmup_s = 120.0, 15.0
    m = report_memory(headline, available_mb=23_000)
    # 300 x 30 x 135 s = 1.2 M robot-ticks (~0.20 GB) and ~68 k requests (~0.13 GB): a headline's report phase,
    # replayed, peaks 0.36 GB over the runner's ~0.13 GB before (0.58 GB before the tick cuts, with the audit as
    # columns; 0.73-0.83 GB as the runs recorded it, with the audit as a dict a request)
    assert 480 < m.needed_mb < 650 and m.fits
    assert "0.5 GB of 22.5 GB available" in m.line(headline)
    day = _scenario(300, 30.0)
    day.duration_s, day.warmup_s = 86_400.0, 15.0
    m = report_memory(day, available_mb=23_000)
    assert not m.fits and m.needed_mb > 100 * 1024
    words = m.line(day)
    assert "Shorten duration_s to" in words and "180 B a robot-tick" in words and "22.5 GB available" in words
    longest = float(words.split("Shorten duration_s to ")[1].split(" s")[0])
    day.duration_s = longest  # the duration it names fits, and a little more does not
    assert report_memory(day, available_mb=23_000).fits
    day.duration_s = longest * 1.05
    assert not report_memory(day, available_mb=23_000).fits
    assert ReportMemory(m.needed_mb, None).fits  # the host's memory unknown (no psutil): say nothing, never refuse
    assert REPORT_MEMORY_SHARE < 1


def test_a_run_whose_report_cannot_fit_is_refused_with_exit_2_before_any_process(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from bench.scenario.load import SCENARIOS_DIR

    repo = Path(__file__).resolve().parents[3]
    # a week of the headline: ~2.8 TB of records at once, on any host this suite runs on
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.cli",
            "run",
            str(SCENARIOS_DIR / "300_robots_wan.yaml"),
            "--set",
            "duration_s=604800",
            "--reports",
            str(tmp_path),
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "the report of this run would hold" in proc.stderr and "Shorten duration_s to" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not any(tmp_path.iterdir())  # refused before a run directory, a router or a server existed


def test_the_router_holds_a_thousand_robots_with_room_for_their_reconnects():
    """On the 16-core H200 machine (2026-11-27) Zenoh's default of 1000 sessions refused 8 of 1,000 robots: the 8
    replicas had taken their places, and those robots died CONNECTING."""
    from bench.run.sizing import router_clients, router_max_sessions
    from bench.scenario.load import load_scenario
    from wire.transport import ROUTER_MAX_SESSIONS

    s = load_scenario("scenarios/1000_robots_wan.yaml")
    assert router_clients(s) >= 1000 + len(s.replicas)
    assert router_max_sessions(s) >= 2 * router_clients(s) > 2000
    small = load_scenario("scenarios/smoke.yaml")
    assert router_max_sessions(small) == ROUTER_MAX_SESSIONS  # the floor: never below the router's default


def test_a_host_that_cannot_hold_the_fleets_sockets_is_refused_naming_the_limit(monkeypatch):
    import resource

    from bench.run.sizing import open_files_needed, open_files_problem
    from bench.scenario.load import load_scenario

    s = load_scenario("scenarios/1000_robots_wan.yaml")
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 1024))
    problem = open_files_problem(s)
    assert problem and "1024" in problem and str(open_files_needed(s)) in problem and "ulimit -Hn" in problem
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, open_files_needed(s)))
    assert open_files_problem(s) is None  # the soft limit is raised by the processes themselves
