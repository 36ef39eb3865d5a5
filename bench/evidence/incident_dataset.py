"""`bench incident --edge DATASET`: a LeRobotDataset recorded with design 004 §12's provenance, read as an edge log.

    LeRobotDataset (LeRobot's loader)          per frame: provenance.ids (robot, session_index, seq, episode_id,
      + meta/bench_provenance.json               chunk_index, is_none, t_ms), provenance.times (queue_wait_ms,
                                                 inference_ms, action_age_s); sessions; per robot: type, engine
        │
        ▼  what the robot saw, from what it executed (an EdgeLog, bench.evidence.incident)
    requests: one per chunk the robot executed, at the tick of its first executed action: sent at that tick less
              the action's age (the age counts from the observation), answered half a tick before it (the chunk
              arrived between two ticks); rtt_ms, and network_ms = rtt_ms - queue_wait_ms - inference_ms
    lost requests: the seqs of a session the robot never executed, between two it did, around a stretch it held
    transitions: HELD while the robot had no chunk action mid-episode (is_none, or a fallback action),
              RECONNECTING inside such a stretch when the session changed across it, CONNECTING before an
              episode's first chunk (an episode start is no stutter), STREAMING otherwise

A dataset holds no engine states, so stutter is read as the ticks the robot held mid-episode ("held" stutter),
and the replay is scored the same way from its own ticks (`held_log_of_run`), never against the engine states of
an edge log. The audit log is cut to the window on the server's clock: where the dataset's meta names the run's
t = 0 on that clock (a bench run's), there; otherwise by joining the audit lines with the executed chunks on
(session_id, seq_id): the median of received_mono_ms less the request's send time (one-way network of error).

Invariant: LeRobot is imported only here and only when a dataset is read; a dataset without `t_ms` (recorded
before it was a provenance entry) or without the robot asked is an IncidentError naming what to do.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from bench.evidence.edgelog import EdgeLog, IncidentError
from bench.evidence.edgelog import stretches as held_stretches

HELD = "HELD"  # the robot had no chunk action mid-episode (a stutter state, bench.evidence.edgelog.STUTTER_STATES)
PROVENANCE_FILE = "bench_provenance.json"
# an episode starts with a tick or two of no action (its reset, its first request's round trip): no stutter
EPISODE_START_GRACE_S = 0.25


def is_dataset(path: str | Path) -> bool:
    return (Path(path) / "meta" / "info.json").is_file()


def held_transitions(t: np.ndarray, seq: np.ndarray, session: np.ndarray, episode: np.ndarray) -> list[dict]:
    """Transitions of the held-stutter reading (module doc) from per-tick arrays in time order: `seq` < 0 where the
    tick had no chunk action, `session` the session of the action (any integer id), `episode` the robot episode.

    An episode's first ticks before its first chunk are CONNECTING (an episode start, no stutter) for up to
    EPISODE_START_GRACE_S; longer, or begun while the robot held, they are HELD from the episode's start."""
    out: list[dict] = []
    state, last_session, held_since = None, None, 0.0
    chunk_in_episode, prev_episode, episode_start = False, None, 0.0

    def enter(new: str, at: float, reason: str) -> None:
        nonlocal state, held_since
        if new != state:
            if new == HELD:
                held_since = at
            out.append({"t": at, "from": state, "to": new, "reason": reason})
            state = new

    for i in range(len(t)):
        now = float(t[i])
        if episode[i] != prev_episode:
            prev_episode, chunk_in_episode, episode_start = episode[i], False, now
        if seq[i] >= 0:
            if state == HELD and last_session is not None and session[i] != last_session:
                out.append({"t": held_since, "from": HELD, "to": "RECONNECTING", "reason": "the session changed"})
                state = "RECONNECTING"
            chunk_in_episode, last_session = True, session[i]
            enter("STREAMING", now, "a chunk's action")
        elif chunk_in_episode or state == HELD:
            enter(HELD, now, "no chunk action: the robot held")
        elif now - episode_start > EPISODE_START_GRACE_S and last_session is not None:
            enter(HELD, episode_start, "no chunk since the episode began")
        else:
            enter("CONNECTING", now, "before the episode's first chunk")
    return out


def read_dataset_log(root: str | Path, robot: int | None = None) -> EdgeLog:
    """One robot's EdgeLog from a LeRobotDataset with the bench's provenance features (module doc)."""
    root = Path(root)
    try:
        import datasets
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        datasets.disable_progress_bars()
    except ImportError as exc:
        raise IncidentError(
            f"--edge {root} is a LeRobotDataset, and LeRobot cannot be imported here ({exc}): "
            "pip install -e '.[lerobot]' (docs/lerobot.md)"
        ) from None
    info = json.loads((root / "meta" / "info.json").read_text())
    features = info.get("features", {})
    names = (features.get("provenance.ids") or {}).get("names") or []
    time_names = (features.get("provenance.times") or {}).get("names") or []
    needed = ["robot", "session_index", "seq", "episode_id", "chunk_index", "is_none", "t_ms"]
    missing = [n for n in needed if n not in names] + [
        n for n in ("queue_wait_ms", "inference_ms", "action_age_s") if n not in time_names
    ]
    if missing:
        raise IncidentError(
            f"--edge {root}: a LeRobotDataset without the provenance entries {', '.join(missing)} "
            "(provenance.ids / provenance.times, docs/bench.md 'Recording a LeRobotDataset'); record it again "
            "with `bench run SCENARIO --record-dataset` and `bench dataset RUN_DIR OUT`"
        )
    meta_path = root / "meta" / PROVENANCE_FILE
    prov = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    ds = LeRobotDataset(f"bench/{root.name}", root=root)
    table = ds.hf_dataset.with_format("numpy")
    ids = np.asarray(table["provenance.ids"], np.int64).reshape(-1, len(names))
    times = np.asarray(table["provenance.times"], np.float64).reshape(-1, len(time_names))
    col = {n: ids[:, names.index(n)] for n in needed}
    tcol = {n: times[:, time_names.index(n)] for n in time_names}
    episode = np.asarray(table["episode_index"], np.int64).reshape(-1)
    robots = sorted({int(r) for r in col["robot"]})
    if robot is None:
        if len(robots) != 1:
            raise IncidentError(f"--edge {root} holds robots {', '.join(map(str, robots))}: pass --robot N")
        robot = robots[0]
    if robot not in robots:
        raise IncidentError(f"--edge {root} has no frames of robot {robot}; its robots: {', '.join(map(str, robots))}")
    mine = np.nonzero(col["robot"] == robot)[0]
    mine = mine[np.argsort(col["t_ms"][mine], kind="stable")]
    t = col["t_ms"][mine] / 1e3
    seq, session, chunk_index = col["seq"][mine], col["session_index"][mine], col["chunk_index"][mine]
    qw, inf, age = tcol["queue_wait_ms"][mine], tcol["inference_ms"][mine], tcol["action_age_s"][mine]
    sessions = list(prov.get("sessions") or [])
    facts = dict((prov.get("robots") or {}).get(str(robot)) or {})
    fps = float(facts.get("fps") or info.get("fps") or 30)
    half_tick = 0.5 / fps

    def session_id(index: int) -> str:
        return sessions[index] if 0 <= index < len(sessions) else f"session-{index}"

    log = EdgeLog()
    log.robot = {**facts, "robot_type": facts.get("robot_type") or info.get("robot_type"), "fps": fps}
    first: dict[tuple[int, int], int] = {}  # (session, seq) -> its first executed tick
    for k in range(len(t)):
        if seq[k] >= 0:
            first.setdefault((int(session[k]), int(seq[k])), k)
    for (sess, s), k in sorted(first.items(), key=lambda kv: kv[1]):
        rtt_ms = max(0.0, (age[k] - half_tick) * 1e3) if age[k] >= 0 else math.nan
        q = qw[k] if qw[k] >= 0 else math.nan
        i = inf[k] if inf[k] >= 0 else math.nan
        network = rtt_ms - (q if math.isfinite(q) else 0.0) - (i if math.isfinite(i) else 0.0)
        log.requests.append(
            {
                "t": float(t[k] - half_tick),
                "seq": s,
                "session_id": session_id(sess),
                "rtt_ms": rtt_ms,
                "queue_wait_ms": q,
                "inference_ms": i,
                "network_ms": max(0.0, network) if math.isfinite(network) else math.nan,
                "outcome": "ok",
                "chunk_index": int(chunk_index[k]),
            }
        )
    log.transitions = held_transitions(t, seq, session, episode[mine])
    log.requests += _lost_requests(log, t)
    log.requests.sort(key=lambda r: r["t"])
    log.stutter = "held"
    return log


def _lost_requests(log: EdgeLog, t: np.ndarray) -> list[dict]:
    """Seqs of one session never executed between two that were, inside a held stretch: requests the robot sent
    and got no answer to (or one it could not use), spread over the stretch; `outcome` "lost"."""
    out = []
    by_session: dict[str, list[dict]] = {}
    for r in log.requests:
        by_session.setdefault(r["session_id"], []).append(r)
    stretches = [(a, b) for a, b, _ in held_stretches(log, float(t[-1]) if len(t) else 0.0)]
    for reqs in by_session.values():
        reqs = sorted(reqs, key=lambda r: r["seq"])
        for before, after in zip(reqs, reqs[1:]):
            gap = after["seq"] - before["seq"] - 1
            if gap <= 0:
                continue
            inside = [(a, b) for a, b in stretches if before["t"] <= b and a <= after["t"]]
            if not inside:
                continue  # seqs superseded while the robot streamed: no stutter to explain
            a, b = inside[0]
            for j in range(gap):
                out.append(
                    {
                        "t": a + (b - a) * (j + 1) / (gap + 1),
                        "seq": before["seq"] + 1 + j,
                        "session_id": before["session_id"],
                        "outcome": "lost",
                    }
                )
    return out


def held_log_of_run(run_dir: str | Path, robot: int = 0) -> EdgeLog:
    """A bench run's robot read the held-stutter way, from its ticks.parquet: how a replay of a dataset incident is
    scored against the dataset."""
    import pyarrow.parquet as pq

    path = Path(run_dir) / "ticks.parquet"
    if not path.is_file():
        raise IncidentError(f"{run_dir} holds no ticks.parquet: the replay did not record its ticks")
    tk = pq.read_table(path, columns=["robot", "t", "seq", "session_id", "robot_episode"]).to_pydict()
    rows = [i for i, r in enumerate(tk["robot"]) if r == robot]
    rows.sort(key=lambda i: tk["t"][i])
    index: dict[str, int] = {}
    log = EdgeLog()
    log.transitions = held_transitions(
        np.array([tk["t"][i] for i in rows], float),
        np.array([tk["seq"][i] if tk["seq"][i] is not None else -1 for i in rows], np.int64),
        np.array([index.setdefault(tk["session_id"][i] or "", len(index)) for i in rows], np.int64),
        np.array([tk["robot_episode"][i] for i in rows], np.int64),
    )
    log.stutter = "held"
    return log


def audit_origin_by_join(log: EdgeLog, rows: list[dict]) -> float | None:
    """t = 0 of the dataset's clock on the server's monotonic clock, from the audit lines of requests the robot
    executed: median(received_mono_ms - sent_ms); None when none joins."""
    sent = {
        (r["session_id"], r["seq"]): (r["t"] * 1e3 - r["rtt_ms"])
        for r in log.requests
        if r.get("outcome") == "ok" and math.isfinite(r.get("rtt_ms", math.nan))
    }
    offsets = [
        float(row["received_mono_ms"]) - sent[key]
        for row in rows
        if isinstance(row.get("received_mono_ms"), (int, float))
        and (key := (row.get("session_id"), row.get("seq_id"))) in sent
    ]
    return float(np.median(offsets)) if offsets else None
