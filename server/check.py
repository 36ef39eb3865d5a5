"""`check_policy`: is this checkpoint directory one the policy server will serve? The server's own rules, as a check.

    check_policy("bench/checkpoints/arm")          # a report dict, or PolicyError naming the problem and the fix
    policy-server check DIR [--device cuda]        # the same from a shell (also `python -m server.check DIR`)

Nothing here re-implements a rule: the directory is loaded by `server.policies.checkpoint.load_checkpoint`
(local files, config.json, stats.json against the config, weights against the policy type, the hash), served by
`server.runtime.ModelRuntime` after `prepare_serving()`, and warmed up as a replica does before it says it is
ready (zero observations, with an RTC prefix and without; a non-finite chunk refuses the checkpoint). Then one
forward pass on a synthetic observation of the declared shapes (a state drawn from stats.json, a random frame
per declared camera) through `server.runtime.LocalPredictor`, the server's path for one session, must return a
finite (chunk_size, action_dim) chunk in both spaces, and the same again with the previous chunk as the prefix
where the policy takes one. A LeRobot checkpoint (server/policies/lerobot.py) is checked the same way, with a
standard-normal state and `trained_fps` given (LeRobot's config records no rate). Server side: it imports torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from server.policies.base import PolicyError

__all__ = ["PolicyCheckError", "check_policy", "main"]


class PolicyCheckError(PolicyError):
    """The checkpoint loads, but serving it would fail: the message names what and what to do."""


def check_policy(
    path: str | os.PathLike, device: str = "cpu", seed: int = 0, trained_fps: float | None = None
) -> dict[str, Any]:
    """Check a checkpoint directory by the server's rules (module docstring); returns what a replica would announce.

    Raises the server's own PolicyError (CheckpointError, StatsError, PolicyConfigError: each names the file and the
    fix) when loading refuses it, and PolicyCheckError when a forward pass does."""
    import torch

    from server.policies.base import classify
    from server.policies.checkpoint import CONFIG_FILE, STATS_FILE, WEIGHTS_FILE, CheckpointError, load_checkpoint
    from server.runtime import LocalPredictor, ModelRuntime

    where = os.fspath(path)
    directory = Path(where).expanduser()
    try:
        loaded = load_checkpoint(path, device=device, trained_fps=trained_fps)
    except CheckpointError as exc:
        if (
            directory.is_dir()
            and {p.name for p in directory.iterdir()} >= {CONFIG_FILE, STATS_FILE}
            and not (directory / WEIGHTS_FILE).exists()
        ):
            raise CheckpointError(
                f"{exc}. A checkpoint shipped as config and stats only gets seeded random weights "
                f"from `bench init-weights {directory.resolve()}` "
                f"(server.policies.checkpoint.init_weights)"
            ) from None
        raise
    cfg = loaded.config
    runtime = ModelRuntime(loaded)
    loaded.policy.prepare_serving()
    try:
        warmup_ms = runtime.warmup(1)
    except PolicyError:
        raise
    except Exception as exc:
        raise PolicyCheckError(
            f"{where}: {exc}; the server runs this warm-up before it serves, so no replica of this "
            f"checkpoint would start (check the policy type's predict_action_chunk)"
        ) from None
    rng = np.random.default_rng(seed)
    if loaded.processor_kind == "stats":
        state_stats = json.loads((directory / STATS_FILE).read_text())["observation.state"]
        state = np.asarray(state_stats["mean"]) + np.asarray(state_stats["std"]) * rng.standard_normal(cfg.state_dim)
    else:  # a LeRobot checkpoint: its dataset stats are in its processors' state files
        state = rng.standard_normal(cfg.state_dim)
    images = {name: rng.integers(0, 256, (s[1], s[2], 3), dtype=np.uint8) for name, s in cfg.image_features.items()}
    obs = {"state": state.astype(np.float32), "images": images}
    predictor = LocalPredictor(runtime, rtc=True, torch_threads=torch.get_num_threads())
    want = (cfg.chunk_size, cfg.action_dim)
    shapes = {name: frame.shape for name, frame in images.items()} or "none"

    def forward(what: str, delay: int, prefix, prefix_robot=None) -> tuple[np.ndarray, np.ndarray, float]:
        t0 = time.perf_counter()
        try:
            model, robot = predictor.predict_action_chunk({**obs, "prefix_robot": prefix_robot}, delay, prefix)
        except Exception as exc:
            raise PolicyCheckError(
                f"{where}: a forward pass on a synthetic observation of the declared shapes ({what}: "
                f"state ({cfg.state_dim},), cameras {shapes}) failed: {exc}"
            ) from None
        ms = (time.perf_counter() - t0) * 1e3
        for space, chunk in (("model", model), ("robot", robot)):
            if tuple(np.shape(chunk)) != want:
                raise PolicyCheckError(
                    f"{where}: the {cfg.type} policy returned a {space}-space chunk of shape {tuple(np.shape(chunk))} "
                    f"({what}); config.json declares chunk_size {cfg.chunk_size} and action_dim {cfg.action_dim}, so "
                    f"every chunk is {want}: fix predict_action_chunk or the config"
                )
        return model, robot, ms

    model, robot, forward_ms = forward("no prefix", 0, None)
    if runtime.supports_rtc:  # the next request of a session: the leftover of this chunk as the prefix
        horizon = runtime.execution_horizon
        forward(f"an RTC prefix of {horizon} rows, delay 2", 2, model[2 : 2 + horizon], robot[2 : 2 + horizon])
    runtime.reset_policy()
    return {
        "path": str(loaded.revision_info.get("path", where)),
        "type": cfg.type,
        "checkpoint_hash": loaded.checkpoint_hash,
        "policy_class": classify(loaded.policy),
        "supports_rtc": runtime.supports_rtc,
        "state_dim": cfg.state_dim,
        "action_names": list(cfg.action_names),
        "chunk_size": cfg.chunk_size,
        "fps": cfg.fps,
        "cameras": runtime.cameras,
        "warmup_ms": round(warmup_ms, 3),
        "forward_ms": round(forward_ms, 3),
    }


def main(argv: list[str] | None = None, prog: str = "policy-server check") -> int:
    """CLI: 0 when the checkpoint would be served, 2 (one line on stderr, no traceback) when it would not."""
    ap = argparse.ArgumentParser(
        prog=prog,
        description="Check a checkpoint directory by the policy server's own "
        "rules: load, warm up, and one forward pass on a synthetic observation.",
    )
    ap.add_argument(
        "checkpoint",
        help="local checkpoint directory (config.json, model.safetensors, stats.json; or a LeRobot save_pretrained one)",
    )
    ap.add_argument("--trained-fps", type=float, default=None, help="a LeRobot checkpoint's rate (its config has none)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    from server.manifest import device_problem

    problem = device_problem(args.device)
    if problem:
        print(f"{prog}: --device {problem}", file=sys.stderr)
        return 2
    try:
        report = check_policy(args.checkpoint, device=args.device, trained_fps=args.trained_fps)
    except (PolicyError, FileNotFoundError, ValueError) as exc:
        print(f"{prog}: {args.checkpoint}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        cams = ", ".join(f"{n} {s[0]}x{s[1]}" for n, s in report["cameras"].items()) or "none"
        print(
            f"{prog}: OK {report['path']}: {report['type']} ({report['policy_class']}, rtc "
            f"{'yes' if report['supports_rtc'] else 'no'}), state {report['state_dim']}, actions "
            f"{len(report['action_names'])} x {report['chunk_size']} rows, cameras {cams}, hash "
            f"{report['checkpoint_hash'][:16]}, forward {report['forward_ms']:.1f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(prog="python -m server.check"))
