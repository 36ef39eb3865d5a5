"""What a robot's camera costs: ms per frame, rendered and synthetic, and JPEG q90 sizes.

    python -m benchmarks.cameras [--sizes 96x96 224x224 480x640] [--frames 30]

Per robot type and size: rendered ms per frame (update_scene + render, software GL here), JPEG q90
encode ms and KB; synthetic ms per frame and KB (size-only: the bank is shared across types).
Writes reports/bench/cameras.json.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import simplejpeg

from bench.robots import ROBOT_TYPES, make_robot
from bench.robots.cameras import SENSOR_NOISE, make_camera
from benchmarks.common import Result, cli, parse_with_out, run_main, write_report

REPORT = Path("reports/bench/cameras.json")


def _time_frames(camera, frames: int) -> tuple[float, list[np.ndarray]]:
    camera.frame()  # first frame pays for context / bank creation
    out = []
    t0 = time.perf_counter()
    for _ in range(frames):
        out.append(camera.frame())
    return (time.perf_counter() - t0) / frames * 1e3, out


def _jpeg(frames: list[np.ndarray]) -> tuple[float, float]:
    t0 = time.perf_counter()
    sizes = [len(simplejpeg.encode_jpeg(np.ascontiguousarray(f), quality=90)) for f in frames]
    return (time.perf_counter() - t0) / len(frames) * 1e3, float(np.mean(sizes)) / 1024


def run(quick: bool) -> Result:
    argv = ["--sizes", "480x640", "--frames", "3", "--types", "arm"] if quick else ["--sizes", "224x224", "480x640"]
    res = run_main(main, argv)
    rep = res.details
    for key, row in rep["rendered"].items():
        if "ms_per_frame" in row:
            res.add(f"rendered {key}", row["ms_per_frame"], "ms/frame")
    for key, row in rep["synthetic"].items():
        res.add(f"synthetic {key}", row["ms_per_frame"], "ms/frame")
        res.add(f"JPEG q90 {key}", row["jpeg_q90_kb"], "KiB")
    return res


def main(argv: list[str] | None = None) -> dict:
    parser = cli(__doc__)
    parser.add_argument("--sizes", nargs="+", default=["96x96", "224x224", "480x640"], help="HxW")
    parser.add_argument("--frames", type=int, default=30)
    parser.add_argument("--types", nargs="+", default=sorted(ROBOT_TYPES))
    args = parse_with_out(parser, argv, REPORT)
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes]

    report: dict = {
        "mujoco_gl": os.environ.get("MUJOCO_GL"),
        "sensor_noise": SENSOR_NOISE,
        "rendered": {},
        "synthetic": {},
    }
    for name in args.types:
        env = make_robot(name, seed=0)
        env.reset()
        for _ in range(5):
            env.step(env.hold_action())
        for h, w in sizes:
            try:
                ms, frames = _time_frames(make_camera("rendered", env, h, w, seed=0), args.frames)
            except Exception as exc:  # noqa: BLE001  no GL on this machine: report it, keep going
                report["rendered"][f"{name}@{h}x{w}"] = {"error": str(exc)}
                print(f"rendered  {name:8s} {h}x{w}: unavailable ({exc})")
                continue
            enc_ms, kb = _jpeg(frames)
            report["rendered"][f"{name}@{h}x{w}"] = {
                "ms_per_frame": round(ms, 2),
                "jpeg_q90_kb": round(kb, 1),
                "jpeg_encode_ms": round(enc_ms, 3),
            }
            print(f"rendered  {name:8s} {h}x{w}: {ms:6.2f} ms/frame, JPEG q90 {kb:5.1f} KB ({enc_ms:.2f} ms)")
    env = make_robot(args.types[0], seed=0)
    for h, w in sizes:
        ms, frames = _time_frames(make_camera("synthetic", env, h, w, seed=0), args.frames)
        enc_ms, kb = _jpeg(frames)
        report["synthetic"][f"{h}x{w}"] = {
            "ms_per_frame": round(ms, 4),
            "jpeg_q90_kb": round(kb, 1),
            "jpeg_encode_ms": round(enc_ms, 3),
        }
        print(f"synthetic          {h}x{w}: {ms:6.4f} ms/frame, JPEG q90 {kb:5.1f} KB ({enc_ms:.2f} ms)")
    return write_report(args.out, report)


if __name__ == "__main__":
    main()
