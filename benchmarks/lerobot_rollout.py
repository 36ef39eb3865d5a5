"""Edge benchmark: what the LeRobot rollout adapter (edge.lerobot_rollout) adds to each get_action(obs_frame).

    python -m benchmarks.lerobot_rollout [--calls 2000]

The adapter over an engine that returns a fixed action at once (no network, no worker), so the time is the
adapter's own: the frame to our observation (state, images to HWC uint8, task), the task bookkeeping, the action
back to a tensor. Frames as LeRobot makes them: the rollout's numpy HWC uint8 camera, and a torch CHW float
camera in [0, 1] (a dataset frame). Prints the median of 5 runs in microseconds per call; writes
reports/bench/lerobot_rollout.json.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from benchmarks.common import Result, cli, parse_with_out, write_report

STATE_DIM, ACTION_NAMES = 6, ["j0", "j1", "j2", "j3", "j4", "grip"]


def _adapter():
    from edge import Action, RemoteEngineConfig
    from edge.engine import Engine, EngineState
    from edge.lerobot_rollout import rollout_engine_class

    class Fixed(Engine):
        cfg = RemoteEngineConfig(
            connect_endpoints=["tcp/127.0.0.1:1"], model_id="m", action_names=ACTION_NAMES, state_dim=STATE_DIM
        )
        action = Action(np.arange(len(ACTION_NAMES), dtype=np.float32), age_s=0.01)
        start = stop = reset = pause = resume = lambda self: None
        notify_observation = lambda self, obs: None  # noqa: E731
        get_action = lambda self: self.action  # noqa: E731
        ready = failed = property(lambda self: True)
        state = property(lambda self: EngineState.STREAMING)
        stats = property(lambda self: {})

    class Base:  # the base's task calls, as cheap as LeRobot's (a lock each)
        def __init__(self, task=""):
            self.task = task

        def _take_task(self):
            return self.task, False

        def _set_dispatched_task(self, task):
            self.dispatched_task = task

    return rollout_engine_class(Base)(Fixed(), task="pick", ordered_action_keys=list(reversed(ACTION_NAMES)))


def frames() -> dict[str, dict]:
    import torch

    rng = np.random.default_rng(0)
    return {
        "state only (torch)": {"observation.state": torch.zeros(STATE_DIM)},
        "96x96 HWC uint8 numpy": {
            "observation.state": np.zeros(STATE_DIM, np.float32),
            "observation.images.front": rng.integers(0, 256, (96, 96, 3), dtype=np.uint8),
        },
        "96x96 CHW float torch": {
            "observation.state": torch.zeros(STATE_DIM),
            "observation.images.front": torch.rand(3, 96, 96),
        },
        "480x640 CHW float torch": {
            "observation.state": torch.zeros(STATE_DIM),
            "observation.images.front": torch.rand(3, 480, 640),
        },
    }


def measure(calls: int) -> dict[str, float]:
    import torch

    torch.set_num_threads(1)
    ad = _adapter()
    out = {}
    for name, frame in frames().items():
        n = max(5, calls // 20) if "480" in name else calls
        for _ in range(min(n, 50)):
            ad.get_action(frame)
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                ad.get_action(frame)
            runs.append((time.perf_counter() - t0) / n * 1e6)
        out[name] = round(statistics.median(runs), 2)
    return out


def run(quick: bool) -> Result:
    rows = measure(200 if quick else 2000)
    res = Result(details=rows)
    for name, us in rows.items():
        res.add(f"adapter get_action, {name}", us, "us")
    return res


def main(argv=None) -> int:
    ap = cli(__doc__, prog="python -m benchmarks.lerobot_rollout")
    ap.add_argument("--calls", type=int, default=2000)
    args = parse_with_out(ap, argv, "reports/bench/lerobot_rollout.json")
    rows = measure(args.calls)
    for name, us in rows.items():
        print(f"{name:28s} {us:10.2f} us/call")
    write_report(args.out, {"calls": args.calls, "us_per_call": rows}, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
