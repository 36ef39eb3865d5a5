"""The scenario's fault timeline, wired to this run's processes, site proxies and shards.

    scenario `faults:` ──► chaos.timeline.run_timeline ──► LiveActuators
                                                            ├─ site:NAME    → the site's chaos proxy (on every
                                                            │                 node too: bench.run.mesh.SiteFanout)
                                                            ├─ server:ID    → that replica's process
                                                            ├─ router       → the router process (with per-node
                                                            │                 routers, all of them: bench.run.mesh)
                                                            ├─ router:hub   → the driver's router alone (with
                                                            │                 per-node routers the mesh carries on)
                                                            └─ robot:GROUP  → a message to the shards

The timeline's log is the run's `fault_log` (times in seconds after t=0, `t_end` None while a fault
holds): reports shade these windows and `recovered_within_s` measures from their ends.
"""

from __future__ import annotations

from pathlib import Path


def start_timeline(run):
    from chaos import profiles
    from chaos.faults import ManagedProcess
    from chaos.timeline import LiveActuators, run_timeline

    processes = {}
    for rid, info in run.servers.items():
        if hasattr(info["child"], "actor"):  # on a cluster node: the fault runs there (bench.run.cluster)
            from bench.run.cluster import RemoteManaged

            processes[f"server:{rid}"] = RemoteManaged(info["child"], f"server:{rid}")
        else:
            processes[f"server:{rid}"] = ManagedProcess(info["child"], name=f"server:{rid}", ready_timeout_s=info["start_s"])
    if run.router_child is not None:
        hub = processes["router:hub"] = processes["router"] = ManagedProcess(run.router_child, name="router",
                                                                             ready_timeout_s=15.0)
        if getattr(run, "mesh", None) is not None and run.mesh.nodes:  # per-node routers: `router` is all of them
            from bench.run.cluster import RemoteManaged
            from bench.run.mesh import AllRouters

            processes["router"] = AllRouters([hub, *(RemoteManaged(c, c.name) for c in run.mesh.routers())])
    site_toxics = {name: profiles.profile_toxics(site.profile, site.overrides) for name, site in run.s.sites.items()}

    def robot_fault(group: str, index: int | None, action: str) -> None:
        robots = [r["robot"] for r in run.robot_table
                  if r["group"] == group and (index is None or r["index"] == index)]
        run.control.broadcast({"type": "robot_fault", "robots": robots, "action": action})

    def manifest_for_checkpoint(target: str, checkpoint: str) -> str:
        """A manifest for `restart_with: {checkpoint}`: the replica's own, with another model."""
        import yaml

        from bench.scenario.schema import checkpoint_dir

        rid = target.split(":", 1)[1]
        replica = next(r for r in run.s.replicas if r.id == rid)
        manifest = run.manifest_for(replica)
        manifest["model"]["repo_or_path"] = str(checkpoint_dir(checkpoint))
        manifest["health_port"] = run.servers[rid]["health_port"]  # the scraper keeps its address
        manifest["audit_path"] = str(run.servers[rid]["audit"])
        path = Path(run.run_dir) / "manifests" / f"{rid}-{Path(str(checkpoint)).name}.yaml"
        path.write_text(yaml.safe_dump(manifest, sort_keys=False))
        return str(path)

    actuators = LiveActuators(run.chaos, processes, site_toxics, robot_fault, manifest_for_checkpoint,
                              real_toxiproxy=bool(getattr(run.proxy_server, "real_toxiproxy", False)))
    return run_timeline([dict(x) for x in run.s.faults], actuators, t0=run.state.t0_mono, log=run.fault_log)
