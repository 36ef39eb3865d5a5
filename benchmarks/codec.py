"""Benchmark (not a test): encode/decode cost and size of a typical observation and chunk, vs pickle.

    python -m benchmarks.codec [--repeats 50]

Observation: 3 cameras 480x640 with sensor-like noise, JPEG q90; 7-d state; 10x7 prefixes (both).
Chunk: 50x7 float32, twice (model + robot space). Pickle baselines: the same dict of numpy arrays
with raw frames, and with the same JPEG bytes. Medians of one run; writes reports/bench/wire_codec.json.
"""

from __future__ import annotations

import pickle
import statistics
import time

import numpy as np

from benchmarks.common import Result, cli, parse_with_out, write_report
from wire import ActionChunk, Header, MsgType, Observation, decode_message, encode_image, unpack_header


def _frames(rng):
    h, w = 480, 640
    yy, xx = np.mgrid[0:h, 0:w]
    out = []
    for k in range(3):
        base = np.stack([(xx * (k + 1)) % 256, (yy * 2) % 256, ((xx + yy) // 3) % 256], -1).astype(np.int16)
        base += rng.normal(0, 6, base.shape).astype(np.int16)
        out.append(np.clip(base, 0, 255).astype(np.uint8))
    return out


def _median_ms(fn, repeats):
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1e3)
    return statistics.median(samples)


def measure(r: int) -> dict:
    """Median costs and sizes per case over `r` repeats (chunks: 10 r)."""
    rng = np.random.default_rng(0)
    frames = _frames(rng)
    state = rng.normal(size=7).astype(np.float32)
    prefix = rng.normal(size=(10, 7)).astype(np.float32)
    chunk = rng.normal(size=(50, 7)).astype(np.float32)
    header = Header(1, MsgType.OBS, 1, 0, time.monotonic_ns(), 0)

    jpegs = {f"cam{i}": encode_image(f, "jpeg", 90) for i, f in enumerate(frames)}

    def obs_encode_with_jpeg():
        imgs = {f"cam{i}": encode_image(f, "jpeg", 90) for i, f in enumerate(frames)}
        return header.pack(), Observation(
            "s", state, images=imgs, prefix_model=prefix, prefix_robot=prefix, inference_delay_steps=4
        ).encode()

    obs_msg = Observation("s", state, images=jpegs, prefix_model=prefix, prefix_robot=prefix, inference_delay_steps=4)
    obs_bytes = obs_msg.encode()

    def obs_decode_with_jpeg():
        unpack_header(header.pack())
        m = decode_message(obs_bytes, expect=Observation)
        return [img.decode() for img in m.images.values()]

    chunk_msg = ActionChunk("s", 1, 5, chunk, chunk, queue_wait_ms=1.0, inference_ms=20.0)
    chunk_bytes = chunk_msg.encode()
    pk_raw = {"state": state, "images": dict(zip(jpegs, frames)), "prefix_model": prefix, "prefix_robot": prefix}
    pk_jpeg = {
        "state": state,
        "images": {k: v.data for k, v in jpegs.items()},
        "prefix_model": prefix,
        "prefix_robot": prefix,
    }
    pk_chunk = {"chunk_model": chunk, "chunk_robot": chunk, "queue_wait_ms": 1.0, "inference_ms": 20.0}
    rows = {
        "observation_msgpack_jpeg": {
            "encode_ms_incl_jpeg": _median_ms(obs_encode_with_jpeg, r),
            "encode_ms_excl_jpeg": _median_ms(obs_msg.encode, r),
            "decode_ms_incl_jpeg": _median_ms(obs_decode_with_jpeg, r),
            "decode_ms_excl_jpeg": _median_ms(lambda: decode_message(obs_bytes, expect=Observation), r),
            "bytes": len(obs_bytes) + 27,
        },
        "observation_pickle_raw": {
            "encode_ms": _median_ms(lambda: pickle.dumps(pk_raw, 5), r),
            "decode_ms": _median_ms(lambda b=pickle.dumps(pk_raw, 5): pickle.loads(b), r),
            "bytes": len(pickle.dumps(pk_raw, 5)),
        },
        "observation_pickle_jpeg_bytes": {
            "encode_ms_excl_jpeg": _median_ms(lambda: pickle.dumps(pk_jpeg, 5), r),
            "decode_ms_excl_jpeg": _median_ms(lambda b=pickle.dumps(pk_jpeg, 5): pickle.loads(b), r),
            "bytes": len(pickle.dumps(pk_jpeg, 5)),
        },
        "chunk_msgpack": {
            "encode_ms": _median_ms(chunk_msg.encode, r * 10),
            "decode_ms": _median_ms(lambda: decode_message(chunk_bytes, expect=ActionChunk), r * 10),
            "bytes": len(chunk_bytes) + 27,
        },
        "chunk_pickle": {
            "encode_ms": _median_ms(lambda: pickle.dumps(pk_chunk, 5), r * 10),
            "decode_ms": _median_ms(lambda b=pickle.dumps(pk_chunk, 5): pickle.loads(b), r * 10),
            "bytes": len(pickle.dumps(pk_chunk, 5)),
        },
    }
    rows["observation_msgpack_jpeg"]["jpeg_kb_per_camera"] = round(
        np.mean([len(v.data) for v in jpegs.values()]) / 1000, 1
    )
    return rows


def run(quick: bool) -> Result:
    rows = measure(5 if quick else 50)
    res = Result(details=rows)
    obs, chunk, pk = rows["observation_msgpack_jpeg"], rows["chunk_msgpack"], rows["observation_pickle_jpeg_bytes"]
    res.add("observation encode (3 JPEG q90 480x640 incl.)", obs["encode_ms_incl_jpeg"], "ms")
    res.add("observation encode excl. JPEG", obs["encode_ms_excl_jpeg"], "ms")
    res.add("observation decode excl. JPEG", obs["decode_ms_excl_jpeg"], "ms")
    res.add("observation decode excl. JPEG / pickle", obs["decode_ms_excl_jpeg"] / pk["decode_ms_excl_jpeg"], "x")
    res.add("observation bytes", obs["bytes"], "B")
    res.add("chunk encode", chunk["encode_ms"] * 1e3, "us")
    res.add("chunk decode", chunk["decode_ms"] * 1e3, "us")
    return res


def main(argv=None) -> int:
    ap = cli(__doc__, prog="python -m benchmarks.codec")
    ap.add_argument("--repeats", type=int, default=50)
    args = parse_with_out(ap, argv, "reports/bench/wire_codec.json")
    r = args.repeats
    rows = measure(r)
    print(f"{'case':34s} {'encode ms':>10s} {'decode ms':>10s} {'bytes':>10s}")
    for name, row in rows.items():
        enc = next(v for k, v in row.items() if k.startswith("encode"))
        dec = next(v for k, v in row.items() if k.startswith("decode"))
        print(f"{name:34s} {enc:10.3f} {dec:10.3f} {row['bytes']:10d}")
        for k, v in row.items():
            if k.startswith(("encode", "decode")) and ("incl" in k or "excl" in k):
                print(f"    {k}: {v:.3f}")
    write_report(args.out, {"repeats": r, "results": rows}, indent=1, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
