"""The registry of a run's process starters, keyed by the kind of child: `router` (the run's Zenoh router),
`proxy` (the chaos proxies, one site proxy each with its profile's toxics), `mesh` (per-node routers and proxies,
bench.run.mesh), `server` (the policy-server replicas, in parallel), `shard` (the fleet shards, up to their start
barrier and the clocks' measurement) and `attacker` (bench.security.attacker, at t = 0's announcement).

`start_processes` runs START_ORDER's starters; bench.run.drive starts the attackers. Invariant: every child is
registered in the run's ProcessSet (`run.procs`) the moment it exists, before it is started, so the run's
`finally` stops it whatever fails after.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench.fleet import clock as clocks
from bench.fleet.control import ControlServer
from bench.run.manifests import overrides as manifest_overrides
from bench.run.manifests import replica_start_s
from bench.run.mesh import proxy_name
from bench.run.observe import measure_clocks, measure_node_walls, next_message
from bench.run.procset import is_local
from bench.run.specs import (
    assign_identities,
    attacker_spec,
    child_files,
    manifest_for,
    node_proxy_processes,
    pythonpath,
    router_args,
    server_argv,
    shard_specs,
)
from bench.run.state import RunState, SiteLink
from wire.procs import ChildProcess, start_on_picked_port, start_router

SERVER_READY_TEXT = "policy-server ready"
SHARD_READY_TIMEOUT_S = 60.0


def start_processes(run: RunState) -> None:
    """Every child the run starts before its start barrier, in START_ORDER, then processes.json."""
    run.cpu.start()
    assign_identities(run)
    for name in START_ORDER:
        STARTERS[name](run)
    write_process_table(run)


def start_hub_router(run: RunState) -> None:
    """The run's own Zenoh router (with per_node routers, the hub the node routers join)."""
    if run.s.security == "mtls":
        router, run.router_endpoint = start_secure_router(run)
    else:
        router, run.router_endpoint = start_router(
            None, run.logs / "router.log", host=run.host, extra_args=router_args(run)
        )
    run.router_child = run.procs.add("router", router)
    run.cpu.track("router", lambda: router.pid)  # a router restart (fault) changes the pid


def write_process_table(run: RunState) -> None:
    """processes.json: every child's name, pid (= its process group) and log, for people and tests. Written
    beside and renamed into place, so a reader polling for it never reads it half-written (a CI test that
    killed a node's router once it appeared read an empty file)."""
    rows = [{"name": n, "pid": c.pid, "log": str(getattr(c, "log_path", ""))} for n, c in run.procs.children if c.pid]
    for i, server in enumerate(run.proxy_servers):
        if getattr(server, "pid", None):
            rows.append({"name": proxy_name(i), "pid": server.pid, "log": str(run.logs / f"{proxy_name(i)}.log")})
    tmp = run.run_dir / "processes.json.tmp"
    tmp.write_text(json.dumps(rows, indent=1))
    tmp.replace(run.run_dir / "processes.json")


def start_proxy(run: RunState) -> None:
    from bench.run.mesh import proxy_priority
    from bench.run.sizing import proxy_processes
    from chaos import client as chaos_client
    from chaos import launch as chaos_launch
    from chaos import profiles as chaos_profiles

    # one event loop per proxy process: sites are dealt over as many as the load and the host call for
    run.proxy_servers = []
    for i in range(proxy_processes(run.s)):
        server = chaos_launch.start_proxy_server(log_path=run.logs / f"{proxy_name(i)}.log", priority=proxy_priority())
        run.procs.on_stop(proxy_name(i), server.stop)
        run.cpu.track(proxy_name(i), getattr(server, "pid", None))
        run.proxy_servers.append(server)
    proxy_server = run.proxy_server = run.proxy_servers[0]
    api = chaos_client.ProxyPool([chaos_client.ChaosClient(s.api_url) for s in run.proxy_servers])
    run.chaos = api
    router_hostport = run.router_endpoint.split("/", 1)[1]
    real = bool(getattr(proxy_server, "real_toxiproxy", False))
    run.network_stand_ins = {}  # site -> toxics the real Toxiproxy lacks (replaced)
    for name, site in run.s.sites.items():
        proxy = api.create_proxy(f"site-{name}", upstream=router_hostport, listen=f"{run.host}:0")
        toxics = chaos_profiles.profile_toxics(site.profile, site.overrides)
        if real:  # the Go binary has no `loss`: send its stand-in and say so in the summary
            if any(t["type"] == "loss" for t in toxics):
                run.network_stand_ins[name] = ["loss"]
            toxics = chaos_profiles.real_toxiproxy_equivalent(toxics)
        for toxic in toxics:
            api.add_toxic(f"site-{name}", **toxic)
        scheme = "tls" if run.s.security == "mtls" else "tcp"
        run.sites[name] = SiteLink(name, f"{scheme}/{proxy['listen']}", proxy)


def start_mesh(run: RunState) -> None:
    """Per-node routers and site proxies (bench.run.mesh), under `routers: per_node` only: started as shards and
    replicas find their nodes."""
    if run.routers != "per_node":
        return
    from bench.run.mesh import NodeMesh, SiteFanout
    from chaos import profiles as chaos_profiles

    def register(name: str, child) -> None:
        run.procs.add(name, child)
        child.locate()  # where it runs decides how its CPU is read
        if is_local(child, for_cpu=True):  # this host's /proc; the lambda reads the pid once started
            run.cpu.track(name, lambda c=child: c.pid)
        else:  # another host: through its actor, as a shard or replica there (bench.run.usage)
            track_remote_cpu(run, name, child)

    toxics = {name: chaos_profiles.profile_toxics(site.profile, site.overrides) for name, site in run.s.sites.items()}
    security = None
    if run.s.security == "mtls":  # each node router: its own certificate, the hub's access rules
        from bench.run.mesh import MeshSecurity

        security = MeshSecurity(run.pki, run.router_rules)
    run.mesh = NodeMesh(
        run.cluster, run.router_endpoint, run.host, run.logs, lambda: toxics, register, security, router_args(run)
    )
    run.chaos = SiteFanout(run.chaos, run.mesh)


def start_secure_router(run: RunState) -> tuple[ChildProcess, str]:
    from wire.acl import FleetIdentities, router_access_control

    robots = [v["client_uuid"] for v in run.identities.values()]
    robots += [a["name"] for a in run.s.attackers if a["credentials"] == "own_cert"]  # enrolled, then rogue
    peers: tuple[str, ...] = ()
    if run.routers == "per_node":  # the hub and every node router accept each other (bench.run.mesh), by role
        from bench.run.mesh import peer_router_cns

        peers = peer_router_cns()
    acl = router_access_control(
        FleetIdentities(tuple(robots), tuple(r.id for r in run.s.replicas), monitors=("bench-monitor",), routers=peers)
    )
    rules = run.router_rules = run.run_dir / "router-access-control.json"
    rules.write_text(json.dumps({"access_control": acl}, indent=1))
    # on the run's host address: a cluster's node routers and replicas reach it there (loopback without one)
    r = run.pki.router(hosts=(run.host,))
    return start_router(
        None,
        run.logs / "router.log",
        host=run.host,
        scheme="tls",
        env={"PYTHONPATH": pythonpath()},
        extra_args=[
            "--tls-ca",
            r.ca,
            "--tls-cert",
            r.cert,
            "--tls-key",
            r.key,
            "--access-control",
            str(rules),
            *router_args(run),
        ],
    )


def start_servers(run: RunState) -> None:
    import yaml

    threads, errors = [], []
    for replica in run.s.replicas:
        path = run.run_dir / "manifests" / f"{replica.id}.yaml"
        if run.cluster is not None:
            model = manifest_overrides(run.s, replica).get("model") or {}
            cuda = str(model.get("device", "cpu")).startswith("cuda")
            c = run.s.cluster
            skew = os.environ.get(clocks.REPLICA_TEST_SKEW_ENV)  # tests only: the replica's node on another clock
            child = run.cluster.place(
                f"server:{replica.id}",
                server_argv(path, test_skew=bool(skew)),
                run.logs / f"server-{replica.id}.log",
                env={clocks.TEST_SKEW_ENV: skew} if skew else None,
                ready_text=SERVER_READY_TEXT,
                num_cpus=c.get("replica_cpus", 1.0),
                num_gpus=c.get("replica_gpus", 1.0) if cuda else 0.0,
                placement=c.get("placement", "spread"),
            )
            if run.mesh is not None:  # its node's router, started there if the node has none yet
                run.replica_router[replica.id] = run.mesh.links(child.locate(), proxies=0).router_endpoint
        manifest = manifest_for(run, replica)
        path.write_text(yaml.safe_dump(manifest, sort_keys=False))
        if run.cluster is not None:
            tls = (manifest["zenoh"].get("tls") or {}).values() if run.s.security == "mtls" else ()
            child.files = child_files([str(path), *tls])  # its certificate too, where the node has no shared disk
        else:
            child = ChildProcess(
                server_argv(path),
                run.logs / f"server-{replica.id}.log",
                ready_text=SERVER_READY_TEXT,
                name=f"server-{replica.id}",
            )
        run.procs.add(f"server:{replica.id}", child)
        run.servers[replica.id] = {
            "child": child,
            "manifest": path,
            "health_port": manifest["health_port"],
            "audit": Path(manifest.get("audit_path", "")),
            "start_s": replica_start_s(manifest),
        }  # its start and a restart's

        if replica.start_at is not None:
            continue  # a scale-up: its `start` fault starts it at start_at (bench.scenario.events.read_faults)

        def start(c=child, rid=replica.id, path=path, manifest=manifest):
            try:
                if run.cluster is None:
                    start_local_replica(run, rid, path, manifest)
                else:
                    c.start(timeout_s=run.servers[rid]["start_s"])
            except Exception as exc:
                errors.append(str(exc))

        t = threading.Thread(target=start, daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("a server replica did not start:\n" + "\n".join(errors))
    for rid, info in run.servers.items():
        if is_local(info["child"], for_cpu=True):
            run.cpu.track(f"server:{rid}", lambda c=info["child"]: c.pid)  # a restart changes the pid
        else:
            track_remote_cpu(run, f"server:{rid}", info["child"])


def start_local_replica(run: RunState, rid: str, path: Path, manifest: dict) -> None:
    """Start a local replica; the health port picked for it and taken by another process before the replica
    binds it (its torch import takes seconds) is picked again, its manifest rewritten (start_on_picked_port)."""
    import yaml

    info = run.servers[rid]

    def make(port: int):
        manifest["health_port"] = info["health_port"] = port
        path.write_text(yaml.safe_dump(manifest, sort_keys=False))
        return info["child"]  # the same child, started again: the run's process set holds it

    start_on_picked_port(make, None, timeout_s=info["start_s"], first=int(manifest["health_port"]))


def start_shards(run: RunState) -> None:
    run.control = ControlServer(None if run.host == "127.0.0.1" else run.host)
    run.procs.on_stop("control", run.control.close)
    specs = shard_specs(run)
    paths = {spec["shard"]: run.run_dir / "manifests" / f"shard-{spec['shard']}.json" for spec in specs}
    argvs = {
        k: [sys.executable, "-m", "bench.fleet.shard", "--spec", str(path), "--control", run.control.path]
        for k, path in paths.items()
    }
    placed: dict[int, object] = {}
    if run.cluster is not None:  # every shard placed first: a node's proxies are sized by all its shards' robots
        c = run.s.cluster
        env = {"PYTHONPATH": pythonpath()}
        if os.environ.get(clocks.TEST_SKEW_ENV):  # tests only: a node's child does not inherit this env
            env[clocks.TEST_SKEW_ENV] = os.environ[clocks.TEST_SKEW_ENV]
        for k, argv in argvs.items():
            placed[k] = run.cluster.place(
                f"shard:{k}",
                argv,
                run.logs / f"shard-{k}.log",
                env=env,
                num_cpus=c.get("shard_cpus", 1.0),
                placement=c.get("placement", "spread"),
            )
        node_proxies = node_proxy_processes(run, specs, placed) if run.mesh is not None else {}
    for spec in specs:
        k = spec["shard"]
        path, argv = paths[k], argvs[k]
        if run.cluster is not None:
            child = placed[k]
            if run.mesh is not None:  # each robot connects to its site's proxy on the shard's own node
                node = child.locate()
                sites = run.mesh.links(node, proxies=node_proxies[node["node_id"]]).sites
                for robot in spec["robots"]:
                    robot["engine"]["connect_endpoints"] = [sites[run.robot_table[robot["robot"]]["site"]]]
            path.write_text(json.dumps(spec, indent=1))
            tls = [
                r["engine"][k] for r in spec["robots"] for k in ("tls_ca", "tls_cert", "tls_key") if r["engine"].get(k)
            ]
            child.files = child_files([str(path), *tls])  # its robots' certificates too
        else:
            path.write_text(json.dumps(spec, indent=1))
            child = ChildProcess(argv, run.logs / f"shard-{k}.log", name=f"shard-{k}", env={"PYTHONPATH": pythonpath()})
        run.procs.add(f"shard:{k}", child)
        child.start()
        if is_local(child, for_cpu=True):
            run.cpu.track(f"shard:{k}", child.pid)
        else:
            track_remote_cpu(run, f"shard:{k}", child)
    deadline = time.monotonic() + SHARD_READY_TIMEOUT_S + 0.2 * run.s.robots
    ready: set[int] = set()
    while len(ready) < len(specs):
        msg = next_message(run, deadline, "shards to start their robots")
        if msg.get("type") == "ready":
            ready.add(msg["shard"])
    run.clocks = measure_clocks(run)
    if run.cluster is not None:
        run.node_walls = measure_node_walls(run)


def start_attackers(run: RunState) -> None:
    run.attack_log = run.run_dir / "attacks.jsonl"
    for a in run.s.attackers:
        start_unix = time.time() + (run.t0_mono + float(a["at"]) - time.monotonic())
        path = run.run_dir / "manifests" / f"attacker-{a['name']}.json"
        path.write_text(json.dumps(attacker_spec(run, a, start_unix), indent=1))
        child = ChildProcess(
            [sys.executable, "-m", "bench.security.attacker", "--spec", str(path), "--out", str(run.attack_log)],
            run.logs / f"attacker-{a['name']}.log",
            name=f"attacker-{a['name']}",
            env={"PYTHONPATH": pythonpath()},
        )
        run.procs.add(f"attacker:{a['name']}", child)
        child.start()
        run.cpu.track(f"attacker:{a['name']}", child.pid)  # on this host the attackers share the CPU: show it


def track_remote_cpu(run: RunState, name: str, child) -> None:
    """A child on another host: the CPU sampler pulls its readings from its node (bench.run.usage)."""
    run.cpu.track_remote(name, child.where())
    run.cpu.remote_usage = lambda names: run.cluster.usage({n: run.procs.get(n) for n in names})


STARTERS: dict[str, Callable[[RunState], None]] = {
    "router": start_hub_router,
    "proxy": start_proxy,
    "mesh": start_mesh,
    "server": start_servers,
    "shard": start_shards,
    "attacker": start_attackers,
}
START_ORDER = ("router", "proxy", "mesh", "server", "shard")  # the attackers start with the measured window
