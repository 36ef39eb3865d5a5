"""`python -m chaos.toxiproxy` / `toxiproxy-server-py`: run the proxy server in this process.

Accepts Toxiproxy's flags (`-host`, `-port`, `-config`, `-seed`, `-version`) and their `--` forms.
Prints one ready line to stdout once the API listens, for a parent to wait on:
    toxiproxy-server-py ready: listening on 127.0.0.1:8474 version 2.12.0+chaos.py

`--priority fifo` (what the bench asks) runs the event loop SCHED_FIFO at FIFO_PRIORITY where the host allows it,
else nice -10: a proxy that emulates a network must not wait for a CPU behind the system it measures (its late
chunks are the ones whose loop wake-up waited on the run queue: docs/results/, "Where the proxy tail went").
`--loop auto` (the default) runs it on uvloop where uvloop is installed (the `sim` extra installs it), else on
asyncio's own loop: the same coroutines either way, at about 14 % less CPU per round trip on uvloop
(`python -m benchmarks.proxy`, "proxy CPU per round trip").
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import random
import sys

READY_TEXT = "toxiproxy-server-py ready: listening on"
# Below the bench's control loops (bench.fleet.shard.LOOP_FIFO_PRIORITY 10): a robot's tick goes first, the network
# second, the servers and everything else after both.
FIFO_PRIORITY = 5
LOOP_LOG_TEXT = "event loop: "  # the log line naming the loop it runs on (uvloop or asyncio)


def port(text: str) -> int:
    """A TCP port for argparse: 0..65535 (0 = any free port); anything else is a usage error, not a traceback."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: not a whole number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {value}: must be 0..65535 (0 = any free port)")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="toxiproxy-server-py", description="Toxiproxy-compatible TCP fault proxy (asyncio)."
    )
    p.add_argument("-host", "--host", default="127.0.0.1", help="host for the API to listen on (default 127.0.0.1)")
    p.add_argument(
        "-port", "--port", type=port, default=8474, help="port for the API (default 8474; 0 = any free port)"
    )
    p.add_argument(
        "-config", "--config", default=None, help="JSON file with proxies to create on startup (a populate list)"
    )
    p.add_argument("-seed", "--seed", type=int, default=None, help="seed for the toxics' random draws")
    p.add_argument("-version", "--version", action="store_true", help="print the version and exit")
    p.add_argument(
        "-priority",
        "--priority",
        choices=("normal", "nice", "fifo"),
        default="normal",
        help="scheduling of the event loop: fifo = SCHED_FIFO where allowed (else nice -10), nice = nice -10, "
        "normal = unchanged (default)",
    )
    p.add_argument(
        "-proxy-metrics", "--proxy-metrics", action="store_true", help="accepted for compatibility; no metrics"
    )
    p.add_argument(
        "-runtime-metrics", "--runtime-metrics", action="store_true", help="accepted for compatibility; no metrics"
    )
    p.add_argument(
        "-loop",
        "--loop",
        choices=LOOPS,
        default="auto",
        help="the event loop: uvloop, asyncio (the standard library's), or auto = uvloop where installed (default)",
    )
    return p.parse_args(argv)


LOOPS = ("auto", "uvloop", "asyncio")


def loop_factory(want: str):
    """(name, event loop factory) for `--loop`: uvloop where asked or (auto) installed, else asyncio's own."""
    if want in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if want == "uvloop":
                raise SystemExit("error: --loop uvloop but uvloop is not installed (pip install uvloop)") from None
        else:
            return "uvloop", uvloop.new_event_loop
    return "asyncio", asyncio.new_event_loop


def raise_priority(want: str) -> str:
    """This process's thread (the event loop's) scheduled as `want` asks (wire.procs.raise_priority: fifo at
    FIFO_PRIORITY, else nice -10, else unchanged); returns what took effect."""
    from wire.procs import raise_priority as raise_thread_priority

    return raise_thread_priority(want, FIFO_PRIORITY)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from chaos.toxiproxy.server import VERSION, serve

    if args.version:
        print(f"toxiproxy-server version {VERSION}")
        return 0
    if args.seed is not None:
        random.seed(args.seed)
    logging.basicConfig(
        level=os.environ.get("LOG_LEVEL", "INFO").upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from wire.procs import raise_fd_limit

    raise_fd_limit()  # two sockets a proxied connection: 1,000 robots outgrow a soft limit of 1024
    if args.priority != "normal":
        from chaos.launch import PRIORITY_LOG_TEXT

        logging.getLogger("chaos.toxiproxy").info(
            "%s%s (asked: %s)", PRIORITY_LOG_TEXT, raise_priority(args.priority), args.priority
        )

    def ready(server) -> None:
        gc.freeze()  # start-up objects never need collecting; keeps GC pauses off the data path
        print(f"{READY_TEXT} {server.host}:{server.port} version {VERSION}", flush=True)

    loop_name, new_loop = loop_factory(args.loop)
    logging.getLogger("chaos.toxiproxy").info("%s%s", LOOP_LOG_TEXT, loop_name)
    try:
        with asyncio.Runner(loop_factory=new_loop) as runner:
            runner.run(serve(args.host, args.port, args.config, ready=ready))
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
