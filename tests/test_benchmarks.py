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
