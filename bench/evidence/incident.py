"""`bench incident`: turn one robot's logs of a bad minute into a scenario that makes it happen again.

    server audit log (JSON lines, server/audit.py) ──┐
    edge log of the robot (edge-log JSONL, or a      ├─► timeline of what the robot saw ─► scenario YAML ─► bench run
      bench run directory: requests/transitions)  ───┘   (network delay, outages, server time)       └─► stutter compared

What is reconstructed, per window of the edge log (times relative to the window's start):
- network delay: each answered request's delay beyond the window's lowest `network_ms` (plus its
  queue wait) is spread over the seconds it was in flight; stretches of seconds above 30 ms become
  `latency` faults with that excess (half each way);
- outages: a stretch out of STREAMING with a RECONNECTING in it is a lost link (`partition`, from
  the RECONNECTING to about a reconnect before STREAMING again); one that no answered request was
  in flight through is a silent link (a `timeout` black hole since the last answer);
- server load: the audit lines of the window (all sessions of the replica) give the inference time
  distribution (emulated on the replay's replica) and the request rate; the robot's own queue wait
  is part of the delay above (the replay's server does not queue: the robot sees the same round trip).
Stutter is the time the robot was not STREAMING (STALLED, DEGRADED, RECONNECTING, DEAD) in 0.5 s bins;
`compare_stutter` scores a replay against the original (recall and precision within a tolerance).

The edge log format (one JSON object per line; docs/scenarios.md "Incident replay"):
    {"kind": "robot", "robot_type": "reacher", "fps": 30, "policy": "reacher", "engine": {...}}
    {"kind": "request", "t": 12.03, "seq": 41, "rtt_ms": 18.2, "queue_wait_ms": 0.4, "inference_ms": 6.1,
     "network_ms": 11.7, "outcome": "ok"}
    {"kind": "transition", "t": 14.2, "from": "STREAMING", "to": "DEGRADED", "reason": "request timed out"}
`t` is seconds on one clock (any origin); a bench run's records use seconds since its t=0.

The window is clipped to the whole seconds the edge log's records span (`clip_window`, said on stderr): the
work, and the written scenario's duration, follow the logs, never the width asked (`--to 1e9` was a
billion one-second cells walked, and a scenario that would have run for 31 years).

What cannot be replayed is an `IncidentError` naming the flag, file or line: a window that is not finite
or shorter than a stutter bin, an edge log line that is not a record, logs with nothing in the window, an
audit file without one audit line. A scenario is written only from records that were read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.evidence.edgelog import EdgeLog, IncidentError, stretches

BIN_S = 0.5
EDGE_LOG_HELP = "an edge log holds one JSON object a line (docs/scenarios.md, Incident replay)"


def check_window(t0: float, t1: float) -> None:
    """The window a scenario can be written for: finite, and at least one stutter bin long."""
    if not (math.isfinite(t0) and math.isfinite(t1)):
        raise IncidentError(f"--from {t0:g} --to {t1:g}: give finite seconds on the edge log's clock")
    if t1 - t0 < BIN_S:
        raise IncidentError(
            f"--from {t0:g} --to {t1:g}: --to must be at least {BIN_S:g} s after --from "
            f"(stutter is compared in {BIN_S:g} s bins)"
        )


def _seconds(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def clip_window(log: EdgeLog, t0: float, t1: float) -> tuple[float, float]:
    """[t0, t1) clipped to the whole seconds the log's records span, and still at least a stutter bin long.

    Everything downstream is as long as the window (one-second delay cells, stutter bins, the scenario's
    duration_s, so the replay's run time): past the records there is nothing to reconstruct."""
    ts = [r["t"] for r in log.requests] + [tr["t"] for tr in log.transitions]
    if not ts:
        return t0, t1
    start = max(t0, float(math.floor(min(ts))))
    end = min(t1, max(float(math.floor(max(ts)) + 1), start + BIN_S))  # half-open: the last record's second kept
    return max(t0, min(start, end - BIN_S)), end


def read_edge_log(path: str | Path, robot: int | None = None) -> EdgeLog:
    """An edge-log JSONL file, a bench run directory (its parquet records of `robot`), or a LeRobotDataset
    recorded with the bench's provenance (bench.evidence.incident_dataset)."""
    path = Path(path)
    if path.is_dir():
        from bench.evidence import incident_dataset

        if incident_dataset.is_dataset(path):
            return incident_dataset.read_dataset_log(path, robot)
        return _from_run_dir(path, robot)
    log = EdgeLog()
    try:
        text = path.read_bytes().decode()
    except UnicodeDecodeError as exc:
        raise IncidentError(f"{path}: not a text file ({exc.reason} at byte {exc.start}); {EDGE_LOG_HELP}") from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise IncidentError(f"{path} line {n}: not JSON ({exc.msg}); {EDGE_LOG_HELP}") from None
        if not isinstance(rec, dict):
            raise IncidentError(f"{path} line {n}: a JSON {type(rec).__name__}, not an object; {EDGE_LOG_HELP}")
        kind = rec.pop("kind", "")
        if kind in ("request", "transition") and not _seconds(rec.get("t")):
            raise IncidentError(f"{path} line {n}: a {kind} record needs t, finite seconds; {EDGE_LOG_HELP}")
        if kind == "transition" and not isinstance(rec.get("to"), str):
            raise IncidentError(f"{path} line {n}: a transition record needs to, the state entered; {EDGE_LOG_HELP}")
        if kind == "robot":
            log.robot = rec
        elif kind == "request":
            log.requests.append(rec)
        elif kind == "transition":
            log.transitions.append(rec)
    log.requests.sort(key=lambda r: r["t"])
    log.transitions.sort(key=lambda r: r["t"])
    return log


def _from_run_dir(run: Path, robot: int | None) -> EdgeLog:
    import pyarrow.parquet as pq

    if robot is None:
        raise IncidentError("a bench run directory holds many robots: pass --robot N")
    missing = [f for f in ("requests.parquet", "transitions.parquet") if not (run / f).is_file()]
    if missing:
        raise IncidentError(
            f"{run} is a directory without {' or '.join(missing)}; --edge takes a bench run "
            "directory (reports/<scenario>/<stamp>) or an edge-log file"
        )
    log = EdgeLog()
    req = pq.read_table(run / "requests.parquet").to_pylist()
    log.requests = [
        {k: r[k] for k in ("t", "seq", "rtt_ms", "queue_wait_ms", "inference_ms", "network_ms", "outcome")}
        for r in req
        if r["robot"] == robot
    ]
    tr = pq.read_table(run / "transitions.parquet").to_pylist()
    log.transitions = [
        {"t": r["t"], "from": r["from_state"], "to": r["to_state"], "reason": r["reason"]}
        for r in tr
        if r["robot"] == robot
    ]
    if not log.requests and not log.transitions:
        robots = sorted({r["robot"] for r in req} | {r["robot"] for r in tr})
        raise IncidentError(
            f"{run} has no records of robot {robot}; its robots: {', '.join(map(str, robots)) or 'none'}"
        )
    log.robot = run_robot_facts(run, robot)
    log.requests.sort(key=lambda r: r["t"])
    log.transitions.sort(key=lambda r: r["t"])
    return log


def run_robot_facts(run: Path, robot: int) -> dict:
    """What a replay needs of one robot of a bench run: robot_type, fps, episode_s, the engine settings it ran
    with, cameras, the policy (the first replica's checkpoint), and the clock facts (`t0_mono_ms`, and
    `replica_t0_mono_ms` for replicas on another clock); {} when the run's shard specs do not name the robot."""
    facts: dict = {}
    for spec_path in sorted((run / "manifests").glob("shard-*.json")):
        for spec in json.loads(spec_path.read_text())["robots"]:
            if spec["robot"] == robot:
                engine = {
                    k: v
                    for k, v in spec["engine"].items()
                    if k
                    not in (
                        "connect_endpoints",
                        "action_names",
                        "state_dim",
                        "fps",
                        "cameras",
                        "model_id",
                        "task",
                        "client_uuid",
                    )
                }
                facts = {
                    "robot_type": spec["robot_type"],
                    "fps": spec["fps"],
                    "episode_s": spec["episode_s"],
                    "engine": engine,
                    "cameras": spec.get("cameras"),
                }
    scen = run / "scenario.yaml"
    if scen.is_file() and facts:
        import yaml

        raw = yaml.safe_load(scen.read_text())
        replicas = raw.get("servers", {}).get("replicas", [])
        if replicas:
            facts["policy"] = replicas[0].get("checkpoint")
    clock = run / "clock.json"
    if clock.is_file() and facts:
        times = json.loads(clock.read_text())
        facts["t0_mono_ms"] = times["t0_mono_ms"]
        # t = 0 on the clock of each replica that ran on another one (bench.fleet.clock: runner + its offset)
        other = {
            n.split(":", 1)[1]: times["t0_mono_ms"] + o["offset_ms"]
            for n, o in (times.get("offsets") or {}).items()
            if n.startswith("server:") and not o.get("same_clock", True)
        }
        if other:
            facts["replica_t0_mono_ms"] = other
    return facts


def write_edge_log(log: EdgeLog, path: str | Path) -> None:
    lines = [json.dumps({"kind": "robot", **log.robot})]
    lines += [json.dumps({"kind": "request", **_finite(r)}) for r in log.requests]
    lines += [json.dumps({"kind": "transition", **r}) for r in log.transitions]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(lines) + "\n")


def _finite(d: dict) -> dict:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def read_audit_lines(paths: list[str | Path]) -> list[dict]:
    rows = []
    for p in paths:
        for line in Path(p).read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line
            if isinstance(row, dict):  # an audit line is an object (server/audit.py); anything else is not one
                rows.append(row)
    return rows


def audit_origin(log: EdgeLog, audit_path: str | Path) -> float | None:
    """t = 0 on the clock of the replica that wrote `audit_path`: the run's, or that replica's own where it ran on
    another clock (clock.json offsets); None (no windowing, rather than a wrong one) when the file cannot be
    told apart from such a replica's."""
    other = log.robot.get("replica_t0_mono_ms") or {}
    stem = Path(audit_path).stem
    if stem.startswith("audit-") and stem[len("audit-") :] in other:
        return other[stem[len("audit-") :]]
    return log.robot.get("t0_mono_ms") if stem.startswith("audit-") or not other else None


def audit_window(rows: list[dict], t0_mono_ms: float | None, t0: float, t1: float) -> list[dict]:
    """Audit lines inside the window, when the edge clock's origin on the server's monotonic clock is
    known (bench runs: one host, one clock); all lines otherwise."""
    if t0_mono_ms is None:
        return rows
    lo, hi = t0_mono_ms + t0 * 1e3, t0_mono_ms + t1 * 1e3
    return [r for r in rows if r.get("mono_ms") is not None and lo <= r["mono_ms"] < hi]


# --- what the robot saw -> a timeline -------------------------------------------------------------


def _num(v) -> float:
    try:
        v = float(v)
    except (TypeError, ValueError):
        return math.nan
    return v


def reconstruct(log: EdgeLog, duration: float, audit: list[dict]) -> dict:
    """The faults, base latency and server time that reproduce `log` (already windowed to 0..duration)."""
    ok = [
        r
        for r in log.requests
        if r.get("outcome") == "ok"
        and math.isfinite(_num(r.get("network_ms")))
        and math.isfinite(_num(r.get("rtt_ms")))
    ]
    base = min((_num(r["network_ms"]) for r in ok), default=0.0)
    secs = int(math.ceil(duration))
    # what a request saw beyond the base network, spread over the time it was in flight
    excess = np.zeros(secs)
    for r in ok:
        extra = _num(r["network_ms"]) - base + max(_num(r.get("queue_wait_ms")), 0.0)
        t_sent = r["t"] - _num(r["rtt_ms"]) / 1e3
        for sec in range(max(0, int(t_sent)), min(secs, int(math.ceil(r["t"])))):
            excess[sec] = max(excess[sec], extra)
    faults: list[dict] = []
    out_windows = []
    for a, b, states in stretches(log, duration):
        # a stretch with failed requests and no answer in flight through it is an outage, not a slow link
        covered = any(r["t"] - _num(r["rtt_ms"]) / 1e3 <= a + 0.1 and r["t"] >= a + 0.2 for r in ok)
        failed = any(a - 0.5 <= r["t"] <= b + 0.5 and r.get("outcome") != "ok" for r in log.requests)
        if "RECONNECTING" in states:
            start, end, action = a, max(a + 0.2, b - 0.5), "partition"  # liveliness notices a cut link at once;
            # the robot streams again about a reconnect (<= initial backoff) after the heal
            if log.stutter == "held":  # held: the robot ran out of actions after the cut, which came after the
                # last answer (at most a chunk's length, ~1.5 s here, before)
                start = max(a - 1.5, max((r["t"] for r in ok if r["t"] <= a), default=a))
        elif failed and not covered:
            last_ok = max((r["t"] for r in ok if r["t"] <= a), default=a)
            start, end, action = max(last_ok, a - 1.0), b, "timeout"  # silent since the last answer
        else:
            continue  # answers kept coming, only late: the latency windows below explain it
        if end - start < 0.2:
            continue
        fault = {
            "at": round(max(start, 0.0), 2),
            "target": "site:incident",
            "action": action,
            "duration": round(end - max(start, 0.0), 2),
        }
        if action == "timeout":
            fault["timeout"] = 0
        faults.append(fault)
        out_windows.append((start, end))
    threshold = max(30.0, base)  # below that a stretch of seconds does not stall a robot
    if log.stutter == "held":  # round trips read from a dataset's ticks are known to a tick
        threshold += 1e3 / float(log.robot.get("fps") or 30)
    sec = 0
    while sec < secs:
        if excess[sec] <= threshold or any(a - 0.5 <= sec <= b for a, b in out_windows):
            sec += 1
            continue
        e = sec + 1
        while (
            e < secs
            and excess[e] > threshold
            and abs(excess[e] - excess[sec]) <= 0.3 * excess[sec] + 10
            and not any(a - 0.5 <= e <= b for a, b in out_windows)
        ):
            e += 1
        level = float(np.median(excess[sec:e]))
        faults.append(
            {
                "at": float(sec),
                "target": "site:incident",
                "action": "latency",
                "latency": int(round(level / 2)),
                "duration": float(e - sec),
            }
        )
        sec = e
    inf = [_num(r.get("inference_ms")) for r in audit if r.get("outcome", "ok") == "ok"]
    inf = [x for x in inf if math.isfinite(x)]
    if not inf:
        inf = [_num(r.get("inference_ms")) for r in ok if math.isfinite(_num(r.get("inference_ms")))]
    server = {
        "inference_ms_p50": float(np.median(inf)) if inf else 0.0,
        "inference_ms_std": float(np.std(inf)) if inf else 0.0,
        "audit_lines": len(audit),
        "sessions": len({r.get("session_id") for r in audit}),
        "requests_per_s": len(audit) / duration if duration else 0.0,
    }
    faults.sort(key=lambda f: f["at"])
    return {
        "base_network_ms": base,
        "faults": faults,
        "server": server,
        "stutter_s": sum(b - a for a, b, _ in stretches(log, duration)),
    }


def incident_scenario(name: str, log: EdgeLog, duration: float, audit: list[dict], source: str) -> dict:
    rec = reconstruct(log, duration, audit)
    robot = log.robot or {}
    srv = rec["server"]
    # the replica's own forward pass still runs; emulate only the part above it (the reacher's is a few ms)
    emulated = max(0.0, srv["inference_ms_p50"] - 3.0)
    group = {
        "name": "robot",
        "robot": robot.get("robot_type", "reacher"),
        "count": 1,
        "fps": robot.get("fps", 30),
        "site": "incident",
        "engine": dict(robot.get("engine") or {}),
    }
    if robot.get("episode_s"):
        group["episode_s"] = robot["episode_s"]
    scenario = {
        "name": name,
        "description": (
            f"Replay of an incident ({source}): {len(rec['faults'])} network fault(s) over "
            f"{duration:g} s, base network {rec['base_network_ms']:.0f} ms, server "
            f"{srv['inference_ms_p50']:.0f} ms per request; the robot stuttered {rec['stutter_s']:.1f} s."
        ),
        "duration_s": round(duration, 2),
        "warmup_s": 5,
        "seed": 0,
        "fleet": {"shards": 1, "groups": [group]},
        "sites": {
            "incident": {
                "profile": "lan",
                "overrides": {"latency": {"latency": int(round(rec["base_network_ms"] / 2))}},
            }
        },
        "servers": {
            "replicas": [
                {
                    "id": "r0",
                    "checkpoint": robot.get("policy") or group["robot"],
                    "max_sessions": 8,
                    **(
                        {
                            "emulated_latency": {
                                "distribution": "normal",
                                "mean_ms": round(emulated, 1),
                                "std_ms": round(srv["inference_ms_std"], 1),
                                "min_ms": 0.0,
                            }
                        }
                        if emulated > 1.0
                        else {}
                    ),
                }
            ]
        },
        "faults": rec["faults"],
        "assertions": ["dead_robots == 0", "staleness_violations == 0"]
        + (["group[robot].fallback_ticks > 0"] if rec["stutter_s"] > 0.5 else []),
    }
    return scenario


# --- stutter comparison ---------------------------------------------------------------------------


def stutter_bins(log: EdgeLog, duration: float) -> np.ndarray:
    bins = np.zeros(int(math.ceil(duration / BIN_S)), bool)
    for a, b, _ in stretches(log, duration):
        a, b = max(a, 0.0), min(b, duration)  # a stretch in the warm-up (t < 0) or past the end is not scored
        if b > a:
            bins[int(a // BIN_S) : int(math.ceil(b / BIN_S))] = True
    return bins


def compare_stutter(original: EdgeLog, replay: EdgeLog, duration: float, tolerance_s: float = 1.0) -> dict:
    a, b = stutter_bins(original, duration), stutter_bins(replay, duration)
    k = int(round(tolerance_s / BIN_S))

    def near(x, y):  # share of x's stutter bins with a y stutter bin within the tolerance
        idx = np.nonzero(x)[0]
        if not idx.size:
            return 1.0
        return float(np.mean([y[max(0, i - k) : i + k + 1].any() for i in idx]))

    return {
        "original_stutter_s": float(a.sum() * BIN_S),
        "replay_stutter_s": float(b.sum() * BIN_S),
        "recall": near(a, b),
        "precision": near(b, a),
    }


def reproduced(score: dict, min_recall: float = 0.7, min_precision: float = 0.5, max_factor: float = 2.0) -> bool:
    """The replay stuttered where the robot did (recall), not elsewhere (precision), about as long."""
    a, b = score["original_stutter_s"], score["replay_stutter_s"]
    similar = (a == b == 0) or (a > 0 and b > 0 and max(a, b) / min(a, b) <= max_factor)
    return score["recall"] >= min_recall and score["precision"] >= min_precision and similar


def replay_log_of(run_dir: Path, stutter: str = "states") -> EdgeLog:
    """The replay's robot 0, its stutter read as the original's was (`EdgeLog.stutter`)."""
    if stutter == "held":
        from bench.evidence.incident_dataset import held_log_of_run

        return held_log_of_run(Path(run_dir), 0)
    return _from_run_dir(Path(run_dir), 0)


def make_incident(
    edge: str,
    audit: list[str],
    t0: float,
    t1: float,
    out: Path,
    name: str | None = None,
    robot: int | None = None,
    export_dir: Path | None = None,
    say: Callable[[str], None] | None = None,
) -> tuple[dict, EdgeLog]:
    """Write the replay scenario to `out`; with `export_dir`, also the window's logs (edge-log.jsonl,
    audit.jsonl: the incident's evidence, re-runnable without the original run). The window is clipped to the
    records (`clip_window`; `say` is told so in a line); the returned window's `span` is the one used."""
    import yaml

    check_window(t0, t1)
    log = read_edge_log(edge, robot)
    ts = [r["t"] for r in log.requests + log.transitions]
    if not any(t0 <= t < t1 for t in ts):
        raise IncidentError(
            f"--from {t0:g} --to {t1:g}: none of the {len(ts)} records of {edge} falls in the window "
            f"(their t runs {min(ts):g}..{max(ts):g} s); pick a window inside it"
            if ts
            else f"{edge} holds no request or transition records; {EDGE_LOG_HELP}"
        )
    asked, clipped = f"--from {t0:g} --to {t1:g}", clip_window(log, t0, t1)
    clipped_from = "" if clipped == (t0, t1) else f" ({asked} clipped to the records)"
    t0, t1 = clipped
    if clipped_from and say is not None:
        say(
            f"{asked} runs past the records of {edge} (their t runs {min(ts):g}..{max(ts):g} s): window clipped to "
            f"{t0:g}..{t1:g} s"
        )
    window = log.window(t0, t1)
    lines = []
    for path in audit:  # each replica's audit log on its own clock: audit-<replica>.jsonl, as a run writes them
        rows = read_audit_lines([path])
        if not rows:
            raise IncidentError(
                f"--audit {path} holds no audit line (a JSON object a line, server/audit.py); give "
                "the replica's audit log, or leave --audit out to take server time from the edge log"
            )
        origin = audit_origin(log, path)
        if origin is None and log.stutter == "held" and not log.robot.get("replica_t0_mono_ms"):
            from bench.evidence.incident_dataset import audit_origin_by_join

            origin = audit_origin_by_join(log, rows)  # a robot's own clock: placed by the (session, seq) join
        lines += audit_window(rows, origin, t0, t1)
    name = name or out.stem
    scenario = incident_scenario(
        name,
        window,
        t1 - t0,
        lines,
        f"{Path(edge).name}, robot {robot if robot is not None else ''}, t {t0:g}..{t1:g} s".replace("robot , ", ""),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# Written by `bench incident` from {edge} ({len(window.requests)} request(s), {len(window.transitions)} "
        f"transition(s) in the window) and {len(audit)} audit log(s) ({len(lines)} line(s) in the window), "
        f"window {t0:g}..{t1:g} s{clipped_from}.\n"
        "# Faults reproduce what the robot saw (docs/scenarios.md, Incident replay); edit freely.\n"
    )
    out.write_text(header + yaml.safe_dump(scenario, sort_keys=False))
    if export_dir is not None:
        export_dir.mkdir(parents=True, exist_ok=True)
        kept = EdgeLog(
            dict(log.robot),
            [r for r in log.requests if t0 <= r["t"] < t1],
            [tr for tr in log.transitions if tr["t"] < t1],
        )
        write_edge_log(kept, export_dir / "edge-log.jsonl")
        (export_dir / "audit.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return scenario, window
