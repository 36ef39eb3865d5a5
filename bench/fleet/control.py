"""The control channel between the runner and its fleet shards: JSON lines over a Unix socket.

    runner ── ControlServer (listens on <tmp>/control.sock) ◄── ControlClient ── shard k
      start {start_mono, t0_mono, end_mono}       ─────────►   (instants on the shard's own clock)
      stop {} / robot_fault {...}                 ─────────►
      clock_ping {id, t1}                         ─────────►
      ◄─────────  clock_pong {id, t1, t2}  (answered on the shard's read thread: bench.fleet.clock)
      ◄─────────  hello {shard, pid} / ready {robots} / status {...} / done {...} / error {...}

A Unix socket binds no port, and it lives in a private temporary directory the runner removes. Shards on
another host (`bench run --cluster ray`) reach the runner over TCP instead: the address is then
`tcp:HOST:PORT`, the one form ControlClient parses besides a socket path.
Invariant: messages are JSON objects with a "type" key (no pickle); each side reads on its own
thread, so neither the shard's control loop nor the runner's progress display ever blocks on it.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable

from bench.fleet import clock as clocks


def _lines(sock: socket.socket):
    buf = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except OSError:
            return
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue


class _End:
    """What both ends share: `send(msg)` from any thread, one JSON line under the lock; False once the socket is gone."""

    sock: socket.socket
    lock: threading.Lock

    def send(self, msg: dict) -> bool:
        data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        try:
            with self.lock:
                self.sock.sendall(data)
            return True
        except OSError:
            return False


class ShardLink(_End):
    """The runner's view of one connected shard."""

    def __init__(self, sock: socket.socket, on_message: Callable[[ShardLink, dict], None]):
        self.sock = sock
        self.lock = threading.Lock()
        self.shard: int | None = None
        self.pid: int | None = None
        self.closed = threading.Event()
        self._on_message = on_message
        self._pongs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._read, name="control-read", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for msg in _lines(self.sock):
            kind = msg.get("type")
            if kind == "clock_pong":  # stamped here, on receipt, not when the runner's main thread gets to it
                self._pongs.put((msg, time.monotonic()))
                continue
            if kind == "hello":
                self.shard, self.pid = msg.get("shard"), msg.get("pid")
            self._on_message(self, msg)
        self.closed.set()
        self._on_message(self, {"type": "closed", "shard": self.shard})

    def measure_clock(self, n: int = clocks.EXCHANGES, timeout_s: float = 5.0) -> clocks.ClockOffset:
        """The shard's clock offset from `n` ping/pong exchanges (bench.fleet.clock); TimeoutError if none came back."""
        samples = []
        deadline = time.monotonic() + timeout_s
        for i in range(n):
            t1 = time.monotonic()
            if not self.send({"type": "clock_ping", "id": i, "t1": t1}):
                break
            while True:
                left = deadline - time.monotonic()
                try:
                    msg, t4 = self._pongs.get(timeout=max(left, 0.0)) if left > 0 else self._pongs.get_nowait()
                except queue.Empty:
                    msg = None
                    break
                if msg.get("id") == i and msg.get("t1") == t1:
                    samples.append((t1, float(msg["t2"]), float(msg.get("t3", msg["t2"])), t4))
                    break  # an older exchange's late pong is skipped
            if msg is None:
                break
        if not samples:
            raise TimeoutError(f"shard {self.shard} answered no clock ping within {timeout_s:.0f} s")
        return clocks.estimate(samples)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class ControlServer:
    """Accepts shard connections; every message lands in `messages` (a queue of (link, msg))."""

    def __init__(self, tcp_host: str | None = None):
        self.dir = tempfile.mkdtemp(prefix="bench-ctl-")
        if tcp_host is None:
            self.path = os.path.join(self.dir, "control.sock")
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.bind(self.path)
        else:
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.bind((tcp_host, 0))
            self.path = f"tcp:{tcp_host}:{self.sock.getsockname()[1]}"
        self.sock.listen(64)
        self.links: list[ShardLink] = []
        self.messages: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="control-accept", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            self.links.append(ShardLink(conn, lambda link, msg: self.messages.put((link, msg))))

    def broadcast(self, msg: dict) -> None:
        for link in list(self.links):
            link.send(msg)

    def link(self, shard: int) -> ShardLink | None:
        return next((link for link in self.links if link.shard == shard), None)

    def close(self) -> None:
        self._stop.set()
        for link in list(self.links):
            link.close()
        try:
            self.sock.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


class ControlClient(_End):
    """The shard's end: `send(msg)` from any thread; incoming messages go to `on_message`."""

    def __init__(self, path: str, on_message: Callable[[dict], None], connect_timeout_s: float = 10.0):
        deadline = time.monotonic() + connect_timeout_s
        while True:
            try:
                if path.startswith("tcp:"):
                    host, port = path[4:].rsplit(":", 1)
                    self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    self.sock.connect((host, int(port)))
                else:
                    self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    self.sock.connect(path)
                break
            except OSError:
                self.sock.close()
                if time.monotonic() > deadline:
                    raise ConnectionError(f"shard: cannot reach the runner's control socket {path}") from None
                time.sleep(0.05)  # the runner creates the socket before starting shards; this only covers a race
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self._on_message = on_message
        threading.Thread(target=self._read, name="control-read", daemon=True).start()

    def _read(self) -> None:
        for msg in _lines(self.sock):
            if msg.get("type") == "clock_ping":  # answered at once, on this thread: the runner times the round trip
                now = time.monotonic()
                self.send({"type": "clock_pong", "id": msg.get("id"), "t1": msg.get("t1"), "t2": now, "t3": now})
                continue
            self._on_message(msg)
        self.closed.set()
        self._on_message({"type": "closed"})

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
