"""A wire round trip over a real Zenoh router: the protocol end to end without a policy.

    python -m wire.demo [--requests 200] [--cameras 3]

Starts a router in its own process, then a responder session and a client session (both client
mode, shared memory off). The client sends observations (JPEG cameras, state, RTC prefixes) with
the attachment header; the responder decodes them and answers an action chunk echoing the header;
the client computes rtt from its own monotonic clock. Prints rtt percentiles and message sizes and
writes reports/bench/wire_demo.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from wire import (
    SCHEMA_VERSION,
    ActionChunk,
    Header,
    MsgType,
    Observation,
    ReplicaKeys,
    decode_message,
    encode_image,
    unpack_header,
)
from wire.procs import start_router
from wire.qos import declare_publisher, wait_matched
from wire.transport import open_session


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wire.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--cameras", type=int, default=3)
    ap.add_argument("--height", type=int, default=224)
    ap.add_argument("--width", type=int, default=224)
    ap.add_argument("--out", default="reports/bench/wire_demo.json")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        router, endpoint = start_router(None, Path(tmp) / "router.log")
        try:
            return _run(args, endpoint)
        finally:
            router.stop()


def _run(args, endpoint: str) -> int:
    keys = ReplicaKeys("demo-model", "main", "r0").client("reach the cube", "robot-1")
    server = open_session(connect=[endpoint], what="responder")
    client = open_session(connect=[endpoint], what="client")
    action_pub = declare_publisher(server, keys.action, "action")

    def on_obs(sample):  # the demo responder answers inline; the real server only deposits here
        h = unpack_header(bytes(sample.attachment.to_bytes()))
        obs = decode_message(sample.payload.to_bytes(), expect=Observation)
        chunk = np.tile(obs.state[:7], (50, 1)).astype(np.float32)
        reply = ActionChunk(
            obs.session_id, h.seq_id, h.client_mono_ns, chunk, chunk, queue_wait_ms=0.0, inference_ms=0.0
        )
        action_pub.put(
            reply.encode(),
            attachment=Header(
                SCHEMA_VERSION, MsgType.CHUNK, h.seq_id, h.episode_id, h.client_mono_ns, h.session_epoch
            ).pack(),
        )

    box: list = []
    got = threading.Event()

    def on_chunk(sample):  # deposit only
        box.append((time.monotonic_ns(), sample.payload.to_bytes(), sample.attachment.to_bytes()))
        got.set()

    server.declare_subscriber(keys.obs, on_obs)
    client.declare_subscriber(keys.action, on_chunk)
    obs_pub = declare_publisher(client, keys.obs, "obs")
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 255, (args.height, args.width, 3), dtype=np.uint8) for _ in range(args.cameras)]
    rtts, obs_bytes, chunk_bytes, lost = [], 0, 0, 0
    for pub, what in ((obs_pub, "observation"), (action_pub, "action")):
        if not wait_matched(pub, 10.0):
            print(
                f"wire demo: the {what} publisher saw no subscriber through the router at {endpoint} in 10 s; "
                "is something blocking 127.0.0.1?"
            )
            client.close()
            server.close()
            return 1
    for seq in range(1, args.requests + 1):
        state = rng.normal(size=7).astype(np.float32)
        images = {f"cam{i}": encode_image(f, "jpeg", 90) for i, f in enumerate(frames)}
        body = Observation(
            "demo-session",
            state,
            images=images,
            prefix_model=np.zeros((10, 7), np.float32),
            prefix_robot=np.zeros((10, 7), np.float32),
            inference_delay_steps=3,
        ).encode()
        got.clear()
        header = Header(SCHEMA_VERSION, MsgType.OBS, seq, 0, time.monotonic_ns(), 0).pack()
        obs_pub.put(body, attachment=header)
        if not got.wait(2.0):
            lost += 1
            continue
        t_recv, payload, attachment = box.pop()
        h = unpack_header(bytes(attachment))
        chunk = decode_message(bytes(payload), expect=ActionChunk)
        assert h.seq_id == seq == chunk.seq_id_echo and np.array_equal(chunk.chunk_robot[0], state)
        rtts.append((t_recv - chunk.client_mono_ns_echo) / 1e6)
        obs_bytes, chunk_bytes = len(body) + len(header), len(payload) + len(attachment)
    client.close()
    server.close()
    if not rtts:
        print("wire demo: no chunk came back; is something blocking 127.0.0.1?")
        return 1
    q = np.percentile(rtts, [50, 90, 99])
    result = {
        "requests": args.requests,
        "answered": len(rtts),
        "lost": lost,
        "rtt_ms_p50": q[0],
        "rtt_ms_p90": q[1],
        "rtt_ms_p99": q[2],
        "observation_bytes": obs_bytes,
        "chunk_bytes": chunk_bytes,
        "cameras": args.cameras,
        "camera_size": [args.height, args.width],
    }
    print(
        f"wire demo over a real Zenoh router: {len(rtts)}/{args.requests} answered, rtt p50 {q[0]:.2f} ms, "
        f"p90 {q[1]:.2f} ms, p99 {q[2]:.2f} ms; observation {obs_bytes} B ({args.cameras} JPEG cameras), chunk {chunk_bytes} B"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    return 0 if len(rtts) == args.requests else 1


if __name__ == "__main__":
    raise SystemExit(main())
