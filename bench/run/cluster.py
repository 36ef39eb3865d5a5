"""`bench run --cluster ray`: a run's fleet shards and server replicas placed on a Ray cluster's nodes.

    driver (bench run) ── router, chaos proxy, control socket, /metrics scraper, faults, verdict
        │ Ray actor calls (start, alive, kill, pause, restart, tail, files; mono: its node's clock, usage: its CPU)
        ├── ChildActor "shard:0"   @ node A ── python -m bench.fleet.shard  (its own process group)
        ├── ChildActor "server:r0" @ node B ── policy-server --manifest ...
        ├── ChildActor "router:<node>", "chaos-proxy:<node>" @ every used node (cluster.routers: per_node,
        │   bench.run.mesh: pinned to the node, no resources reserved)
        └── ...

Each child process is owned by one Ray actor that asks Ray for the child's resources (`num_cpus`, and
`num_gpus` for a replica whose device is cuda), so Ray's scheduler places it with the scenario's
`cluster.placement` (`spread`: over as many nodes as possible, `pack`: as few as possible). The actor
starts the child with `wire.procs.ChildProcess` and applies process faults through the same
`chaos.faults.ManagedProcess` a local run uses, on the node where the child runs.

The driver also times each node's clock through its actor (`mono`, bench.fleet.clock) and pulls each child's
CPU, memory and its node's CPU (`usage`, bench.run.usage.node_usage), since neither is visible from its host.

Local processes stay the default; nothing here is imported without `--cluster`.
Invariants: every child is stopped (and its actor killed) when the run ends, pass or fail; a child
whose node dies reads as a dead child naming the node, so the run ends with an error (exit 2), never a
hang (every call to an actor has a timeout).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from wire.procs import ChildProcess

CALL_TIMEOUT_S = 30.0  # any single actor call (a restart waits for ready inside the call: its own timeout)
USAGE_TIMEOUT_S = 0.5  # the CPU sampler's pull, once a second: a node slower than this is absent from that sample
PLACEMENTS = ("spread", "pack")


class ClusterError(RuntimeError):
    """The cluster cannot be reached or cannot place the run (exit 2 with this message)."""


def _ray():
    try:
        import ray
    except ImportError:
        raise ClusterError("--cluster ray needs Ray: pip install 'fleet-inference[cluster]' (ray[serve])") from None
    return ray


def connect(address: str | None) -> Cluster:
    """Join the cluster at `address` (ray://host:port, host:port, or None = RAY_ADDRESS)."""
    ray = _ray()
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise ClusterError(
            "--cluster ray needs a cluster address: set RAY_ADDRESS or pass --cluster ray://HOST:PORT "
            "(start one with `ray start --head`; docs/cluster.md)"
        )
    repo = str(Path(__file__).resolve().parents[2])
    try:
        if not ray.is_initialized():
            ray.init(
                address=address,
                logging_level="WARNING",
                log_to_driver=False,
                runtime_env={"env_vars": {"PYTHONPATH": repo}},
            )
    except Exception as exc:  # ConnectionError, ValueError, RuntimeError from ray.init
        raise ClusterError(f"cannot join the Ray cluster at {address}: {exc}") from None
    return Cluster(ray, address)


def _node_facts() -> dict:
    import ray

    ctx = ray.get_runtime_context()
    return {"node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(), "hostname": socket.gethostname()}


class ChildActorImpl:
    """Owns one child process on the node Ray placed it on (decorated as a Ray actor in `Cluster`)."""

    def __init__(
        self, name: str, argv: list[str], log_path: str, ready_text: str | None, env: dict, ready_timeout_s: float
    ):
        from bench.fleet.clock import TEST_SKEW_ENV
        from chaos.faults import ManagedProcess

        self.child = ChildProcess(argv, log_path, ready_text=ready_text, env=env, name=name)
        self.managed = ManagedProcess(self.child, name=name, ready_timeout_s=ready_timeout_s)
        # tests only: a child given a skewed clock stands for a node on that clock, so this actor reads the same one
        self.clock_skew_s = float((env or {}).get(TEST_SKEW_ENV) or 0.0)

    def node(self) -> dict:
        return _node_facts()

    def free_ports(self, n: int) -> list[int]:
        """`n` distinct TCP ports free on this node now (a router's or proxy's listen port is picked where it runs)."""
        socks = [socket.socket() for _ in range(n)]
        try:
            for s in socks:
                s.bind(("", 0))
            return [s.getsockname()[1] for s in socks]
        finally:
            for s in socks:
                s.close()

    def set_argv(self, argv: list[str]) -> None:
        """The child's argv, once the driver knows what it needs from this node (its ports, its address)."""
        self.child.argv = list(argv)

    def mono(self) -> float:
        """This node's monotonic clock (bench.fleet.clock: the driver times the call around it)."""
        return time.monotonic() + self.clock_skew_s

    def wall(self) -> float:
        """This node's wall clock, never skewed by the tests' monotonic skew: the clock a Zenoh router on this node
        stamps what it routes with (wire.transport.arrival_stamps)."""
        return time.time()

    def usage(self) -> dict:
        """This node's CPU and the child's process tree's, read here (bench.run.usage.node_usage)."""
        from bench.run.usage import node_usage

        return node_usage(self.child.pid if self.child.alive() else None)

    def put_files(self, files: dict[str, bytes]) -> None:
        """Files the child reads (its spec or manifest, TLS certificates, keys and access rules), written where the
        driver wrote them; a copy is readable by its owner only (a private key among them)."""
        for path, data in files.items():
            p = Path(path)
            if p.exists() and p.read_bytes() == data:
                continue  # the same file system as the driver's
            p.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)

    def start(self) -> int | None:
        self.managed.start()
        return self.child.pid

    def status(self) -> dict:
        proc = self.child.proc
        return {"pid": self.child.pid, "alive": self.child.alive(), "returncode": None if proc is None else proc.poll()}

    def fault(self, method: str, *args):
        """A chaos.faults.ManagedProcess method by name (kill, term, restart, restart_with, pause, resume, stop)."""
        result = getattr(self.managed, method)(*args)
        return result if isinstance(result, (int, type(None))) else None

    def argv(self) -> list[str]:
        return list(self.child.argv)

    def tail(self, n: int) -> str:
        return self.child.tail(n)

    def files_under(self, root: str) -> dict[str, bytes]:
        """Every file under `root` on this node (records and logs the child wrote), for the driver."""
        out = {}
        for p in Path(root).rglob("*"):
            if p.is_file():
                out[str(p)] = p.read_bytes()
        return out


class _RemoteProc:
    """Enough of subprocess.Popen for the runner and ProcessSet: returncode, poll(), wait()."""

    def __init__(self, child: RemoteChild):
        self._child = child
        self.pid = child._pid

    @property
    def returncode(self):
        return self._child._status().get("returncode")

    def poll(self):
        return self.returncode

    def wait(self, timeout: float | None = None):
        deadline = time.monotonic() + (timeout if timeout is not None else CALL_TIMEOUT_S)
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.returncode


class RemoteChild(ChildProcess):
    """A ChildProcess whose process runs on a cluster node, driven through its ChildActor."""

    def __init__(self, cluster: Cluster, actor, argv, log_path, ready_text, name, files: dict[str, bytes]):
        super().__init__(argv, log_path, ready_text=ready_text, name=name)
        self.cluster, self.actor, self.files = cluster, actor, files
        self._pid: int | None = None
        self.lost: str | None = None  # why the actor (its node) is gone
        self.node: dict = {}

    def _call(self, method: str, *args, timeout: float = CALL_TIMEOUT_S):
        ray = self.cluster.ray
        if self.lost:
            raise ProcessLookupError(self.lost)
        try:
            return ray.get(getattr(self.actor, method).remote(*args), timeout=timeout)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            where = self.node.get("hostname") or "?"
            self.lost = (
                f"{self.name}'s node {self.node.get('node_id', '?')[:12]} ({where}, {self.node.get('ip', '?')}) "
                f"is gone or not answering: {type(exc).__name__}"
            )
            raise ProcessLookupError(self.lost) from None

    def _status(self) -> dict:
        try:
            return self._call("status", timeout=10.0)
        except ProcessLookupError:
            return {"pid": self._pid, "alive": False, "returncode": -1}

    def locate(self) -> dict:
        """The node Ray placed this child's actor on (waits for the placement): node_id, ip, hostname."""
        if not self.node:
            self.node = self._call("node")
        return self.node

    def free_ports(self, n: int) -> list[int]:
        return self._call("free_ports", n)

    def set_argv(self, argv: list[str]) -> None:
        self.argv = list(argv)
        self._call("set_argv", list(argv))

    def where(self) -> str:
        """`node 5d2dca76ab12 (host, ip)`: the node this child runs on, for error messages."""
        return (
            f"node {self.node.get('node_id', '?')[:12]} ({self.node.get('hostname', '?')}, {self.node.get('ip', '?')})"
        )

    def measure_clock(self):
        """This child's node's clock offset from the driver's: exchanges timed around the actor's `mono()`."""
        from bench.fleet import clock as clocks

        return clocks.measure(lambda: self._call("mono", timeout=10.0))

    def measure_wall_clock(self):
        """This child's node's wall clock offset from the driver's wall clock: exchanges timed around the actor's
        `wall()` (a Zenoh router's timestamps are wall time: bench.run.collect.router_split moves them across nodes by it)."""
        from bench.fleet import clock as clocks

        return clocks.measure(lambda: self._call("wall", timeout=10.0), clock=time.time)

    def start(self, timeout_s: float = 30.0) -> RemoteChild:
        self.locate()
        if self.files:
            self._call("put_files", self.files)
        self._pid = self._call("start", timeout=max(timeout_s, CALL_TIMEOUT_S) + 30)
        self.proc = _RemoteProc(self)
        return self

    def wait_ready(self, timeout_s: float) -> None:
        return None  # the actor's start() waited for the ready line

    @property
    def pid(self) -> int | None:
        return self._pid

    def alive(self) -> bool:
        return bool(self._status().get("alive"))

    def signal(self, sig: int) -> None:
        import signal as _signal

        method = {_signal.SIGKILL: "kill", _signal.SIGSTOP: "pause", _signal.SIGCONT: "resume"}.get(sig)
        if method is None:
            raise ValueError(f"a remote child takes SIGKILL, SIGSTOP or SIGCONT, not {sig}")
        self._call("fault", method)

    def stop(self, grace_s: float = 5.0) -> int | None:
        try:
            return self._call("fault", "stop", timeout=grace_s + 15)
        except ProcessLookupError:
            return None
        finally:
            self.proc = self.proc or None

    def tail(self, n: int = 30) -> str:
        try:
            return self._call("tail", n)
        except ProcessLookupError as exc:
            return f"(no log: {exc})"

    def exit_text(self) -> str:
        return self.lost or f"on {self.where()} exited with {self.proc.returncode if self.proc else '?'}"

    def pull_files(self, root: Path) -> int:
        """Copy what the child wrote under `root` on its node to this host (a no-op on a shared file system)."""
        if self.lost or self.node.get("hostname") == socket.gethostname():
            return 0
        n = 0
        for path, data in self._call("files_under", str(root), timeout=120).items():
            p = Path(path)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            n += 1
        return n

    def kill_actor(self) -> None:
        try:
            self.cluster.ray.kill(self.actor)
        except Exception:
            pass


class RemoteManaged:
    """chaos.faults.ManagedProcess's face for a RemoteChild: the fault runs on the child's node."""

    def __init__(self, child: RemoteChild, name: str):
        self.child, self.name = child, name

    @property
    def pid(self):
        return self.child.pid

    @property
    def argv(self) -> list[str]:
        return self.child._call("argv")

    def alive(self) -> bool:
        return self.child.alive()

    def start(self) -> None:
        self.child._call("fault", "start", timeout=180)

    def stop(self):
        return self.child.stop()

    def _fault(self, method: str, *args, undo=None):
        from chaos.faults import FaultHandle

        self.child._call("fault", method, *args, timeout=180)
        return FaultHandle(self, method, undo)

    def kill(self):
        return self._fault("kill", undo=self.start)

    def term(self, grace_s: float | None = None):
        return self._fault("term", *(() if grace_s is None else (grace_s,)), undo=self.start)

    def restart(self):
        return self._fault("restart")

    def restart_with(self, argv: list[str]):
        previous = self.argv
        return self._fault("restart_with", list(argv), undo=lambda: self.restart_with(previous))

    def pause(self):
        return self._fault("pause", undo=self.resume)

    def resume(self):
        return self._fault("resume")


class Cluster:
    """The driver's view of the cluster: places children as actors and describes the nodes."""

    def __init__(self, ray, address: str):
        self.ray, self.address = ray, address
        self.children: list[RemoteChild] = []
        self._actor_cls = ray.remote(max_restarts=0, max_concurrency=4)(ChildActorImpl)

    def nodes(self) -> list[dict]:
        return [
            {
                "node_id": n["NodeID"],
                "ip": n["NodeManagerAddress"],
                "alive": bool(n["Alive"]),
                "cpus": n.get("Resources", {}).get("CPU", 0),
                "gpus": n.get("Resources", {}).get("GPU", 0),
            }
            for n in self.ray.nodes()
        ]

    def cpus(self) -> int:
        """CPUs of the cluster's live nodes: what `fleet.shards: auto` sizes against instead of this host's cores."""
        return max(1, int(sum(n["cpus"] for n in self.nodes() if n["alive"])))

    def host_for_endpoints(self) -> str:
        """The address other nodes reach this driver's router, proxy and control socket on: loopback when every
        node is this host, else this host's address on the cluster's network."""
        me = self.ray.util.get_node_ip_address()
        ips = {n["ip"] for n in self.nodes() if n["alive"]}
        return "127.0.0.1" if ips <= {me} else me

    def place(
        self,
        name: str,
        argv: list[str],
        log_path: Path,
        *,
        ready_text: str | None = None,
        env: dict | None = None,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        placement: str = "spread",
        files: dict[str, bytes] | None = None,
        ready_timeout_s: float = 120.0,
    ) -> RemoteChild:
        opts = {
            "num_cpus": num_cpus,
            "num_gpus": num_gpus,
            "name": None,
            "scheduling_strategy": "SPREAD" if placement == "spread" else "DEFAULT",
        }
        env = dict(env or {})
        env.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
        actor = self._actor_cls.options(**opts).remote(
            name, list(argv), str(log_path), ready_text, env, ready_timeout_s
        )
        child = RemoteChild(self, actor, argv, log_path, ready_text, name, files or {})
        self.children.append(child)
        return child

    def place_on(
        self,
        node_id: str,
        name: str,
        log_path: Path,
        *,
        ready_text: str | None = None,
        env: dict | None = None,
        ready_timeout_s: float = 60.0,
    ) -> RemoteChild:
        """A child on exactly node `node_id` (Ray's NodeAffinity, not soft) that reserves no resources: a node's
        router or chaos proxy, beside the shards and replicas Ray placed there. Its argv is set once its node
        has named free ports (`free_ports`, then `set_argv`), before `start`."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        env = dict(env or {})
        env.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
        opts = {
            "num_cpus": 0,
            "num_gpus": 0,
            "name": None,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        }
        actor = self._actor_cls.options(**opts).remote(name, [], str(log_path), ready_text, env, ready_timeout_s)
        child = RemoteChild(self, actor, [], log_path, ready_text, name, {})
        self.children.append(child)
        return child

    def usage(self, children: dict[str, RemoteChild], timeout_s: float = USAGE_TIMEOUT_S) -> dict[str, dict]:
        """Each child's `ChildActor.usage()` that came back within `timeout_s` (all asked at once)."""
        refs = {c.actor.usage.remote(): name for name, c in children.items() if not c.lost}
        if not refs:
            return {}
        ready, _ = self.ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        out = {}
        for ref in ready:
            try:
                out[refs[ref]] = self.ray.get(ref, timeout=0)
            except Exception:
                continue  # its actor died: the child reads as dead elsewhere, with its node named
        return out

    def describe(self, placement: str) -> dict:
        by_node: dict[str, list[str]] = {}
        for c in self.children:
            by_node.setdefault(c.node.get("node_id", "?"), []).append(c.name)
        nodes = self.nodes()
        for n in nodes:
            n["children"] = sorted(by_node.get(n["node_id"], []))
        return {
            "kind": "ray",
            "address": self.address,
            "placement": placement,
            "nodes": nodes,
            "node_count": sum(1 for n in nodes if n["alive"]),
        }

    def close(self) -> None:
        for c in self.children:
            c.kill_actor()
        self.children.clear()
