"""Per-node Zenoh routers and site proxies for `bench run --cluster ray` (`cluster.routers: per_node`).

    driver host                  node A (a shard)                      node B (a replica)
    hub router  ◄──connect────── router:A ◄── chaos-proxy:A ◄── robots
    (wire.transport)               ▲
        ▲                          └────connect────┬──── router:B ◄── policy-server
        └──────────connect─────────────────────────┘     (each node router joins the hub and those before it)
    driver's site proxies (attackers only)        one proxy per site, over 1+ processes

Every node that hosts a shard or a replica gets a Zenoh router (a child of a Ray actor pinned to the node,
reserving no resources) that listens on the node's address and `connect`s to the driver's router and to
every node router started before it, so the routers form one meshed Zenoh network: a robot on node A reaches
a replica on node B through router:A and router:B directly (Zenoh's link-state routing among routers takes
the shortest path; the hub's path is the longer one), and keeps reaching it while the hub is down. Each link
is opened by one side only (the later router), and Zenoh reconnects it when it closes: a router that connected
retries its `connect` endpoints (`connect/retry`, wire.transport.make_config), so a restarted router is
rejoined by the routers started after it and rejoins the ones started before it (its argv names them).
A replica connects to its node's router directly; a node with
shards also gets one proxy per site in front of its router, dealt round-robin over as many chaos proxy
server processes (one event loop each) as the requests of its robots call for within the node's spare CPUs
(bench.run.sizing.node_proxy_processes, the local run's rule), and each robot connects to its own node's
proxy for its site. The fault timeline still speaks of one proxy per site:
`SiteFanout` applies each site call (partition, toxics, profile) to that site's proxy on the driver and on
every node, and sums their fidelity counters, so `proxy_legs` covers every node's links. A `router` fault
applies to every router at once (`AllRouters`).

Under `security: mtls` (`MeshSecurity`) each node router gets its own key and certificate from the run's CA
(CN `node-router`, the role the run's access rules admit as a peer router; SAN its node's address and its
node, bench.security.pki.node_router_name), listens with mTLS, joins the hub and its peer node routers over
mTLS with that certificate (verifying each one's name: its address) and enforces the run's access rules
(wire.acl, the hub's file) on its own clients: robots and replicas are checked by the router they are
attached to; routers accept each other as peers by CN (`router`, `node-router`). The rules name the role,
not the nodes, so a node router started after the others (a node that joined the cluster after the rules
were written) is admitted by the routers already running without restarting them. Its certificate, key, the CA and the rules reach the node with the router's
actor (`put_files`). The site proxies forward the TLS bytes untouched, so the robots' endpoints are `tls/`
ones on their node's proxy.

Nodes are learnt as the run places its children (bench.run.starters' `server` and `shard` starters locate each one, then
ask `NodeMesh.links(node)`): a node that gets nothing gets no router. Every router and proxy is registered
in the run's ProcessSet, so it stops with the run, pass or fail; one that dies ends the run with exit 2
naming its node (bench.run.observe.check_children).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from wire.procs import router_argv

ROUTERS = ("per_node", "driver")
PROXY_READY_TEXT = "toxiproxy-server-py ready"
ROUTER_READY_TEXT = "router ready"


def resolve_routers(setting: str | None) -> str:
    """`cluster.routers` as a run uses it: unset means `per_node` (with `security: mtls` too: each node router
    then has its own certificate and enforces the run's access rules, `MeshSecurity`)."""
    if setting is None:
        return "per_node"
    if setting not in ROUTERS:
        raise ValueError(f"cluster.routers must be one of {', '.join(ROUTERS)}, not {setting!r}")
    return setting


def node_host(run_host: str, node: dict) -> str:
    """The address a node's router and proxies listen on: loopback when the whole cluster is this host (the
    run's own `host`), else the node's address on the cluster's network."""
    return "127.0.0.1" if run_host == "127.0.0.1" else node["ip"]


def node_router_argv(
    host: str,
    port: int,
    hub_endpoint: str,
    tls=None,
    rules: str | None = None,
    peers: list[str] | tuple[str, ...] = (),
    extra_args: list[str] | tuple[str, ...] = (),
) -> list[str]:
    """A node's Zenoh router: listening on `host:port` (its node's address), joined to the driver's router and to
    `peers`, the endpoints of the node routers started before it (the mesh: they never connect back, so each
    pair has one link). With `tls` (a bench.security.pki.Issued) and `rules` (the access rules file) it listens
    with mTLS, joins the hub and its peers over mTLS with the same certificate and enforces the rules on its
    own clients. `extra_args`: more wire.transport flags (the run's --max-sessions)."""
    scheme = "tcp" if tls is None else "tls"
    wrong = [e for e in (hub_endpoint, *peers) if not e.startswith(f"{scheme}/")]
    if tls is None:
        if wrong:
            raise ValueError(f"a plain node router joins plain routers, not {wrong[0]!r}")
        return router_argv(f"tcp/{host}:{port}", [hub_endpoint, *peers], list(extra_args))
    if wrong or not rules:
        raise ValueError(
            f"a node router with TLS joins TLS routers under access rules, not "
            f"{(wrong or [hub_endpoint])[0]!r} with rules {rules!r}"
        )
    return router_argv(
        f"tls/{host}:{port}",
        [hub_endpoint, *peers],
        ["--tls-ca", tls.ca, "--tls-cert", tls.cert, "--tls-key", tls.key, "--access-control", rules, *extra_args],
    )


@dataclass(frozen=True)
class MeshSecurity:
    """What node routers need under `security: mtls`: the run's PKI (bench.security.pki.Pki, which issues each
    node router its own key and a certificate of CN `node-router` naming its node) and the access rules file
    every router of the run enforces (the hub's: it names every robot, replica and monitor, and as peer routers
    `peer_router_cns()`, so it admits a node router whenever it starts)."""

    pki: object
    rules: Path


def peer_router_cns() -> tuple[str, ...]:
    """The router CNs the run's access rules accept as peers: the hub's and the node routers' role, whichever
    node (bench.security.pki.NODE_ROUTER_CN)."""
    from bench.security.pki import NODE_ROUTER_CN, ROUTER_CN

    return (ROUTER_CN, NODE_ROUTER_CN)


def proxy_priority() -> str:
    """How the bench schedules its chaos proxies' event loops (chaos.toxiproxy --priority): fifo, unless
    BENCH_PROXY_PRIORITY says nice or normal. An emulated link must not wait for a CPU behind the system under test
    (docs/bench.md "The proxy's priority")."""
    import os

    want = os.environ.get("BENCH_PROXY_PRIORITY", "fifo")
    return want if want in ("fifo", "nice", "normal") else "fifo"


def proxy_argv(host: str, port: int) -> list[str]:
    """A node's chaos proxy server (chaos.toxiproxy: ours, which reports fidelity), its API on `host:port`."""
    import sys

    return [
        sys.executable,
        "-m",
        "chaos.toxiproxy",
        "--host",
        host,
        "--port",
        str(port),
        "--priority",
        proxy_priority(),
    ]


def short(node_id: str) -> str:
    return node_id[:12]


def proxy_name(i: int) -> str:
    """Process name of chaos proxy server `i` of this host (the first keeps the name runs always had)."""
    return "chaos-proxy" if i == 0 else f"chaos-proxy-{i}"


def node_proxy_name(i: int, node_id: str) -> str:
    """Process name of a node's chaos proxy server `i`: this host's name (proxy_name) with the node's."""
    return f"{proxy_name(i)}:{short(node_id)}"


@dataclass
class NodeLinks:
    """One node's router and (with shards) chaos proxy servers, and what its children connect to."""

    node: dict
    router: object  # bench.run.cluster.RemoteChild
    router_endpoint: str
    proxies: list = field(default_factory=list)  # RemoteChild of each chaos proxy server, once a shard is on the node
    api_urls: list = field(default_factory=list)
    pool: object = None  # chaos.client.ProxyPool over the node's proxy servers: each site lives on one of them
    sites: dict = field(default_factory=dict)  # site -> endpoint its robots connect to
    access_rules: str = ""  # the rules file the router enforces (security: mtls)
    peers: list = field(default_factory=list)  # endpoints of the node routers it connects to (started before it)
    certificate: str = ""  # its certificate (security: mtls): CN node-router, its node in the SAN

    def client_of(self, proxy: str):
        """The node's ChaosClient that holds proxy `proxy` (`site-NAME`), None if the node has no copy of it."""
        return self.pool.home.get(proxy) if self.pool is not None else None

    def describe(self) -> dict:
        out = {"router": {"name": self.router.name, "endpoint": self.router_endpoint, "peers": list(self.peers)}}
        if self.access_rules:
            out["router"]["access_rules"] = self.access_rules
        if self.certificate:
            out["router"]["certificate"] = self.certificate
        if self.proxies:
            out["chaos_proxy"] = {
                "processes": len(self.proxies),
                "servers": [{"name": c.name, "api": u} for c, u in zip(self.proxies, self.api_urls)],
                "site_process": {site: self.pool.server_of(f"site-{site}") for site in self.sites},
                "sites": dict(self.sites),
            }
        return out


class NodeMesh:
    """The run's node routers and proxies, started on a node the first time a child lands there."""

    def __init__(
        self,
        cluster,
        hub_endpoint: str,
        host: str,
        logs: Path,
        site_toxics: Callable[[], dict[str, list[dict]]],
        register: Callable[[str, object], None],
        security: MeshSecurity | None = None,
        router_args: list[str] | tuple[str, ...] = (),
    ):
        self.cluster, self.hub_endpoint, self.host, self.logs = cluster, hub_endpoint, host, Path(logs)
        self.router_args = tuple(router_args)  # wire.transport flags of every node router (the run's --max-sessions)
        self.security = security  # mTLS and access rules on every node router (security: mtls)
        if hub_endpoint.startswith("tls/") != (security is not None):  # never a plain node router beside a TLS hub
            raise ValueError(
                f"node routers joining the hub {hub_endpoint} need "
                f"{'MeshSecurity (certificates and access rules)' if security is None else 'a tls/ hub'}"
            )
        self.site_toxics = site_toxics  # site -> the toxics its proxies carry (the driver's copy's, converted)
        self.register = register  # into the run's ProcessSet (and CPU sampler), the moment a child exists
        self.nodes: dict[str, NodeLinks] = {}
        self._lock = threading.Lock()

    def links(self, node: dict, proxies: int) -> NodeLinks:
        """`node`'s router (started now if it has none), and with `proxies` > 0 its site proxies too, dealt over
        that many proxy server processes (bench.run.sizing.node_proxy_processes; a node keeps the ones it got
        first)."""
        with self._lock:
            links = self.nodes.get(node["node_id"])
            if links is None:
                links = self.nodes[node["node_id"]] = self._start_router(node)
            if proxies and not links.proxies:
                self._start_proxies(links, int(proxies))
            return links

    def _place(self, node: dict, name: str, log: Path, ready_text: str):
        """A child pinned to `node`, registered with the run, and a free port picked on that node for it to listen on."""
        child = self.cluster.place_on(node["node_id"], name, log, ready_text=ready_text, ready_timeout_s=30.0)
        self.register(name, child)
        child.locate()
        (port,) = child.free_ports(1)
        return child, port

    def _start_router(self, node: dict) -> NodeLinks:
        """`node`'s router, joined to the hub and to every node router already started (called under the lock)."""
        name = f"router:{short(node['node_id'])}"
        child, port = self._place(node, name, self.logs / f"router-{short(node['node_id'])}.log", ROUTER_READY_TEXT)
        host = node_host(self.host, node)
        tls = rules = None
        if self.security is not None:
            tls, rules = self.security.pki.node_router(short(node["node_id"]), host), str(self.security.rules)
            # the node reads them where the driver wrote them: the same files on a shared file system, else copies
            child.files = {p: Path(p).read_bytes() for p in (tls.ca, tls.cert, tls.key, rules)}
        peers = [links.router_endpoint for links in self.nodes.values()]
        argv = node_router_argv(host, port, self.hub_endpoint, tls, rules, peers, self.router_args)
        child.set_argv(argv)
        child.start(timeout_s=30)
        return NodeLinks(
            node,
            child,
            argv[argv.index("--listen") + 1],
            access_rules=rules or "",
            peers=peers,
            certificate=tls.cert if tls is not None else "",
        )

    def _start_proxies(self, links: NodeLinks, processes: int) -> None:
        from chaos.client import ChaosClient, ProxyPool

        node = links.node
        host = node_host(self.host, node)
        for i in range(processes):  # one event loop each; sites dealt round-robin over them, as a local run's pool
            name = node_proxy_name(i, node["node_id"])
            child, port = self._place(node, name, self.logs / f"{name.replace(':', '-')}.log", PROXY_READY_TEXT)
            child.set_argv(proxy_argv(host, port))
            child.start(timeout_s=30)
            links.proxies.append(child)
            links.api_urls.append(f"http://{host}:{port}")
        links.pool = ProxyPool([ChaosClient(u) for u in links.api_urls])
        upstream = links.router_endpoint.split("/", 1)[1]
        for site, toxics in self.site_toxics().items():
            proxy = links.pool.create_proxy(f"site-{site}", upstream=upstream, listen=f"{host}:0")
            for toxic in toxics:
                links.pool.add_toxic(f"site-{site}", **toxic)
            # a TCP proxy: TLS passes through untouched, so a robot verifies the node router's certificate
            # (it names the node's address, the proxy's too) and the router sees the robot's
            scheme = "tls" if self.security is not None else "tcp"
            links.sites[site] = f"{scheme}/{proxy['listen']}"

    def _links(self) -> list[tuple[str, NodeLinks]]:
        """The node map as it stands (under the lock: a node added mid-run starts its router holding it)."""
        with self._lock:
            return list(self.nodes.items())

    def routers(self) -> list:
        return [links.router for _, links in self._links()]

    def clients(self, proxy: str) -> list:
        """Every node's ChaosClient that holds proxy `proxy` (`site-NAME`): on each node, the proxy server
        process its site was dealt to."""
        return list(self.clients_by_node(proxy).values())

    def clients_by_node(self, proxy: str) -> dict[str, object]:
        """`clients`, by node id."""
        return {
            node_id: c for node_id, c in ((n, links.client_of(proxy)) for n, links in self._links()) if c is not None
        }

    def router_of(self, node_id: str):
        """The node's router (its RemoteChild: its actor reads the node's clocks), None if the node has none."""
        links = dict(self._links()).get(node_id)
        return links.router if links is not None else None

    def describe(self) -> dict:
        return {node_id: links.describe() for node_id, links in self._links()}


class SiteFanout:
    """The run's chaos API (a chaos.client.ProxyPool's face) when every node has its own site proxies: a call
    that changes a site proxy goes to the driver's copy and to every node's; `fidelity` sums them all."""

    FANNED = ("set_enabled", "add_toxic", "remove_toxic", "update_toxic", "delete_proxy")

    def __init__(self, pool, mesh: NodeMesh):
        self.pool, self.mesh = pool, mesh

    def fidelity(self, proxy: str) -> dict:
        from chaos.toxiproxy.fidelity import add

        return add([self.pool.fidelity(proxy), *(c.fidelity(proxy) for c in self.mesh.clients(proxy))])

    def __getattr__(self, attr: str):
        if attr not in self.FANNED:
            return getattr(self.pool, attr)  # create_proxy, get_proxy, toxics, server_of...: the driver's copy

        def fanned(proxy: str, *args, **kwargs):
            result = getattr(self.pool, attr)(proxy, *args, **kwargs)
            for client in self.mesh.clients(proxy):
                getattr(client, attr)(proxy, *args, **kwargs)
            return result

        return fanned


class AllRouters:
    """The `router` fault target under per_node routers: the driver's router and every node's, faulted
    together (kill, term, restart, pause, resume; undo takes back each)."""

    def __init__(self, processes: list, name: str = "router"):
        self.processes, self.name = list(processes), name

    @property
    def argv(self) -> list[str]:
        return self.processes[0].argv

    @property
    def pid(self):
        return self.processes[0].pid

    def alive(self) -> bool:
        return all(p.alive() for p in self.processes)

    def _each(self, method: str, *args):
        from chaos.faults import FaultHandle

        handles = [getattr(p, method)(*args) for p in self.processes]
        reversible = [h for h in handles if h is not None and h.reversible]
        undo = (lambda: [h.undo() for h in reversible]) if reversible else None
        return FaultHandle(self, method, undo)

    def kill(self):
        return self._each("kill")

    def term(self, grace_s: float | None = None):
        return self._each("term", *(() if grace_s is None else (grace_s,)))

    def restart(self):
        return self._each("restart")

    def restart_with(self, argv: list[str]):
        from chaos.faults import ProcessFaultError

        raise ProcessFaultError(
            f"{self.name}: restart_with is for a server; a router takes kill, term, restart, pause and resume"
        )

    def pause(self):
        return self._each("pause")

    def resume(self):
        return self._each("resume")
