"""A recorded run's episodes as LeRobotDatasets: one dataset per group, written with LeRobot's own
`LeRobotDataset.create` / `add_frame` / `save_episode` / `finalize` (format v3.0).

    ticks.parquet ─────────┐ per tick: seq, session_id, episode_id, chunk_index, action_age_s, is_none
    observations.parquet ──┼─► frames of episode (robot, robot_episode) ─► DIR/<group>/ (LeRobotDataset)
    frames.parquet ────────┤ per tick: state, executed command; per camera: the frame the engine got
    requests.parquet ──────┘ per (robot, seq): queue_wait_ms, inference_ms of the action's source chunk

A dataset episode is one robot episode (the last one of each robot is cut at the run's end); a frame is one
tick, warm-up included, so an episode has exactly as many frames as ticks.parquet has ticks of it. `action` is
the command the robot executed (the engine's action clipped to the robot's action space, or its hold on a tick
without one). Design 004 §12's provenance is in two vector features, `provenance.ids` and `provenance.times`
(PROVENANCE_IDS, PROVENANCE_TIMES: each entry named in the features' `names`); a session id is a string, which
a LeRobot 0.4.4 feature cannot hold (numeric dtypes, `image`, `video`; `string` only for the task), so it is an
index into `meta/bench_provenance.json`'s sessions, a file that also maps each episode to its robot and robot
episode.

Invariant: nothing here writes LeRobot's layout itself, and LeRobot (with torch) is imported only when a
dataset is written: the bench's plain path never imports it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

# Design 004 §12's provenance of each executed action, as two vector features whose `names` say each entry.
# Vectors, not one (1,)-shaped feature each: LeRobot 0.4.4 stores a (1,) feature as a scalar `datasets.Value`,
# whose encoding calls int()/float() on a 1-element array, which numpy >= 2.3 refuses.
PROVENANCE_IDS = {  # "provenance.ids", int64: -1 where the tick had no action
    "robot": "the robot's number in the run (robots.parquet)",
    "session_index": "the action's session: an index into meta/bench_provenance.json's `sessions` (its session_id)",
    "seq": "seq_id of the request whose chunk the action came from (it restarts in every session)",
    "episode_id": "the engine's episode_id of that request",
    "chunk_index": "the action's index in that chunk",
    "is_none": "1: the engine had no action this tick and the robot held (the other ids are -1)",
    "t_ms": "the tick's time, milliseconds on the run's clock (0 at the run's start; negative in the warm-up)",
}
# a time the tick has not (no action, no reply timed): -1 as the ids have, since a NaN would make the dataset's
# stats (meta/stats.json, which LeRobot aggregates over every feature) NaN
NONE_TIME = -1.0
PROVENANCE_TIMES = {  # "provenance.times", float32: NONE_TIME where the tick had no action
    "queue_wait_ms": "the server's queue wait for that request (its reply's queue_wait_ms)",
    "inference_ms": "the server's inference time for that request (its reply's inference_ms)",
    "action_age_s": "the action's age when the robot executed it",
}


class DatasetError(ValueError):
    """A run that cannot be written as a dataset; the message names why and what to do."""


def features(robot_cls, cameras: dict | None) -> dict:
    """The LeRobot features of one group's dataset."""
    out = {
        "observation.state": {
            "dtype": "float32",
            "shape": (len(robot_cls.state_names),),
            "names": list(robot_cls.state_names),
        },
        "action": {"dtype": "float32", "shape": (len(robot_cls.action_names),), "names": list(robot_cls.action_names)},
    }
    for name, (h, w) in (cameras or {}).items():
        out[f"observation.images.{name}"] = {
            "dtype": "image",
            "shape": (h, w, 3),
            "names": ["height", "width", "channel"],
        }
    out["provenance.ids"] = {"dtype": "int64", "shape": (len(PROVENANCE_IDS),), "names": list(PROVENANCE_IDS)}
    out["provenance.times"] = {"dtype": "float32", "shape": (len(PROVENANCE_TIMES),), "names": list(PROVENANCE_TIMES)}
    return out


def _read(run_dir: Path, name: str):
    import pyarrow.parquet as pq

    path = run_dir / f"{name}.parquet"
    return pq.read_table(path) if path.is_file() else None


def _source_timings(requests, robot: int, seq: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(queue_wait_ms, inference_ms) of each tick's source request: the robot's last request of that seq at or
    before the tick (seq restarts in every session, so the latest one before the tick is the tick's)."""
    qw = np.full(len(seq), np.nan, np.float32)
    inf = np.full(len(seq), np.nan, np.float32)
    if requests is None:
        return qw, inf
    mine = requests["robot"] == robot
    r_seq, r_t = requests["seq"][mine], requests["t"][mine]
    r_qw, r_inf = requests["queue_wait_ms"][mine], requests["inference_ms"][mine]
    for s in np.unique(seq[seq >= 0]):
        rows = np.nonzero(r_seq == s)[0]
        if not len(rows):
            continue
        rows = rows[np.argsort(r_t[rows], kind="stable")]
        ticks = np.nonzero(seq == s)[0]
        at = np.searchsorted(r_t[rows], t[ticks], side="right") - 1
        at = np.where(at < 0, 0, at)  # a reply recorded after its first tick (the drain's clock): the first one
        qw[ticks], inf[ticks] = r_qw[rows[at]], r_inf[rows[at]]
    return qw, inf


def write_datasets(run_dir: str | Path, out: str | Path) -> list[str]:
    """One LeRobotDataset per group of the run in `out/<group>/`; returns a line per dataset written."""
    import yaml

    run_dir, out = Path(run_dir), Path(out)
    if not (run_dir / "ticks.parquet").is_file():
        raise DatasetError(
            f"{run_dir} holds no ticks.parquet: give a finished run's directory (reports/<scenario>/<stamp>)"
        )
    obs_table = _read(run_dir, "observations")
    if obs_table is None:
        raise DatasetError(
            f"{run_dir} recorded no observations: the run was made without record.dataset; run it again with "
            "`bench run SCENARIO --record-dataset`"
        )
    if out.exists():
        raise DatasetError(
            f"{out} already exists; a LeRobotDataset is created in a new directory: remove it or give another"
        )
    scenario = yaml.safe_load((run_dir / "scenario.yaml").read_text())
    groups = {g["name"]: g for g in scenario["fleet"]["groups"]}
    robots = _read(run_dir, "robots").to_pylist()
    ticks = _columns(
        _read(run_dir, "ticks"),
        ["robot", "t", "seq", "session_id", "episode_id", "chunk_index", "action_age_s", "is_none", "robot_episode"],
    )
    obs = _columns(obs_table, ["robot", "t", "robot_episode", "state", "command"])
    req = _read(run_dir, "requests")
    requests = None if req is None else _columns(req, ["robot", "t", "seq", "queue_wait_ms", "inference_ms"])
    frames = _read(run_dir, "frames")
    try:
        import datasets
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        datasets.disable_progress_bars()  # a bar per episode on the run's stderr
    except ImportError as exc:
        raise DatasetError(
            f"LeRobot cannot be imported here ({exc}): pip install -e '.[lerobot]' (docs/lerobot.md)"
        ) from None
    from bench.evidence.incident import run_robot_facts
    from bench.robots import robot_type

    lines = []
    for gname, g in groups.items():
        members = [r for r in robots if r["group"] == gname]
        if not members:
            continue
        cls = robot_type(g["robot"])
        cams = g.get("cameras")
        record_cams = bool((scenario.get("record") or {}).get("cameras", True)) and cams and frames is not None
        cam_shapes = (
            {n: (int(cams.get("height", 64)), int(cams.get("width", 64))) for n in cams.get("names", ["front"])}
            if record_cams
            else {}
        )
        t0 = time.perf_counter()
        ds = LeRobotDataset.create(
            repo_id=f"bench/{scenario['name']}_{gname}",
            fps=int(round(float(g.get("fps", 30)))),
            features=features(cls, cam_shapes),
            root=out / gname,
            robot_type=g["robot"],
            use_videos=False,
        )
        sessions: dict[str, int] = {}
        episodes, n_frames = [], 0
        task = g.get("task") or f"{g['robot']}: {gname}"
        for row in sorted(members, key=lambda r: r["robot"]):
            rid = int(row["robot"])
            tk = _rows(ticks, ticks["robot"] == rid)
            ob = _rows(obs, obs["robot"] == rid)
            order_t, order_o = np.argsort(tk["t"], kind="stable"), np.argsort(ob["t"], kind="stable")
            tk = {k: v[order_t] for k, v in tk.items()}
            ob = {k: v[order_o] for k, v in ob.items()}
            if len(tk["t"]) != len(ob["t"]) or not np.array_equal(tk["t"], ob["t"]):
                raise DatasetError(
                    f"robot {rid}: {len(tk['t'])} ticks but {len(ob['t'])} observations recorded; the run's records "
                    "are incomplete (a shard that crashed?)"
                )
            qw, inf = _source_timings(requests, rid, tk["seq"], tk["t"])
            images = _robot_frames(frames, rid, tk["t"], cam_shapes) if cam_shapes else {}
            for ep in np.unique(tk["robot_episode"]):
                idx = np.nonzero(tk["robot_episode"] == ep)[0]
                for i in idx:
                    sid = tk["session_id"][i] or ""
                    frame = {
                        "observation.state": np.asarray(ob["state"][i], np.float32),
                        "action": np.asarray(ob["command"][i], np.float32),
                        "task": task,
                        "provenance.ids": np.array(
                            [
                                rid,
                                sessions.setdefault(sid, len(sessions)) if sid else -1,
                                tk["seq"][i],
                                tk["episode_id"][i],
                                tk["chunk_index"][i],
                                int(tk["is_none"][i]),
                                int(round(float(tk["t"][i]) * 1e3)),
                            ],
                            np.int64,
                        ),
                        "provenance.times": np.nan_to_num(
                            np.array([qw[i], inf[i], tk["action_age_s"][i]], np.float32), nan=NONE_TIME
                        ),
                    }
                    for name, stack in images.items():
                        frame[f"observation.images.{name}"] = stack[i]
                    ds.add_frame(frame)
                ds.save_episode()
                episodes.append(
                    {"episode_index": len(episodes), "robot": rid, "robot_episode": int(ep), "frames": len(idx)}
                )
                n_frames += len(idx)
        ds.finalize()
        (out / gname / "meta" / "bench_provenance.json").write_text(
            json.dumps(
                {
                    "run": str(run_dir),
                    "scenario": scenario["name"],
                    "group": gname,
                    "sessions": list(sessions),
                    "episodes": episodes,
                    # per robot, what `bench incident` needs to replay it (bench.evidence.incident.run_robot_facts)
                    "robots": {str(r["robot"]): run_robot_facts(run_dir, int(r["robot"])) for r in members},
                    "provenance.ids": PROVENANCE_IDS,
                    "provenance.times": PROVENANCE_TIMES,
                },
                indent=1,
            )
        )
        dt = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in (out / gname).rglob("*") if p.is_file())
        lines.append(
            f"{gname}: {len(episodes)} episode(s), {n_frames} frame(s), {size / 1e6:.1f} MB in {dt:.1f} s "
            f"({dt / max(n_frames, 1) * 1e3:.2f} ms a frame) -> {out / gname}"
        )
    return lines


def _columns(table, names: list[str]) -> dict:
    out = {}
    for n in names:
        col = table.column(n)
        if n in ("state", "command"):  # one vector a tick, all of one length: a (ticks, dim) view of the values
            arr = col.combine_chunks()
            out[n] = arr.values.to_numpy(zero_copy_only=False).reshape(len(arr), -1) if len(arr) else np.zeros((0, 0))
        elif n == "session_id":
            out[n] = np.array(col.to_pylist(), dtype=object)
        else:
            out[n] = col.to_numpy(zero_copy_only=False)
    return out


def _rows(cols: dict, mask: np.ndarray) -> dict:
    return {k: v[mask] for k, v in cols.items()}


def _robot_frames(frames, rid: int, t: np.ndarray, cam_shapes: dict) -> dict[str, list]:
    """Each camera's frames of one robot, one per tick (at the ticks' t)."""
    import pyarrow.compute as pc

    mine = frames.filter(pc.equal(frames.column("robot"), rid))
    out = {}
    for name, (h, w) in cam_shapes.items():
        cam = mine.filter(pc.equal(mine.column("camera"), name))
        ft = cam.column("t").to_numpy()
        order = np.argsort(ft, kind="stable")
        if len(ft) != len(t) or not np.array_equal(ft[order], t):
            raise DatasetError(f"robot {rid}: camera {name!r} has {len(ft)} frames for {len(t)} ticks")
        pix = cam.column("pixels").to_pylist()
        out[name] = [np.frombuffer(pix[k], np.uint8).reshape(h, w, 3) for k in order]
    return out
