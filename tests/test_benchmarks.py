"""The benchmark runner: one cheap benchmark in quick mode writes its JSON (figures with units, machine
facts, load) and the summary table; an unknown name is a clear error; quick mode judges budgets only."""

import json

from benchmarks.__main__ import NAMES, main
from benchmarks.common import Result


def test_quick_run_writes_report_and_summary(tmp_path, capsys):
    assert main(["scheduling", "--quick", "--out-dir", str(tmp_path)]) == 0
    rep = json.loads((tmp_path / "scheduling.json").read_text())
    assert rep["benchmark"] == "scheduling" and rep["quick"] is True
    assert rep["figures"] and all(f["unit"] and f["value"] > 0 for f in rep["figures"])
    for key in ("cores", "cpu_model", "python", "torch", "zenoh", "date"):
        assert rep["machine"][key], key
    assert len(rep["load_average_start"]) == 3 and len(rep["load_average_end"]) == 3
    summary = (tmp_path / "summary.md").read_text()
    assert "| benchmark | figure | value | unit | target | met? |" in summary
    assert "| scheduling | round_robin deposit |" in summary
    assert "round_robin deposit" in capsys.readouterr().out  # printed too


def test_unknown_name_lists_the_names(tmp_path, capsys):
    assert main(["codecs", "--quick", "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown benchmark codecs" in err and all(n in err for n in NAMES)
    assert not (tmp_path / "summary.md").exists()


def test_quick_judges_budgets_not_timings():
    r = Result()
    r.add("latency", 5.0, "ms", target=1.0)
    r.add("memory", 100.0, "KiB", target=64.0, budget=True)
    r.add("speed-up", 6.0, "x", target=5.0, better="higher")
    assert [f.name for f in r.failures(quick=True)] == ["memory"]
    assert [f.name for f in r.failures(quick=False)] == ["latency", "memory"]


def test_every_benchmark_has_the_same_shape():
    import importlib
    import inspect

    for name in NAMES:
        run = importlib.import_module(f"benchmarks.{name}").run
        assert list(inspect.signature(run).parameters) == ["quick"], name


def test_peer_codecs_carry_the_same_payload():
    """The three stacks of benchmarks.peers carry the same bytes both ways (else the comparison is unfair)."""
    import numpy as np
    import pytest

    from benchmarks import peers

    if peers.missing_libraries():
        pytest.skip(f"bench-peers extra not installed: {peers.missing_libraries()}")
    p = peers.payload()
    jpegs = {k: v.data for k, v in p["images"].items()}
    ours = peers.OursCodec(p)
    _, obs = ours.decode_request(*ours.encode_request())
    assert {k: v.data for k, v in obs.images.items()} == jpegs and obs.task == p["task"]
    _, chunk = ours.decode_reply(*ours.encode_reply(ours.decode_request(*ours.encode_request())))
    assert np.array_equal(chunk.chunk_robot, p["chunk"]) and np.array_equal(chunk.chunk_model, p["chunk"])
    pb = peers.ProtobufCodec(p)
    req = pb.decode_request(pb.encode_request())
    assert req[2] == jpegs and np.array_equal(req[1], p["state"]) and req[3] == p["task"]
    _, model, robot = pb.decode_reply(pb.encode_reply(req))
    assert np.array_equal(model, p["chunk"]) and np.array_equal(robot, p["chunk"])
    pk = peers.PickleCodec(p)
    req = pk.decode_request(pk.encode_request())
    assert req["images"] == jpegs and np.array_equal(req["state"], p["state"])
    assert np.array_equal(pk.decode_reply(pk.encode_reply(req))["chunk_robot"], p["chunk"])
    sizes = [peers.codec_only(s, p, 3)[1] for s in ("ours", "zmq_protobuf", "grpc_pickle")]
    assert max(sizes) - min(sizes) < 0.01 * min(sizes)  # the same payload within 1 %


def _write_report(out_dir, name: str, result: Result, quick: bool = False) -> None:
    from benchmarks.common import report_dict

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(report_dict(name, result, quick, [1.5, 1.0, 1.0], 2.0)))


def test_readme_table_rewrites_only_the_marked_block(tmp_path):
    from benchmarks.readme import BEGIN, END

    out = tmp_path / "bench"
    eng = Result()
    eng.add("get_action() p99", 35.0, "us", target=20.0)
    eng.add("RSS per idle engine", 0.3, "MiB")  # no target: not in the README's table
    _write_report(out, "engine", eng)
    peers = Result()
    peers.add("ours: round trip p50", 1.2, "ms")
    peers.add("ours: codec only (enc+dec both ways)", 90.0, "us")
    peers.add("ours / zmq_protobuf, round trip p50", 0.9, "x", target=1.0)
    _write_report(out, "peers", peers)
    before = "# Project\n\nIntro.\n\n## Performance\n\n"
    after = "\nSee also docs.\n<!-- another comment -->\n"
    readme = tmp_path / "README.md"
    readme.write_text(f"{before}{BEGIN}\n| old | table |\nold line\n{END}{after}")
    assert main(["--readme", str(readme), "--out-dir", str(out)]) == 0
    text = readme.read_text()
    assert text.startswith(before + BEGIN + "\n") and text.endswith(END + after)
    block = text[len(before) + len(BEGIN) : -len(END + after)]
    assert "old line" not in block and "| old | table |" not in block
    assert "| engine | get_action() p99 | 35 us | <= 20 | **missed** |" in block
    assert "| peers | ours / zmq_protobuf, round trip p50 | 0.9 x | <= 1 | yes |" in block
    assert "| peers | ours: round trip p50 | 1.2 ms |  |  |" in block
    assert "RSS per idle engine" not in block and "codec only" not in block
    assert "python -m benchmarks --readme" in block and "1-minute load average" in block
    assert main(["--readme", str(readme), "--out-dir", str(out)]) == 0
    assert readme.read_text() == text  # the same reports make the same README


def test_readme_refuses_quick_reports_and_a_readme_without_markers(tmp_path, capsys):
    from benchmarks.readme import BEGIN, END

    out = tmp_path / "bench"
    r = Result()
    r.add("added latency p50", 0.05, "ms", target=0.2)
    _write_report(out, "proxy", r, quick=True)
    readme = tmp_path / "README.md"
    original = f"# P\n{BEGIN}\nkept\n{END}\n"
    readme.write_text(original)
    assert main(["--readme", str(readme), "--out-dir", str(out)]) == 2
    assert "proxy" in capsys.readouterr().err and readme.read_text() == original
    _write_report(out, "proxy", r)
    for broken in ("# P\nno markers\n", f"# P\n{END}\n{BEGIN}\n", f"{BEGIN}\n{END}\n{BEGIN}\n{END}\n"):
        readme.write_text(broken)
        assert main(["--readme", str(readme), "--out-dir", str(out)]) == 2
        assert readme.read_text() == broken
        assert "benchmarks:begin" in capsys.readouterr().err


def test_headline_rss_sums_processes_per_sample():
    import pytest

    from benchmarks.headline_rss import peak_sum

    cols = {
        "rss_mb:router": [40.0, 41.0, 41.0],
        "rss_mb:server:r1": [200.0, None, 150.0],  # restarting at sample 1
        "rss_mb:shard:0": [100.0, 300.0, 120.0],
    }
    assert peak_sum(cols) == (341.0, 1)
    with pytest.raises(ValueError, match="no rss_mb"):
        peak_sum({})


def test_twin_cost_counts_answered_requests_of_the_measured_window_only():
    import pytest

    from benchmarks.twin_cost import cost_of_run

    summary = {
        "duration_s": 10.0,
        "cpu": {"by_kind": {"shards": 1.0, "replicas": 0.5, "proxy": 0.25, "router": 0.25}, "host_percent": 90.0},
    }
    # warm-up (t < 0), after the window, abandoned and timed-out requests are not answered ones of the window
    requests = {"t": [-1.0, 0.5, 2.0, 9.9, 10.5, 3.0], "outcome": ["ok", "ok", "ok", "ok", "ok", "abandoned"]}
    c = cost_of_run(summary, requests)
    assert c["answered"] == 3 and c["cores"] == 2.0
    assert c["ms_per_answered"] == pytest.approx(2.0 * 10.0 * 1e3 / 3, abs=1e-3)
    assert c["ms_per_answered_by_kind"]["shards"] == pytest.approx(1.0 * 10.0 * 1e3 / 3, abs=1e-3)
    with pytest.raises(ValueError, match="no request"):
        cost_of_run(summary, {"t": [1.0], "outcome": ["timeout"]})
    with pytest.raises(ValueError, match="by_kind"):
        cost_of_run({"duration_s": 1.0, "cpu": {}}, requests)


def test_report_memorys_synthetic_ticks_read_back_as_the_shards_records(tmp_path):
    import numpy as np

    from bench.fleet import records
    from benchmarks.report_memory import ROBOTS, write_ticks

    write_ticks(tmp_path, 200_000)
    t = records.collect(tmp_path / "records", "ticks")
    assert t.num_rows == 200_000 and t.schema.equals(records.arrow_schema("ticks"))
    none = t.column("is_none").to_numpy(zero_copy_only=False)
    assert np.array_equal(t.column("action").is_null().to_numpy(zero_copy_only=False), none)
    assert 0.02 < none.mean() < 0.25 and set(t.column("source").unique().to_pylist()) == {"chunk", "none"}
    robots, ts = t.column("robot").to_numpy(), t.column("t").to_numpy()
    assert set(robots.tolist()) == set(range(ROBOTS)) and ts.min() < 0 < ts.max()  # warm-up, then the window
    assert (np.diff(ts) >= 0).all() and (np.diff(robots) != 0).all()  # time-ordered as written, robots interleaved
    assert {len(a) for a in t.column("action").drop_null().to_pylist()} == {2}


def test_a_benchmark_whose_process_dies_is_reported_beside_the_others(tmp_path):
    """Each benchmark runs in a spawned process: one that dies before writing its report (here: its module is
    missing, so the child exits 1) becomes an error report, and the next benchmark still runs and reports."""
    from benchmarks.common import run_isolated

    dead = run_isolated("no_such_benchmark", True, tmp_path)
    assert dead["figures"] == [] and "its process ended (exit code 1)" in dead["error"]
    assert json.loads((tmp_path / "no_such_benchmark.json").read_text())["error"] == dead["error"]
    alive = run_isolated("scheduling", True, tmp_path)
    assert "error" not in alive and alive["figures"]


def test_the_lerobot_rollout_adapter_benchmark_times_each_frame_kind(tmp_path):
    import json

    from benchmarks import lerobot_rollout

    out = tmp_path / "lerobot_rollout.json"
    assert lerobot_rollout.main(["--calls", "20", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["us_per_call"]
    assert set(rows) == set(lerobot_rollout.frames()) and all(v > 0 for v in rows.values())
