"""Server benchmark: overhead per request, and requests/s with and without micro-batching.

    python -m benchmarks.server [--seconds 3] [--sessions 1 8 32 64] [--emulated-ms 20 --per-item-ms 0.5]

Starts a router and one `policy-server` process per configuration (real processes, real Zenoh);
N closed-loop clients (each: send an observation, wait for its chunk, repeat) run in this process.
Prints and writes reports/bench/server.json:
- overhead: client round trip minus the server's forward pass (everything but the forward pass:
  Zenoh hops, decode, mailbox, scheduling, pre/post-processing, encode), p50/p99 at 1 session, with
  the scheduling wait the server reports and the floor under it: the same hops to an echo process
  that only decodes and re-encodes our messages (benchmarks.peers, no images);
- requests/s at each session count with max_batch=1 and max_batch=64, for a real CPU forward pass
  and for an emulated accelerator (fixed cost per pass + small cost per item: how a GPU behaves).
All figures of one run come from one machine state; compare ratios, not absolute numbers.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import yaml

from benchmarks.common import Result, cli, parse_with_out, write_report
from wire import ReplicaKeys
from wire.procs import ChildProcess, start_router


def _checkpoint(tmp: Path) -> Path:
    import torch

    from server.policies import PolicyConfig, make_policy, save_checkpoint

    torch.manual_seed(0)
    cfg = PolicyConfig(
        type="flow_matching",
        state_dim=4,
        action_dim=3,
        chunk_size=30,
        fps=30,
        execution_horizon=10,
        action_names=["x", "y", "grip"],
        hyper_params={"hidden_dim": 128, "obs_embed_dim": 64, "num_steps": 5},
    )
    stats = {
        "observation.state": {"mean": [0.0] * 4, "std": [1.0] * 4},
        "action": {"mean": [0.0] * 3, "std": [1.0] * 3},
    }
    return save_checkpoint(make_policy(cfg), stats, tmp / "bench_ckpt")


def _start_server(tmp: Path, ckpt: Path, endpoint: str, max_batch: int, emulated, tag: str) -> ChildProcess:
    import sys

    m = {
        "model": {"repo_or_path": str(ckpt)},
        "model_id": "bench",
        "replica_id": tag,
        "max_sessions": 128,
        "warmup_inferences": 2,
        "zenoh": {"connect_endpoints": [endpoint]},
        "scheduling": {"strategy": "round_robin", "max_batch": max_batch, "batch_window_ms": 1.0},
        # closed-loop clients send far above a robot's rate: the per-session limit would cap the measurement
        "security": {"max_request_rate_hz": 0},
    }
    if emulated:
        m["emulated_latency"] = emulated
    path = tmp / f"{tag}.yaml"
    path.write_text(yaml.safe_dump(m))
    child = ChildProcess(
        [sys.executable, "-m", "server.cli", "--manifest", str(path), "--log-level", "WARNING"],
        tmp / f"{tag}.log",
        ready_text="policy-server ready",
        name=f"server-{tag}",
    )
    return child.start(timeout_s=120)


def _run_load(endpoint: str, tag: str, n: int, seconds: float) -> dict:
    from edge.client import Connection

    rk = ReplicaKeys("bench", "main", tag)
    conns, models = [], []
    for i in range(n):
        # a client uuid per step: the previous step's sessions stay live for the server (guard.session_live) until
        # their token loss is confirmed, and an open of a live session's uuid without its proof is SESSION_LIVE
        c = Connection([endpoint], f"bench-{tag}-n{n}-{i}")
        m = c.model(
            "bench",
            action_names=["x", "y", "grip"],
            state_dim=4,
            fps=30.0,
            rtc_enabled=True,
            execution_horizon=10,
            replica_order=[rk.replica_id],
        )
        conns.append(c)
        models.append(m)
    rtts, inference, queue_wait, done = [], [], [], [0] * n
    stop = threading.Event()

    def loop(i):
        m = models[i]
        state = np.full(4, i, np.float32)
        while not stop.is_set():
            m.observe(state=state, inference_delay_steps=2, prefix_model=np.zeros((10, 3), np.float32))
            r = m.get_result(5000)
            if r is None or getattr(r, "error", None):
                continue
            done[i] += 1
            rtts.append(r.rtt_s * 1e3)
            inference.append(r.inference_ms)
            queue_wait.append(r.queue_wait_ms)

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # warm the pipes before the measured window
    before = sum(done)
    t0 = time.monotonic()
    time.sleep(seconds)
    total = sum(done) - before
    elapsed = time.monotonic() - t0
    stop.set()
    for t in threads:
        t.join(6)
    for c in conns:
        c.close()
    rt, inf, qw = np.array(rtts[-5000:]), np.array(inference[-5000:]), np.array(queue_wait[-5000:])
    return {
        "sessions": n,
        "requests_per_s": total / elapsed,
        "rtt_ms_p50": float(np.median(rt)) if rt.size else None,
        "rtt_ms_p99": float(np.percentile(rt, 99)) if rt.size else None,
        "inference_ms_p50": float(np.median(inf)) if inf.size else None,
        "overhead_ms_p50": float(np.median(rt - inf)) if rt.size else None,
        "overhead_ms_p99": float(np.percentile(rt - inf, 99)) if rt.size else None,
        "queue_wait_ms_p50": float(np.median(qw)) if qw.size else None,
    }


def measure(seconds: float, sessions: list[int], emulated_ms: float, per_item_ms: float) -> dict:
    """Every (forward, max_batch, sessions) point, the overhead at 1 session and the micro-batching speed-ups."""
    results = {"seconds_per_point": seconds, "points": [], "speedup": {}}
    with tempfile.TemporaryDirectory() as tmpd:
        tmp = Path(tmpd)
        ckpt = _checkpoint(tmp)
        router, endpoint = start_router(None, tmp / "router.log")
        try:
            for forward, emulated in (
                ("cpu", None),
                ("emulated", {"mean_ms": emulated_ms, "per_batch_item_ms": per_item_ms}),
            ):
                for max_batch in (1, 64):
                    tag = f"{forward}-b{max_batch}"
                    server = _start_server(tmp, ckpt, endpoint, max_batch, emulated, tag)
                    try:
                        for n in sessions:
                            r = _run_load(endpoint, tag, n, seconds)
                            r.update(forward=forward, max_batch=max_batch, emulated=emulated)
                            results["points"].append(r)
                            print(
                                f"{forward:9s} max_batch={max_batch:<3d} sessions={n:<3d} {r['requests_per_s']:8.1f} req/s  "
                                f"rtt p50 {r['rtt_ms_p50'] or float('nan'):6.2f} ms  inference p50 "
                                f"{r['inference_ms_p50'] or float('nan'):6.2f} ms  overhead p50 "
                                f"{r['overhead_ms_p50'] or float('nan'):5.2f} ms",
                                flush=True,
                            )
                    finally:
                        server.stop()
            # the floor under the overhead: the same client -> router -> process -> router -> client hops, an echo
            # that decodes and encodes our messages (benchmarks.peers without images) and nothing else
            from benchmarks.peers import round_trips

            echo = round_trips("ours", 300, 30, tmp, endpoint, cameras=0)
            results["echo_via_router_ms_p50"] = float(np.median(echo))
        finally:
            router.stop()
    one = [p for p in results["points"] if p["sessions"] == 1 and p["forward"] == "cpu" and p["max_batch"] == 1]
    if one:
        results["overhead_ms_p50"] = one[0]["overhead_ms_p50"]
        results["overhead_ms_p99"] = one[0]["overhead_ms_p99"]
        results["queue_wait_ms_p50"] = one[0]["queue_wait_ms_p50"]
        print(
            f"server overhead per request (round trip minus forward pass, 1 session): p50 {one[0]['overhead_ms_p50']:.2f} ms, "
            f"p99 {one[0]['overhead_ms_p99']:.2f} ms"
        )
    for forward in ("cpu", "emulated"):
        for n in sessions:
            pts = {
                p["max_batch"]: p["requests_per_s"]
                for p in results["points"]
                if p["forward"] == forward and p["sessions"] == n
            }
            if 1 in pts and 64 in pts and pts[1]:
                results["speedup"][f"{forward}@{n}"] = pts[64] / pts[1]
                print(f"{forward:9s} sessions={n:<3d} micro-batching speed-up x{pts[64] / pts[1]:.2f}")
    return results


def run(quick: bool) -> Result:
    sessions = [1, 8] if quick else [1, 8, 32, 64]
    r = measure(1.0 if quick else 3.0, sessions, 20.0, 0.5)
    res = Result(details=r)
    res.add("overhead per request p50 (round trip - forward, 1 session)", r.get("overhead_ms_p50"), "ms", target=0.5)
    res.add("overhead per request p99 (round trip - forward, 1 session)", r.get("overhead_ms_p99"), "ms")
    res.add("of the overhead: scheduling wait p50 (queue_wait_ms, 1 session)", r.get("queue_wait_ms_p50"), "ms")
    res.add("floor: our messages echoed through the router, no server, p50", r.get("echo_via_router_ms_p50"), "ms")
    n = sessions[-1]
    for forward in ("emulated", "cpu"):
        target = 5.0 if forward == "emulated" and n == 64 else None
        res.add(
            f"micro-batched / one-at-a-time throughput, {n} sessions, {forward} forward",
            r["speedup"].get(f"{forward}@{n}"),
            "x",
            target=target,
            better="higher",
        )
    return res


def main(argv=None) -> int:
    ap = cli(__doc__, prog="python -m benchmarks.server")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--emulated-ms", type=float, default=20.0)
    ap.add_argument("--per-item-ms", type=float, default=0.5)
    args = parse_with_out(ap, argv, "reports/bench/server.json")
    results = measure(args.seconds, args.sessions, args.emulated_ms, args.per_item_ms)
    write_report(args.out, results, indent=1, end="", default=float, say=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
