"""`bench run --record-dataset`: a real run (router, server, shard) recorded as LeRobotDatasets, read back with
LeRobot's own `LeRobotDataset` and compared with the run's ticks and requests (bench.run.dataset)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench import cli

REPO = Path(__file__).resolve().parents[2]
TASK = "reach the red target"
CAMS = "{kind: synthetic, names: [front, wrist], height: 32, width: 48}"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """smoke.yaml, shortened: 2 reachers with two cameras, 1 s episodes, 1 + 2 s, no faults, recorded."""
    reports = tmp_path_factory.mktemp("reports")
    env = {**os.environ, "PYTHONPATH": str(REPO), "MUJOCO_GL": "egl"}
    sets = [
        "warmup_s=1",
        "duration_s=2",
        "faults=[]",
        "assertions=[]",
        "fleet.groups.0.count=2",
        "fleet.groups.0.episode_s=1",
        f"fleet.groups.0.cameras={CAMS}",
        f"fleet.groups.0.task={TASK}",
    ]
    argv = ["run", "scenarios/smoke.yaml", *(x for s in sets for x in ("--set", s)), "--record-dataset"]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.cli", *argv, "--reports", str(reports), "--quiet"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "bench: dataset lab: " in proc.stderr
    (d,) = list(reports.glob("smoke/*/"))
    return d


def _dataset(root: Path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset("bench/smoke_lab", root=root)


def _frames(ds) -> dict[str, np.ndarray]:
    cols = ds.hf_dataset.with_format(None)
    return {
        k: np.asarray(cols[k])
        for k in ("episode_index", "frame_index", "observation.state", "action", "provenance.ids", "provenance.times")
    }


def _ticks(run_dir: Path) -> dict:
    t = pq.read_table(run_dir / "ticks.parquet").sort_by([("robot", "ascending"), ("t", "ascending")])
    return {
        c: t.column(c).to_pylist() if c in ("action", "session_id") else t.column(c).to_numpy() for c in t.column_names
    }


def test_loader_reads_one_episode_per_robot_episode_with_a_frame_per_tick(run_dir):
    ds = _dataset(run_dir / "dataset" / "lab")
    ticks = _ticks(run_dir)
    keys = sorted(set(zip(ticks["robot"].tolist(), ticks["robot_episode"].tolist())))
    assert ds.num_episodes == len(keys) >= 4  # 3 s of 1 s episodes, 2 robots
    assert ds.num_frames == len(ticks["t"])
    prov = json.loads((run_dir / "dataset" / "lab" / "meta" / "bench_provenance.json").read_text())
    f = _frames(ds)
    for ep in prov["episodes"]:
        expected = int(
            np.count_nonzero((ticks["robot"] == ep["robot"]) & (ticks["robot_episode"] == ep["robot_episode"]))
        )
        assert ep["frames"] == expected == int(np.count_nonzero(f["episode_index"] == ep["episode_index"]))


def test_features_shapes_fps_robot_type_task_and_format(run_dir):
    ds = _dataset(run_dir / "dataset" / "lab")
    assert ds.meta.info["codebase_version"] == "v3.0"
    assert ds.fps == 30 and ds.meta.robot_type == "reacher"
    feats = ds.meta.features
    assert feats["observation.state"]["shape"] == [10] or tuple(feats["observation.state"]["shape"]) == (10,)
    assert tuple(feats["action"]["shape"]) == (2,) and feats["action"]["names"] == ["joint0.torque", "joint1.torque"]
    for cam in ("front", "wrist"):
        assert feats[f"observation.images.{cam}"]["dtype"] == "image"
    item = ds[0]
    assert tuple(item["observation.images.front"].shape) == (3, 32, 48)  # LeRobot's loader: channels first
    assert tuple(item["provenance.ids"].shape) == (7,) and tuple(item["provenance.times"].shape) == (3,)
    assert item["task"] == TASK
    for key in ("observation.state", "action", "provenance.ids", "provenance.times"):  # no NaN for a tick without one
        assert np.isfinite(np.asarray(ds.meta.stats[key]["mean"], float)).all(), key


def test_states_and_actions_are_what_the_robots_observed_and_executed(run_dir):
    from bench.robots import robot_type

    ds = _dataset(run_dir / "dataset" / "lab")
    f = _frames(ds)
    ticks = _ticks(run_dir)
    ids = f["provenance.ids"]
    cls = robot_type("reacher")
    low, high = np.asarray(cls.action_low, np.float32), np.asarray(cls.action_high, np.float32)
    compared = 0
    for robot in np.unique(ids[:, 0]):
        mine = np.nonzero(ids[:, 0] == robot)[0]
        tick_rows = np.nonzero(ticks["robot"] == robot)[0]  # the dataset keeps each robot's ticks in time order
        assert len(mine) == len(tick_rows)
        for i, k in zip(mine, tick_rows):
            state = np.asarray(f["observation.state"][i], np.float32)
            assert zlib.crc32(state.tobytes()) == int(ticks["state_digest"][k])
            assert bool(ids[i, 5]) == bool(ticks["is_none"][k])
            if ticks["action"][k] is None:
                np.testing.assert_array_equal(f["action"][i], 0.0)  # the reacher's hold
            else:
                np.testing.assert_array_equal(f["action"][i], np.clip(np.float32(ticks["action"][k]), low, high))
                compared += 1
    assert compared > 0.8 * len(ids)  # a run without faults executes the engine's actions nearly every tick


def test_provenance_matches_ticks_and_requests(run_dir):
    ds = _dataset(run_dir / "dataset" / "lab")
    f = _frames(ds)
    ticks = _ticks(run_dir)
    prov = json.loads((run_dir / "dataset" / "lab" / "meta" / "bench_provenance.json").read_text())
    ids, times = f["provenance.ids"], f["provenance.times"]
    order = np.lexsort((np.arange(len(ids)), ids[:, 0]))  # by robot, in dataset (time) order
    ids, times = ids[order], times[order]
    sessions = [prov["sessions"][s] if s >= 0 else "" for s in ids[:, 1]]
    assert sessions == ticks["session_id"]
    np.testing.assert_array_equal(ids[:, 2], ticks["seq"])
    np.testing.assert_array_equal(ids[:, 3], ticks["episode_id"])
    np.testing.assert_array_equal(ids[:, 4], ticks["chunk_index"])
    np.testing.assert_array_equal(ids[:, 6], np.round(ticks["t"] * 1e3).astype(np.int64))  # t_ms: the run's clock
    assert set(prov["robots"]) == {str(r) for r in np.unique(ids[:, 0])}
    assert all(f["robot_type"] == "reacher" and "t0_mono_ms" in f for f in prov["robots"].values())
    req = pq.read_table(run_dir / "requests.parquet")
    by_seq = {}
    for r, s, q, inf in zip(*(req.column(c).to_numpy() for c in ("robot", "seq", "queue_wait_ms", "inference_ms"))):
        by_seq.setdefault((int(r), int(s)), set()).add((float(q), float(inf)))
    with_source = ids[:, 2] >= 0
    assert with_source.mean() > 0.8
    for (robot, _session, seq, *_), (qw, inf, _age) in zip(ids[with_source], times[with_source]):
        assert (float(qw), float(inf)) in by_seq[(int(robot), int(seq))]  # the source request's server durations
        assert qw >= 0 and inf > 0
    for robot in np.unique(ids[:, 0]):  # seq never goes back within a session
        for s in np.unique(ids[(ids[:, 0] == robot) & (ids[:, 1] >= 0), 1]):
            seqs = ids[(ids[:, 0] == robot) & (ids[:, 1] == s), 2]
            assert np.all(np.diff(seqs) >= 0), (robot, s)


def test_bench_dataset_converts_a_recorded_run_after_the_fact(run_dir, tmp_path, capsys):
    out = tmp_path / "again"
    assert cli.main(["dataset", str(run_dir), str(out)]) == 0
    assert "lab: " in capsys.readouterr().out
    a, b = _frames(_dataset(run_dir / "dataset" / "lab")), _frames(_dataset(out / "lab"))
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert cli.main(["dataset", str(run_dir), str(out)]) == 2  # never into an existing directory
    assert "already exists" in capsys.readouterr().err


def test_a_run_without_recording_gets_a_clear_refusal(tmp_path, capsys):
    schema = pa.schema([("robot", pa.int32()), ("t", pa.float64())])
    pq.write_table(schema.empty_table(), tmp_path / "ticks.parquet")
    assert cli.main(["dataset", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "recorded no observations" in err and "--record-dataset" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "record, words",
    [
        ("{datset: true}", ["record.datset", "dataset"]),
        ("{dataset: yes please}", ["record.dataset"]),
        ("{dataset: true, dir: EXISTING}", ["record.dir", "already exists"]),
    ],
)
def test_a_bad_record_config_is_refused_with_its_key(record, words, tmp_path, capsys):
    record = record.replace("EXISTING", str(tmp_path))
    assert cli.main(["validate", "scenarios/smoke.yaml", "--set", f"record={record}"]) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err
    assert "Traceback" not in err


def test_the_plain_path_never_imports_lerobot():
    code = (
        "import sys, bench.cli, bench.run.runner, bench.run.collect, bench.fleet.shard, bench.fleet.loop, "
        "bench.scenario.load; sys.exit(int('lerobot' in sys.modules or 'torch' in sys.modules))"
    )
    assert (
        subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}).returncode
        == 0
    )


def test_record_dataset_flag_checks_its_directory_like_the_key(tmp_path, capsys):
    assert cli.main(["run", "scenarios/smoke.yaml", "--record-dataset", str(tmp_path), "--check"]) == 2
    err = capsys.readouterr().err
    assert "record.dir" in err and "already exists" in err and "Traceback" not in err


def test_a_group_at_a_fractional_fps_cannot_be_recorded(capsys):
    sets = ["fleet.groups.0.fps=12.5", "servers.manifest={allow_resampling: true}", "record={dataset: true}"]
    assert cli.main(["validate", "scenarios/smoke.yaml", *(x for s in sets for x in ("--set", s))]) == 2
    err = capsys.readouterr().err
    assert ".fps" in err and "whole number" in err and "'lab'" in err and "Traceback" not in err


def test_a_group_at_the_default_fps_can_record_a_dataset():
    """A group that names no fps ticks at the default 30, a whole number: recording is allowed (it crashed on
    `float(None)` before)."""
    import yaml

    from bench.scenario.load import SCENARIOS_DIR, build_scenario

    data = yaml.safe_load((SCENARIOS_DIR / "incidents" / "stutter_source.yaml").read_text())
    assert "fps" not in data["fleet"]["groups"][0]
    data["record"] = {"dataset": True}
    assert build_scenario(data).record["dataset"] is True
