"""Chunking strategies under inference delay, closed loop in simulation: the delay in control steps is
simulated, so the figures do not depend on this machine's load (the real-system comparison is
`scenarios/chunking_vs_delay.yaml`).

A request goes out every `s` ticks (the execution horizon; d <= s) on the state of that tick; its
chunk exists d ticks later. While it is computed the robot executes what the strategy gives it:

    sync      nothing (None: the robot's hold) for d ticks, then the new chunk's rows 0..s-1 (the
              cycle is d + s ticks: blocking inference); every strategy's first chunk of an episode too
    append    the engine's append mode: the whole chunk queues behind the leftover (rows 0..H-1, each chunk
              executed whole, its row 0 d + 2 ticks after its observation); asked for when d + 2 are left
    naive     the previous chunk's rows s..s+d-1 (already committed), then the new chunk's rows d..s-1,
              unguided: the RTC paper's naive asynchronous baseline (append/replace without guidance)
    rtc       as naive, but the new chunk is sampled with RTC guidance on the previous chunk's rows
              s..s+horizon-1 (the first d of them are exactly what the robot executes meanwhile)
              (rtc_mode guidance, also on a checkpoint trained for training_time)
    rtc_training_time
              as naive, but the new chunk is sampled with the previous chunk's rows s..s+d-1 as its own
              rows 0..d-1, clean conditioning (rtc_mode training_time, arXiv 2512.05964): a checkpoint
              trained for it only (`bench train --robot reacher --rtc-mode training_time`)

The previous chunk's row s + i and the new chunk's row i are the same tick, and a request carries the
state of the tick its chunk's row 0 belongs to, as the edge engines do (`--obs-lag N`: of N ticks before it;
--obs-lag 1 models an engine that starts a chunk on the tick after its observation's). The policy is the
checkpoint's, normalised as the server does (`load_policy`, as bench.training.train.CheckpointPolicy); `hp` overrides
its sampling hyper-parameters for the run (prefix_schedule, max_guidance_weight, guidance_jacobian: as a
replica's manifest, `ChunkPolicy.override_hyper_params`) and
`horizon` the guided rows (the engine's execution_horizon; 0: the checkpoint's; -1: d, only the
committed rows, a hard mask).

    python -m bench.training.delay_eval --checkpoint reacher --delays 0,2,4,8,12,16 --episodes 40

prints success and seam jerk per strategy and delay and writes reports/delay_eval/<checkpoint>.json;
`--plot FILE... --out PREFIX` draws them (PREFIX_success.svg, PREFIX_seam_jerk.svg).
Invariant: one seed gives the same episodes to every strategy and delay (a paired comparison).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.evidence.seams import seam_metrics
from bench.robots import make_robot

STRATEGIES = ("sync", "append", "naive", "rtc", "rtc_training_time")
GUIDED = {"rtc": "guidance", "rtc_training_time": "training_time"}  # strategy -> the rtc_mode it samples with
REPO = Path(__file__).resolve().parents[2]


def run_strategy(
    checkpoint: str | Path,
    robot_type: str,
    strategy: str,
    delay: int,
    execution_steps: int,
    episodes: int,
    seed: int,
    horizon: int = 0,
    hp: dict[str, Any] | None = None,
    expert: bool = False,
    on_request: Callable[[np.ndarray, np.ndarray], None] | None = None,
    obs_lag: int = 0,
    delay_margin: int = 0,
) -> dict[str, Any]:
    """Success rate, seam jerk and held ticks of one (strategy, d, s) over `episodes` seeded episodes.
    `expert`: the robot type's scripted expert's plans (bench.training.experts.plan_chunks) instead of
    the checkpoint's chunks (its chunk size and rate kept), for every strategy but rtc.
    `on_request(state, committed)`: called at every request with its state and the robot-space rows the
    robot executes while it is computed ((0, A) at an episode's first request, which follows nothing;
    what bench.training.demos.collect_on_policy_prefix_demos labels).
    `obs_lag`: requests carry the state of `obs_lag` ticks before the one their chunk's row 0 belongs to (1: an
    engine that starts a chunk on the tick after its observation's).
    `delay_margin`: the policy is told d + delay_margin (guided or committed rows) while the robot still switches to
    the new chunk at row d (an engine whose delay estimate runs over the real delay by that many ticks)."""
    import torch

    from bench.training.experts import plan_chunks
    from server.policies.stats import ACTION_KEY, STATE_KEY

    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r}; use one of {STRATEGIES}")
    if expert and strategy in GUIDED:
        raise ValueError("the scripted expert takes no prefix: use sync, append or naive with expert")
    d, s = int(delay), int(execution_steps)
    if not 0 <= d <= s:
        raise ValueError(f"need 0 <= d <= s (one request in flight), got d={d}, s={s}")
    told = d + max(int(delay_margin), 0)  # the inference delay the policy is given
    loaded = load_policy(checkpoint)
    policy, config = loaded.policy, loaded.config
    overrides = dict(hp or {})
    if strategy in GUIDED and "rtc_mode" in policy.hp:  # flow_matching, flow_transformer: the strategy's mode
        overrides["rtc_mode"] = GUIDED[strategy]
    # as a replica's manifest does (model.hyper_params): only sampling ones, checked; a checkpoint not trained for
    # training_time refuses it here
    policy.override_hyper_params(overrides)
    if strategy == "rtc_training_time" and "rtc_mode" not in policy.hp:
        raise ValueError(
            f"{checkpoint}: rtc_training_time needs a flow_matching or flow_transformer checkpoint "
            f"trained with rtc_mode training_time (`bench train --robot {robot_type} --rtc-mode training_time`)"
        )
    horizon = d if horizon < 0 else int(horizon or config.execution_horizon)
    mean_s, std_s = loaded.stats[STATE_KEY]["mean"], loaded.stats[STATE_KEY]["std"]
    mean_a, std_a = loaded.stats[ACTION_KEY]["mean"], loaded.stats[ACTION_KEY]["std"]

    def infer(state, prefix):
        if expert:
            return plan_chunks(robot_type, np.asarray(state)[None], config.chunk_size, fps=config.fps)[0]
        x = (torch.as_tensor(state, dtype=torch.float32)[None] - mean_s) / std_s
        with torch.no_grad():
            return policy.predict_action_chunk({"observation.state": x}, [told], [prefix])[0]

    def robot(chunk_model):
        return chunk_model if expert else (chunk_model * std_a + mean_a).numpy()

    env = make_robot(robot_type, seed=seed, fps=config.fps)
    executed, seams, starts, outcomes = [], [], [], []
    held = 0
    for e in range(episodes):
        state, _ = env.reset(seed=seed + e)
        recent = [state] * (obs_lag + 1)  # the states of the last obs_lag + 1 ticks, oldest first
        starts.append(len(executed))
        previous = None  # model-space chunk of the last request
        pending: list = []
        tick, next_request = 0, 0
        while True:
            if tick == next_request:
                if on_request is not None:
                    committed = robot(previous)[s : s + d] if previous is not None and strategy != "sync" else []
                    on_request(
                        np.asarray(recent[0], dtype=np.float32),
                        np.asarray(committed, dtype=np.float32).reshape(-1, env.action_space.shape[0]),
                    )
                prefix = None
                if strategy == "rtc" and previous is not None and horizon > 0:
                    prefix = previous[s : s + horizon]
                if strategy == "rtc_training_time" and previous is not None and told > 0:
                    prefix = previous[s : s + told]  # the rows the robot executes meanwhile (and the margin's)
                new = infer(recent[0], prefix if prefix is not None and len(prefix) else None)
                rows = robot(new)
                if strategy == "append":
                    # the engine's append mode (edge.queue): the whole new chunk queues behind the leftover,
                    # asked for when d + 2 actions are left (edge.remote.plan_execution), so it lands in time
                    buffer = min(d + 2, len(rows))
                    pending = (pending if previous is not None else [None] * d) + list(rows)
                    next_request = tick + len(pending) - buffer
                    if previous is not None:  # an episode's first chunk follows nothing: no seam
                        seams.append(len(executed) + len(pending) - len(rows))
                    previous = new
                    action = pending.pop(0) if pending else None
                    held += action is None
                    state, _, terminated, truncated, info = env.step(action)
                    recent = recent[1:] + [state]
                    executed.append(info["command"])
                    tick += 1
                    if terminated or truncated:
                        outcomes.append(bool(info["is_success"]))
                        break
                    continue
                if strategy == "sync" or previous is None:
                    # blocking, and every strategy's first chunk of an episode: nothing ran meanwhile, so
                    # the chunk runs from row 0 (the engine's trim "consumed": no over-trim from standstill)
                    pending = [None] * d + list(rows[:s])
                    next_request = tick + d + s
                else:
                    pending = list(robot(previous)[s : s + d]) + list(rows[d:s])
                    next_request = tick + s
                if previous is not None:
                    seams.append(len(executed) + d)  # the new chunk's first executed row
                previous = new
            action = pending.pop(0) if pending else None
            held += action is None
            state, _, terminated, truncated, info = env.step(action)
            recent = recent[1:] + [state]
            executed.append(info["command"])
            tick += 1
            if terminated or truncated:
                outcomes.append(bool(info["is_success"]))
                break
    scale = env.action_space.high - env.action_space.low
    seam = seam_metrics(np.asarray(executed), seams, episode_starts=starts, scale=scale)
    return {
        "strategy": strategy + ("_expert" if expert else ""),
        "delay_steps": d,
        "execution_steps": s,
        "horizon": horizon,
        "hp": hp or {},
        "obs_lag": obs_lag,
        "delay_margin": told - d,
        "episodes": episodes,
        "success_rate": float(np.mean(outcomes)),
        "held_ticks": int(held),
        "seam_jerk_p95": seam["seam_jerk_p95"],
        "seam_jerk_median": seam["seam_jerk_median"],
        "within_jerk_median": seam["within_jerk_median"],
    }


def load_policy(checkpoint: str | Path):
    """The checkpoint as the server loads it (policy, config, stats); bench.training.train and .demos import
    this module, so it does not import them back."""
    from server.policies.checkpoint import load_checkpoint

    return load_checkpoint(checkpoint)


def plan_s(d: int, chunk: int) -> int:
    """The remote engine's derived execution horizon: H // 2 clamped to [d, H - d], d when no s fits (the rule
    of edge.remote.plan_execution, which bench.training may not import; tests/bench/training checks they agree)."""
    return min(max(chunk // 2, d), chunk - d) if 2 * d <= chunk else d


def plot(files: list[Path], out_prefix: Path) -> list[Path]:
    """`<out_prefix>_success.svg` and `<out_prefix>_seam_jerk.svg`: each (file, strategy) a line over d;
    a file written with --tag names its lines `strategy-tag`. A `bench run` sweep.json of
    scenarios/chunking_vs_delay.yaml draws one line per group (d from the latency toxic's ms each way)."""
    from bench.evidence.svg import line_chart

    lines: dict[str, dict[str, tuple[list, list]]] = {"success_rate": {}, "seam_jerk_p95": {}}
    for f in files:
        data = json.loads(Path(f).read_text())
        if "variants" in data:  # a `bench run` sweep.json over the latency toxic (chunking_vs_delay): ms each way
            for variant in data["variants"]:
                d = round(float(variant["value"]) / 16.67)  # d * 33.3 ms per round trip at 30 Hz
                for group, figures in variant["row"]["groups"].items():
                    for key, figure in lines.items():
                        xs, ys = figure.setdefault(group, ([], []))
                        value = figures.get("task_success_rate" if key == "success_rate" else key)
                        if value is not None:
                            xs.append(d)
                            ys.append(value)
            continue
        stem = Path(data["checkpoint"]).name
        tag = Path(f).stem[len(stem) + 1 :] if Path(f).stem.startswith(stem + "-") else ""
        for row in data["rows"]:
            name = row["strategy"] + (f"-{tag}" if tag else "")
            for key, figure in lines.items():
                xs, ys = figure.setdefault(name, ([], []))
                xs.append(row["delay_steps"])
                ys.append(row[key])
    written = []
    for key, title in (("success_rate", "task success vs delay"), ("seam_jerk_p95", "seam jerk p95 vs delay")):
        path = out_prefix.parent / f"{out_prefix.name}_{'success' if key == 'success_rate' else 'seam_jerk'}.svg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            line_chart(
                {k: (np.array(x), np.array(y)) for k, (x, y) in lines[key].items()},
                f"{out_prefix.name}: {title}",
                "delay d (control steps)",
                key,
            )
        )
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.training.delay_eval", description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default="reacher", help="name under bench/checkpoints/ or a path")
    ap.add_argument("--robot", default="reacher")
    ap.add_argument("--delays", default="0,2,4,8,12,16")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--execution-steps", type=int, default=0, help="s; 0: the engine's derived s for each d")
    ap.add_argument(
        "--horizon",
        type=int,
        default=0,
        help="guided prefix rows; 0: the checkpoint's execution_horizon; -1: d (hard mask)",
    )
    ap.add_argument(
        "--hp",
        action="append",
        default=[],
        help="KEY=VALUE sampling hyper-parameter override (JSON value), as a manifest's model.hyper_params",
    )
    ap.add_argument(
        "--obs-lag",
        type=int,
        default=0,
        help="requests carry the state of this many ticks before their "
        "chunk's row 0 (the edge engines before their fix: 1)",
    )
    ap.add_argument(
        "--delay-margin",
        type=int,
        default=0,
        help="the policy is told d + this (guided or committed rows); the robot still switches at row d",
    )
    ap.add_argument("--episodes", type=int, default=40)
    ap.add_argument("--seed", type=int, default=10_000)
    ap.add_argument("--out", default="", help="JSON file; default reports/delay_eval/<checkpoint>[-<tag>].json")
    ap.add_argument("--tag", default="")
    ap.add_argument(
        "--expert",
        action="store_true",
        help="the scripted expert's plans instead of the policy's (sync, append, naive)",
    )
    ap.add_argument(
        "--plot",
        nargs="+",
        metavar="JSON",
        help="only draw: success and seam jerk vs d from these files into <--out>_success.svg, <--out>_seam_jerk.svg",
    )
    args = ap.parse_args(argv)
    if args.plot:
        for path in plot([Path(f) for f in args.plot], Path(args.out or "reports/delay_eval/plot")):
            print(f"wrote {path}")
        return 0
    import torch

    from server.policies.base import PolicyConfigError

    torch.set_num_threads(1)
    ckpt = Path(args.checkpoint)
    if not ckpt.exists():
        ckpt = REPO / "bench" / "checkpoints" / args.checkpoint
    if not ckpt.exists():
        ap.error(f"no checkpoint {args.checkpoint!r}: give a name under bench/checkpoints/ or a path")
    hp = {}
    for item in args.hp:
        key, _, value = item.partition("=")
        try:
            hp[key] = json.loads(value)
        except json.JSONDecodeError:
            hp[key] = value
    chunk = load_policy(ckpt).config.chunk_size
    rows = []
    t0 = time.monotonic()
    for d in [int(x) for x in args.delays.split(",")]:
        s = args.execution_steps or plan_s(d, chunk)
        for strategy in args.strategies.split(","):
            try:
                r = run_strategy(
                    ckpt,
                    args.robot,
                    strategy,
                    d,
                    max(s, d),
                    args.episodes,
                    args.seed,
                    args.horizon,
                    hp,
                    expert=args.expert,
                    obs_lag=args.obs_lag,
                    delay_margin=args.delay_margin,
                )
            except PolicyConfigError as exc:  # an --hp the checkpoint refuses, or a mode it was not trained for
                ap.error(str(exc))
            rows.append(r)
            print(
                f"d={d:2d} s={r['execution_steps']:2d} {strategy:17s} success {r['success_rate']:.2f}  "
                f"seam jerk p95 {r['seam_jerk_p95']:.3f}  held {r['held_ticks']}",
                flush=True,
            )
    out = (
        Path(args.out)
        if args.out
        else REPO / "reports" / "delay_eval" / (ckpt.name + (f"-{args.tag}" if args.tag else "") + ".json")
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "checkpoint": str(ckpt),
                "robot": args.robot,
                "episodes": args.episodes,
                "seed": args.seed,
                "hp": hp,
                "horizon": args.horizon,
                "obs_lag": args.obs_lag,
                "delay_margin": args.delay_margin,
                "rows": rows,
                "wall_s": time.monotonic() - t0,
            },
            indent=1,
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
