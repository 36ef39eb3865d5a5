"""What one more robot costs in memory, per type, with the model shared (and what sharing saves).

    python -m benchmarks.robot_memory [--robots 100] [--types arm reacher base]

Each type is measured in a fresh child process (so one type's allocations cannot hide another's):
resident-set growth from building `--robots` TwinEnvs after the shared model exists, divided by
the count; the growth from compiling the model itself (what every robot would pay if each env
compiled its own, as most gym wrappers do); and MuJoCo's own MjData size. Writes
reports/bench/robots_memory.json.
"""

from __future__ import annotations

import gc
import multiprocessing
from pathlib import Path

from benchmarks.common import Result, cli, parse_with_out, run_main, write_report

REPORT = Path("reports/bench/robots_memory.json")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _measure(robot_type: str, robots: int) -> dict:
    import mujoco  # noqa: I001

    from bench.robots import make_robot  # first: it chooses MuJoCo's GL backend before mujoco is imported

    gc.collect()
    before_model = _rss_bytes()
    first = make_robot(robot_type, seed=0)  # compiles the shared model (plus one robot)
    first.reset()
    after_first = _rss_bytes()
    gc.collect()
    before = _rss_bytes()
    envs = [make_robot(robot_type, seed=i) for i in range(robots)]
    for env in envs:
        env.reset()
        env.step(env.hold_action())  # touch the per-robot buffers as a running robot does
    gc.collect()
    after = _rss_bytes()
    shared = all(env.model is first.model for env in envs)
    model = first.model
    return {
        "robots": robots,
        "model_is_shared": shared,
        "rss_per_robot_kb": round((after - before) / robots / 1024, 1),
        "rss_first_robot_with_model_kb": round((after_first - before_model) / 1024, 1),
        "mjdata_buffers_kb": round((first.data.nbuffer + first.data.narena) / 1024, 1),  # rest: struct, bindings
        "mjmodel_buffer_kb": round(model.nbuffer / 1024, 1),
        "fleet_of_300_mb": round((after - before) / robots * 300 / 2**20, 1),
        "mujoco": mujoco.__version__,
    }


def run(quick: bool) -> Result:
    res = run_main(main, ["--robots", "10", "--types", "arm"] if quick else [])
    rep = res.details
    for name, row in rep["types"].items():
        res.add(f"{name}: RSS per robot", row["rss_per_robot_kb"], "KiB")
    return res


def main(argv: list[str] | None = None) -> dict:
    from bench.robots import ROBOT_TYPES

    parser = cli(__doc__)
    parser.add_argument("--robots", type=int, default=100)
    parser.add_argument("--types", nargs="+", default=sorted(ROBOT_TYPES))
    args = parse_with_out(parser, argv, REPORT)

    report = {"types": {}}
    ctx = multiprocessing.get_context("spawn")
    for name in args.types:
        with ctx.Pool(1) as pool:
            result = pool.apply(_measure, (name, args.robots))
        report["types"][name] = result
        print(
            f"{name:8s} {result['rss_per_robot_kb']:7.1f} KB per robot ({args.robots} robots, shared model: "
            f"{result['model_is_shared']}); first robot incl. model compile "
            f"{result['rss_first_robot_with_model_kb']:.0f} KB; 300 robots ~{result['fleet_of_300_mb']:.0f} MB"
        )
    return write_report(args.out, report)


if __name__ == "__main__":
    main()
