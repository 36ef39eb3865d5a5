"""Edge benchmark: the CPU of the remote engine's per-tick calls, in process, with no server (the twin's hot path).

    python -m benchmarks.engine_calls [--calls 20000] [--repeats 7] [--case tick]

A digital twin's shard calls, for each of its robots every tick, `notify_observation(obs)` then `get_action()`
and reads `state` and `failed` (bench.fleet.robot.engine_state_name). This builds one remote engine (never
started: no worker, no network), fills its queue with fresh actions of the current episode (a merged chunk of
`--calls` rows, outside the timed stretch) and times, with time.thread_time (CPU of this thread only), `--calls`
calls of each: notify_observation, get_action (every call returns a chunk action), the state and failed reads,
and the whole tick (the four together). Prints per-call medians over `--repeats` repeats (microseconds) and
writes reports/bench/engine_calls.json. `--case NAME --repeats 1` runs one case once, for an instruction count:

    valgrind --tool=callgrind --callgrind-out-file=/dev/null python3 -m benchmarks.engine_calls \
        --case tick --repeats 1 --calls N --out /dev/null     # (Ir at N=22000 - Ir at N=2000) / 20000
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from benchmarks.common import Result, cli, parse_with_out, write_report

FPS = 30.0
NAMES = [f"j{i}" for i in range(6)]
CASES = ("notify_observation", "get_action", "state_failed", "tick")


def make() -> tuple:
    """A remote engine that is never started (no worker thread, no session) and an observation for it."""
    from edge import RemoteEngineConfig, make_engine

    eng = make_engine(
        RemoteEngineConfig(
            connect_endpoints=["tcp/127.0.0.1:1"], model_id="arm", fps=FPS, action_names=NAMES, state_dim=6
        )
    )
    obs = {"state": np.zeros(6, np.float32), "images": {}}
    return eng, obs


def fill(eng, rows: int) -> None:
    """Merge a chunk of `rows` fresh actions of the engine's current episode (as the worker would)."""
    from edge.remote.replies import Meta

    chunk = np.arange(rows * len(NAMES), dtype=np.float32).reshape(rows, len(NAMES))
    meta = Meta("bench-session", 1, eng._handoff.episode, time.monotonic())
    eng.queue.clear()
    eng.queue.merge(chunk, chunk, 0, meta=meta)


def time_case(eng, obs, case: str, calls: int) -> float:
    """CPU seconds of this thread for `calls` calls of `case` (the queue refilled first, untimed)."""
    fill(eng, calls)
    notify, get = eng.notify_observation, eng.get_action
    rng = range(calls)
    t0 = time.thread_time()
    if case == "notify_observation":
        for _ in rng:
            notify(obs)
    elif case == "get_action":
        for _ in rng:
            get()
    elif case == "state_failed":
        for _ in rng:
            _ = eng.state
            _ = eng.failed
    else:  # tick: what a shard does per robot per tick
        for _ in rng:
            notify(obs)
            get()
            _ = eng.state
            _ = eng.failed
    return time.thread_time() - t0


def measure(calls: int, repeats: int, cases=CASES) -> dict:
    eng, obs = make()
    fill(eng, 10)
    assert eng.get_action().source == "chunk"  # the case this measures: a queue holding fresh actions
    out: dict = {"calls": calls, "repeats": repeats}
    for case in cases:
        runs = [time_case(eng, obs, case, calls) for _ in range(repeats)]
        out[f"{case}_us"] = statistics.median(runs) / calls * 1e6
        out[f"{case}_us_min"] = min(runs) / calls * 1e6
    return out


def run(quick: bool) -> Result:
    r = measure(2000 if quick else 20000, 5 if quick else 9)
    res = Result(details=r)
    res.add("notify_observation() CPU per call (queue holding actions)", r["notify_observation_us"], "us")
    res.add("get_action() CPU per call (a fresh chunk action)", r["get_action_us"], "us")
    res.add("state + failed reads CPU per tick", r["state_failed_us"], "us")
    res.add("one tick (notify + get_action + state + failed) CPU", r["tick_us"], "us")
    return res


def main(argv=None) -> int:
    ap = cli(__doc__, prog="python -m benchmarks.engine_calls")
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--case", choices=CASES, action="append", help="run only these cases (default: all)")
    args = parse_with_out(ap, argv, "reports/bench/engine_calls.json")
    r = measure(args.calls, args.repeats, args.case or CASES)
    print(
        f"per call, CPU (time.thread_time), median of {args.repeats} x {args.calls}: "
        + ", ".join(f"{c} {r[f'{c}_us']:.2f} us" for c in (args.case or CASES))
    )
    write_report(args.out, r, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
