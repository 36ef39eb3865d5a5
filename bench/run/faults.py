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
holds): reports shade these windows and `recovered_within_s` measures from their ends. A replica or router that
exits while no fault holds it down gets an `unplanned_exit` window of its own there, open until it is back: the
system failing is the run's finding, not the bench erring.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.evidence.figures import UNPLANNED_EXIT
from bench.run.specs import manifest_for
from bench.run.state import RunState


def start_timeline(run: RunState):
    from chaos import profiles
    from chaos.faults import ManagedProcess
    from chaos.timeline import LiveActuators, run_timeline

    processes = {}
    for rid, info in run.servers.items():
        if hasattr(info["child"], "actor"):  # on a cluster node: the fault runs there (bench.run.cluster)
            from bench.run.cluster import RemoteManaged

            processes[f"server:{rid}"] = RemoteManaged(info["child"], f"server:{rid}")
        else:
            processes[f"server:{rid}"] = ManagedProcess(
                info["child"], name=f"server:{rid}", ready_timeout_s=info["start_s"]
            )
    if run.router_child is not None:
        hub = processes["router:hub"] = processes["router"] = ManagedProcess(
            run.router_child, name="router", ready_timeout_s=15.0
        )
        if run.mesh is not None and run.mesh.nodes:  # per-node routers: `router` is all of them
            from bench.run.cluster import RemoteManaged
            from bench.run.mesh import AllRouters

            processes["router"] = AllRouters([hub, *(RemoteManaged(c, c.name) for c in run.mesh.routers())])
    site_toxics = {name: profiles.profile_toxics(site.profile, site.overrides) for name, site in run.s.sites.items()}

    def robot_fault(group: str, index: int | None, action: str) -> None:
        robots = [r["robot"] for r in run.robot_table if r["group"] == group and (index is None or r["index"] == index)]
        run.control.broadcast({"type": "robot_fault", "robots": robots, "action": action})

    def manifest_for_checkpoint(target: str, checkpoint: str) -> str:
        """A manifest for `restart_with: {checkpoint}`: the replica's own, with another model."""
        import yaml

        from bench.scenario.load import checkpoint_dir

        rid = target.split(":", 1)[1]
        replica = next(r for r in run.s.replicas if r.id == rid)
        manifest = manifest_for(run, replica)
        manifest["model"]["repo_or_path"] = str(checkpoint_dir(checkpoint))
        manifest["health_port"] = run.servers[rid]["health_port"]  # the scraper keeps its address
        manifest["audit_path"] = str(run.servers[rid]["audit"])
        path = Path(run.run_dir) / "manifests" / f"{rid}-{Path(str(checkpoint)).name}.yaml"
        path.write_text(yaml.safe_dump(manifest, sort_keys=False))
        return str(path)

    actuators = LiveActuators(
        run.chaos,
        processes,
        site_toxics,
        robot_fault,
        manifest_for_checkpoint,
        real_toxiproxy=bool(getattr(run.proxy_server, "real_toxiproxy", False)),
    )
    return run_timeline([dict(x) for x in run.s.faults], actuators, t0=run.t0_mono, log=run.fault_log)


def exit_words(returncode: int | None) -> str:
    """How a local child ended, for a person: `exited with 3`, `killed by SIGSEGV (exit -11)`."""
    import signal

    if returncode is None or returncode >= 0:
        return f"exited with {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        return f"exited with {returncode}"
    why = " from outside the run (the kernel's OOM killer? see `dmesg`)" if name == "SIGKILL" else ""
    return f"killed by {name}{why} (exit {returncode})"


def is_system_process(name: str) -> bool:
    """A process of the system under test (a policy-server replica, a Zenoh router): its unplanned exit is a finding
    the run records and goes on through (figure `unplanned_exits`). The bench's own processes (shards, chaos
    proxies) and a lost cluster node are the bench failing: those end the run as an error."""
    return name.startswith(("server:", "router"))


def check_timeline(run: RunState) -> None:
    err = getattr(run.timeline, "error", None)
    if err and after_unplanned_exit(run):
        run.timeline.error = None  # its entry keeps the error; a later failure is judged afresh
        return
    if err:
        raise RuntimeError(f"fault timeline failed: {err}")


def after_unplanned_exit(run: RunState) -> bool:
    """Every failed fault acted on a process the system had already lost (an open `unplanned_exit` window on
    it, or on any router for `router`): a kill of a dead replica fails because the system failed first. That is
    the run's finding (`unplanned_exits`), not the bench erring."""
    down = set(open_exits(run))
    failed = [w for w in run.fault_log if w.get("error") and w.get("action") != UNPLANNED_EXIT]

    def lost(target: str) -> bool:
        if target == "router":
            return any(n.startswith("router") for n in down)
        return (target if target != "router:hub" else "router") in down

    return bool(failed) and all(lost(str(w.get("target"))) for w in failed)


def unplanned_exit(run: RunState, name: str, child, how: str) -> None:
    """A replica or router exited while no fault held it: an `unplanned_exit` window in the fault log, open
    until the process is back (a later `restart` fault) or the run ends."""
    exited = getattr(child, "exited_mono", None)  # when it exited, not when the runner's poll saw it
    t = round((exited or time.monotonic()) - (run.t0_mono or time.monotonic()), 3)
    log = Path(child.log_path)
    log = log.relative_to(run.run_dir) if log.is_relative_to(run.run_dir) else log
    run.fault_log.append(
        {
            "index": None,
            "target": name,
            "action": UNPLANNED_EXIT,
            "params": {},
            "at": t,
            "duration": None,
            "t_start": t,
            "t_end": None,
            "error": None,
            "detail": f"{how}; log {log}",
            "log_tail": child.tail(15),
        }
    )


def open_exits(run: RunState) -> dict[str, dict]:
    """Process name -> its `unplanned_exit` window still open (the process not back)."""
    return {w["target"]: w for w in run.fault_log if w.get("action") == UNPLANNED_EXIT and w.get("t_end") is None}


def back_up(run: RunState, name: str) -> None:
    """`name` runs again: its open `unplanned_exit` window (if any) ends now."""
    w = open_exits(run).get(name)
    if w is not None:
        w["t_end"] = round(time.monotonic() - (run.t0_mono or time.monotonic()), 3)


def held_down(run: RunState, name: str) -> bool:
    """A fault keeps replica or router `name` down on purpose: a window of it still open, or its last fault a
    `kill`/`term` with no duration (down for good). A `router` fault acts on every router (a node's too,
    bench.run.mesh), a `router:hub` fault on the driver's router (`router`) alone."""
    if run.phase == "stopping":
        return True
    targets = {name}
    if name.startswith("router"):
        targets = {"router", "router:hub"} if name == "router" else {"router"}
    planned = [w for w in run.fault_log if w.get("target") in targets and w.get("action") != UNPLANNED_EXIT]
    if any(w.get("t_end") is None for w in planned):
        return True
    return bool(planned) and planned[-1].get("action") in ("kill", "term") and planned[-1].get("duration") is None
