"""Our wire side by side with the stacks users would pick instead: one payload, one request at a time.

    python -m benchmarks.peers [--requests 1000] [--stacks ours zmq_protobuf grpc_pickle]

The payload of every stack: 3 camera frames 480x640 as JPEG q90 bytes (encoded once, before timing:
every stack carries the same bytes), 14 float32 state, a task string; the reply: 2 chunks 50x7 float32.
Each stack's server is its own process on loopback (127.0.0.1); this process is the client and sends
`--requests` sequential requests after a warm-up, timing each from encode to decoded reply:
- ours: wire.Observation / wire.ActionChunk (msgpack) with the 27-byte header as the Zenoh attachment,
  published through a real Zenoh router process (wire.procs.start_router: the router as deployed),
  with the deployed QoS (wire.qos) -- client -> router -> server -> router -> client;
- ours_no_router: the same, the client connected straight to the server's session (what the router hop costs);
- zmq_protobuf: ZeroMQ REQ/REP over TCP, protobuf messages (design 003's Inferential transport);
- grpc_pickle: a gRPC unary call whose protobuf message has one bytes field holding a pickled dict
  (LeRobot's legacy async_inference).
The protobuf messages are built from a descriptor in Python (no protoc, no generated code); arrays
travel as bytes fields (raw float32), the fastest protobuf layout for tensors. Also times each stack's
codec alone (encode request + decode request + encode reply + decode reply, in one process) and counts
the bytes per request (request + reply payloads, our header included). Ours (with and without the router)
and ZeroMQ run again without the images: what each message costs whatever its size. Needs the `bench-peers` extra
(pyzmq, grpcio, protobuf); a missing library skips the benchmark with the reason.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.common import Result, cli, parse_with_out, write_report

STACKS = ("ours", "ours_no_router", "zmq_protobuf", "grpc_pickle")
OBS_KEY, ACTION_KEY = "bench/peers/obs", "bench/peers/action"
READY = "peer-server ready"


def missing_libraries() -> list[str]:
    missing = []
    for mod, pkg in (("zmq", "pyzmq"), ("grpc", "grpcio"), ("google.protobuf", "protobuf")):
        try:
            __import__(mod)
        except ImportError:
            missing.append(pkg)
    return missing


# ---- the payload -------------------------------------------------------------------------------


def payload(cameras: int = 3) -> dict:
    """The request and reply of every stack; `cameras=0`: the same without images (the fixed cost per message)."""
    from wire import encode_image

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:480, 0:640]
    images = {}
    for k in range(cameras):  # a smooth scene plus sensor noise: 110-126 KB each at q90 (noise costs bytes)
        base = np.stack([(xx * (k + 1)) % 256, (yy * 2) % 256, ((xx + yy) // 3) % 256], -1).astype(np.int16)
        base += rng.normal(0, 6, base.shape).astype(np.int16)
        images[f"cam{k}"] = encode_image(np.clip(base, 0, 255).astype(np.uint8), "jpeg", 90)
    return {
        "images": images,
        "state": rng.normal(size=14).astype(np.float32),
        "task": "pick up the red cube",
        "chunk": rng.normal(size=(50, 7)).astype(np.float32),
    }


# ---- codecs: one class per stack, the same four calls ---------------------------------------------


class OursCodec:
    def __init__(self, p: dict):
        from wire import Header, MsgType

        self.p, self.Header, self.MsgType, self.seq = p, Header, MsgType, 0

    def encode_request(self) -> tuple[bytes, bytes]:
        from wire import Observation

        self.seq += 1
        header = self.Header(1, self.MsgType.OBS, self.seq, 0, time.monotonic_ns(), 0).pack()
        return header, Observation("s", self.p["state"], images=self.p["images"], task=self.p["task"]).encode()

    def decode_request(self, header: bytes, body: bytes):
        from wire import Observation, decode_message, unpack_header

        return unpack_header(header), decode_message(body, expect=Observation)

    def encode_reply(self, req) -> tuple[bytes, bytes]:
        from wire import ActionChunk

        h, obs = req
        header = self.Header(1, self.MsgType.CHUNK, h.seq_id, 0, time.monotonic_ns(), 0).pack()
        c = self.p["chunk"]
        return header, ActionChunk(obs.session_id, h.seq_id, h.client_mono_ns, c, c, 0.1, 1.0).encode()

    def decode_reply(self, header: bytes, body: bytes):
        from wire import ActionChunk, decode_message, unpack_header

        return unpack_header(header), decode_message(body, expect=ActionChunk)


def proto_classes():
    """Request/Reply/Blob protobuf classes from a descriptor built here (no protoc needed)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    T = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(name="bench_peers.proto", package="benchpeers", syntax="proto3")

    def msg(name, fields):
        m = f.message_type.add(name=name)
        for i, (fname, ftype, label, type_name) in enumerate(fields, 1):
            fd = m.field.add(name=fname, number=i, type=ftype, label=label)
            if type_name:
                fd.type_name = type_name

    opt, rep = T.LABEL_OPTIONAL, T.LABEL_REPEATED
    msg(
        "Image",
        [("name", T.TYPE_STRING, opt, None), ("codec", T.TYPE_STRING, opt, None), ("data", T.TYPE_BYTES, opt, None)],
    )
    msg(
        "Request",
        [
            ("seq", T.TYPE_UINT64, opt, None),
            ("images", T.TYPE_MESSAGE, rep, ".benchpeers.Image"),
            ("state", T.TYPE_BYTES, opt, None),
            ("task", T.TYPE_STRING, opt, None),
        ],
    )
    msg(
        "Reply",
        [
            ("seq", T.TYPE_UINT64, opt, None),
            ("rows", T.TYPE_UINT32, opt, None),
            ("cols", T.TYPE_UINT32, opt, None),
            ("chunk_model", T.TYPE_BYTES, opt, None),
            ("chunk_robot", T.TYPE_BYTES, opt, None),
        ],
    )
    msg("Blob", [("data", T.TYPE_BYTES, opt, None)])
    pool = descriptor_pool.DescriptorPool()
    fd = pool.Add(f)
    return tuple(message_factory.GetMessageClass(fd.message_types_by_name[n]) for n in ("Request", "Reply", "Blob"))


class ProtobufCodec:
    def __init__(self, p: dict):
        self.p = p
        self.Request, self.Reply, _ = proto_classes()
        self.seq = 0

    def encode_request(self) -> bytes:
        self.seq += 1
        r = self.Request(seq=self.seq, state=self.p["state"].tobytes(), task=self.p["task"])
        for name, img in self.p["images"].items():
            r.images.add(name=name, codec=img.codec, data=img.data)
        return r.SerializeToString()

    def decode_request(self, body: bytes):
        r = self.Request.FromString(body)
        return r.seq, np.frombuffer(r.state, np.float32), {i.name: i.data for i in r.images}, r.task

    def encode_reply(self, req) -> bytes:
        c = self.p["chunk"]
        return self.Reply(
            seq=req[0], rows=c.shape[0], cols=c.shape[1], chunk_model=c.tobytes(), chunk_robot=c.tobytes()
        ).SerializeToString()

    def decode_reply(self, body: bytes):
        r = self.Reply.FromString(body)
        shape = (r.rows, r.cols)
        return (
            r.seq,
            np.frombuffer(r.chunk_model, np.float32).reshape(shape),
            np.frombuffer(r.chunk_robot, np.float32).reshape(shape),
        )


class PickleCodec:
    def __init__(self, p: dict):
        self.p = p
        _, _, self.Blob = proto_classes()
        self.seq = 0

    def encode_request(self) -> bytes:
        self.seq += 1
        obs = {
            "seq": self.seq,
            "state": self.p["state"],
            "task": self.p["task"],
            "images": {k: v.data for k, v in self.p["images"].items()},
        }
        return self.Blob(data=pickle.dumps(obs)).SerializeToString()

    def decode_request(self, body: bytes):
        return pickle.loads(self.Blob.FromString(body).data)  # noqa: S301  the peer's own design, loopback only

    def encode_reply(self, req) -> bytes:
        c = self.p["chunk"]
        return self.Blob(data=pickle.dumps({"seq": req["seq"], "chunk_model": c, "chunk_robot": c})).SerializeToString()

    def decode_reply(self, body: bytes):
        return pickle.loads(self.Blob.FromString(body).data)  # noqa: S301


def codec_only(stack: str, p: dict, repeats: int) -> tuple[float, int]:
    """Median us of encode request + decode request + encode reply + decode reply; bytes per request."""
    samples, size = [], 0
    if stack.startswith("ours"):
        c = OursCodec(p)
        for _ in range(repeats):
            t = time.perf_counter()
            h, b = c.encode_request()
            rh, rb = c.encode_reply(c.decode_request(h, b))
            c.decode_reply(rh, rb)
            samples.append(time.perf_counter() - t)
            size = len(h) + len(b) + len(rh) + len(rb)
    else:
        c = ProtobufCodec(p) if stack == "zmq_protobuf" else PickleCodec(p)
        for _ in range(repeats):
            t = time.perf_counter()
            b = c.encode_request()
            rb = c.encode_reply(c.decode_request(b))
            c.decode_reply(rb)
            samples.append(time.perf_counter() - t)
            size = len(b) + len(rb)
    return statistics.median(samples) * 1e6, size


# ---- servers (each its own process: `python -m benchmarks.peers --serve STACK --endpoint E`) -------------


def serve(stack: str, endpoint: str, cameras: int = 3) -> None:
    p = payload(cameras)
    if stack in ("ours", "ours_no_router"):
        import zenoh

        from wire.qos import declare_publisher
        from wire.transport import make_config, open_session

        c = OursCodec(p)
        z = (
            open_session(connect=[endpoint], what="peers server")
            if stack == "ours"
            else zenoh.open(make_config("peer", listen=[endpoint]))
        )
        pub = declare_publisher(z, ACTION_KEY, "action")

        def on_obs(sample):
            h, b = c.encode_reply(c.decode_request(sample.attachment.to_bytes(), sample.payload.to_bytes()))
            pub.put(b, attachment=h)

        z.declare_subscriber(OBS_KEY, on_obs)
        print(READY, flush=True)
        threading.Event().wait()
    elif stack == "zmq_protobuf":
        import zmq

        c = ProtobufCodec(p)
        sock = zmq.Context.instance().socket(zmq.REP)
        sock.bind(endpoint)
        print(READY, flush=True)
        while True:
            sock.send(c.encode_reply(c.decode_request(sock.recv(copy=False).buffer)), copy=False)
    else:
        from concurrent import futures

        import grpc

        c = PickleCodec(p)
        handler = grpc.method_handlers_generic_handler(
            "benchpeers.Policy",
            {"Infer": grpc.unary_unary_rpc_method_handler(lambda body, _ctx: c.encode_reply(c.decode_request(body)))},
        )
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(endpoint)
        server.start()
        print(READY, flush=True)
        server.wait_for_termination()


# ---- clients ------------------------------------------------------------------------------------


def _client(stack: str, endpoint: str, p: dict):
    """A `request()` callable doing one full round trip (encode, send, wait, decode), and a closer."""
    if stack in ("ours", "ours_no_router"):
        from wire.qos import declare_publisher
        from wire.transport import open_session

        c = OursCodec(p)
        z = open_session(connect=[endpoint], what="peers client")
        pub = declare_publisher(z, OBS_KEY, "obs")
        got = threading.Event()
        box = []

        def on_action(sample):
            box.append((sample.attachment.to_bytes(), sample.payload.to_bytes()))
            got.set()

        z.declare_subscriber(ACTION_KEY, on_action)

        def request():
            h, b = c.encode_request()
            got.clear()
            pub.put(b, attachment=h)
            if not got.wait(2.0):
                raise TimeoutError("no chunk within 2 s")
            return c.decode_reply(*box.pop())

        return request, z.close
    if stack == "zmq_protobuf":
        import zmq

        c = ProtobufCodec(p)
        sock = zmq.Context.instance().socket(zmq.REQ)
        sock.connect(endpoint)

        def request():
            sock.send(c.encode_request(), copy=False)
            return c.decode_reply(sock.recv(copy=False).buffer)

        return request, lambda: sock.close(0)
    import grpc

    c = PickleCodec(p)
    channel = grpc.insecure_channel(
        endpoint, options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    )
    call = channel.unary_unary("/benchpeers.Policy/Infer")

    def request():
        return c.decode_reply(call(c.encode_request(), timeout=5.0))

    return request, channel.close


def round_trips(
    stack: str, requests: int, warmup: int, tmp: Path, router_endpoint: str | None, cameras: int = 3
) -> np.ndarray:
    """Milliseconds of `requests` sequential round trips after `warmup`, the server in its own process."""
    from wire.procs import ChildProcess, free_port

    if stack == "ours":
        server_ep = client_ep = router_endpoint
    elif stack == "ours_no_router":
        server_ep = client_ep = f"tcp/127.0.0.1:{free_port()}"
    elif stack == "zmq_protobuf":
        port = free_port()
        server_ep = client_ep = f"tcp://127.0.0.1:{port}"
    else:
        port = free_port()
        server_ep = client_ep = f"127.0.0.1:{port}"
    child = ChildProcess(
        [
            sys.executable,
            "-m",
            "benchmarks.peers",
            "--serve",
            stack,
            "--endpoint",
            server_ep,
            "--cameras",
            str(cameras),
        ],
        tmp / f"{stack}-{cameras}.log",
        ready_text=READY,
        name=f"peer-{stack}",
    ).start(timeout_s=60)
    p = payload(cameras)
    try:
        request, close = _client(stack, client_ep, p)
        try:
            deadline = time.monotonic() + 10
            while True:  # Zenoh's routes settle asynchronously after both sessions declare: the first may drop
                try:
                    request()
                    break
                except TimeoutError:
                    if time.monotonic() > deadline:
                        raise
            for _ in range(warmup):
                request()
            out = np.empty(requests)
            for i in range(requests):
                t = time.perf_counter()
                request()
                out[i] = time.perf_counter() - t
        finally:
            close()
    finally:
        child.stop()
    return out * 1e3


def measure(requests: int, stacks: list[str], warmup: int = 50, no_images: tuple[str, ...] = ()) -> dict:
    """Every stack at the payload; then each of `no_images` again without the images (its fixed cost per message:
    with it, a stack's round trip splits into what every message costs and what the 350 KB of JPEG cost)."""
    from wire.procs import start_router

    p = payload()
    res = {
        "requests": requests,
        "warmup": warmup,
        "jpeg_bytes_per_camera": [len(v.data) for v in p["images"].values()],
        "stacks": {},
        "no_images": {},
    }
    with tempfile.TemporaryDirectory() as tmpd:
        tmp = Path(tmpd)
        router, endpoint = start_router(None, tmp / "router.log") if "ours" in (*stacks, *no_images) else (None, None)
        try:
            for stack in stacks:
                ms = round_trips(stack, requests, warmup, tmp, endpoint)
                codec_us, size = codec_only(stack, p, max(20, requests // 5))
                res["stacks"][stack] = {
                    "rtt_ms_p50": float(np.median(ms)),
                    "rtt_ms_p99": float(np.percentile(ms, 99)),
                    "rtt_ms_mean": float(ms.mean()),
                    "codec_us": codec_us,
                    "bytes_per_request": size,
                    "transport_ms_p50": float(np.median(ms)) - codec_us / 1e3,
                }
                s = res["stacks"][stack]
                print(
                    f"{stack:13s} p50 {s['rtt_ms_p50']:6.3f} ms  p99 {s['rtt_ms_p99']:6.3f} ms  mean {s['rtt_ms_mean']:6.3f} ms"
                    f"  codec {codec_us:7.1f} us  {size:,} B/request",
                    flush=True,
                )
            small = payload(0)
            for stack in no_images:
                ms = round_trips(stack, requests, warmup, tmp, endpoint, cameras=0)
                codec_us, size = codec_only(stack, small, max(20, requests // 5))
                res["no_images"][stack] = s = {
                    "rtt_ms_p50": float(np.median(ms)),
                    "rtt_ms_p99": float(np.percentile(ms, 99)),
                    "codec_us": codec_us,
                    "bytes_per_request": size,
                }
                print(
                    f"{stack:13s} without images: p50 {s['rtt_ms_p50']:6.3f} ms  p99 {s['rtt_ms_p99']:6.3f} ms  "
                    f"codec {codec_us:6.1f} us  {size:,} B/request",
                    flush=True,
                )
        finally:
            if router is not None:
                router.stop()
    ours = res["stacks"].get("ours")
    for peer in ("zmq_protobuf", "grpc_pickle"):
        if ours and peer in res["stacks"]:
            res[f"ours_over_{peer}_p50"] = ours["rtt_ms_p50"] / res["stacks"][peer]["rtt_ms_p50"]
            res[f"ours_over_{peer}_mean"] = ours["rtt_ms_mean"] / res["stacks"][peer]["rtt_ms_mean"]
    return res


def run(quick: bool) -> Result:
    missing = missing_libraries()
    if missing:
        return Result(skipped=f"missing {', '.join(missing)}: pip install -e '.[bench-peers]'")
    r = measure(
        100 if quick else 1000,
        list(STACKS),
        warmup=10 if quick else 50,
        no_images=("ours", "ours_no_router", "zmq_protobuf"),
    )
    res = Result(details=r)
    for stack, s in r["stacks"].items():
        res.add(f"{stack}: round trip p50", s["rtt_ms_p50"], "ms")
        res.add(f"{stack}: round trip p99", s["rtt_ms_p99"], "ms")
        res.add(f"{stack}: round trip mean", s["rtt_ms_mean"], "ms")
        res.add(f"{stack}: codec only (enc+dec both ways)", s["codec_us"], "us")
        res.add(f"{stack}: bytes per request", s["bytes_per_request"], "B")
    for stack, s in r["no_images"].items():
        res.add(f"{stack} without images: round trip p50", s["rtt_ms_p50"], "ms")
    res.add("ours / zmq_protobuf, round trip p50", r.get("ours_over_zmq_protobuf_p50"), "x", target=1.0)
    res.add("ours / grpc_pickle, round trip p50", r.get("ours_over_grpc_pickle_p50"), "x", target=0.3)
    res.add("ours / zmq_protobuf, round trip mean", r.get("ours_over_zmq_protobuf_mean"), "x")
    res.add("ours / grpc_pickle, round trip mean", r.get("ours_over_grpc_pickle_mean"), "x")
    return res


def main(argv: list[str] | None = None) -> int:
    ap = cli(__doc__, prog="python -m benchmarks.peers")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--stacks", nargs="+", choices=STACKS, default=list(STACKS))
    ap.add_argument("--serve", choices=STACKS, help=argparse.SUPPRESS)  # the server side, run as a child process
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--cameras", type=int, default=3, help=argparse.SUPPRESS)
    args = parse_with_out(ap, argv, "reports/bench/peers.json")
    if args.serve:
        serve(args.serve, args.endpoint, args.cameras)
        return 0
    missing = missing_libraries()
    if missing:
        print(
            f"benchmarks.peers: missing {', '.join(missing)}; install them with pip install -e '.[bench-peers]'",
            file=sys.stderr,
        )
        return 2
    r = measure(args.requests, args.stacks, args.warmup)
    for key in ("ours_over_zmq_protobuf_p50", "ours_over_grpc_pickle_p50"):
        if key in r:
            print(f"{key}: {r[key]:.2f}x")
    write_report(args.out, r, indent=1, end="", say=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
