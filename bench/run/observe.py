"""What the runner watches while its children run: the shards' control messages (status, done, error), every
child's liveness (a replica or router that exited with no fault on it is a finding, bench.run.faults; any other
child that exited ends the run), and each child's clock offset from this runner's (bench.fleet.clock), written to
clock.json.

Invariant: a control message is handled where it is read (`next_message`, bench.run.drive), so the live state
(`run.statuses`, `run.done`, `run.errors`) never misses one that a wait consumed.
"""

from __future__ import annotations

import json
import math
import queue
import time

from bench.fleet import clock as clocks
from bench.run.faults import back_up, exit_words, held_down, is_system_process, open_exits, unplanned_exit
from bench.run.procset import is_local
from bench.run.state import RunState
from wire.procs import ChildProcess


def next_message(run: RunState, deadline: float, waiting_for: str) -> dict:
    """Next control message; raises if a shard died or the deadline passes."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"timed out waiting for {waiting_for}; see {run.logs}/shard-*.log")
        try:
            link, msg = run.control.messages.get(timeout=min(remaining, 0.5))
        except queue.Empty:
            check_children(run)
            continue
        handle(run, link, msg)
        return msg


def handle(run: RunState, link, msg: dict) -> None:
    kind = msg.get("type")
    shard = msg.get("shard", link.shard)
    if kind == "status":
        run.statuses[shard] = msg
    elif kind == "done":
        run.done[shard] = msg
        run.statuses[shard] = msg.get("status", run.statuses.get(shard, {}))
    elif kind == "error":
        run.errors.append(f"shard {shard}: {msg.get('error')}")
        raise RuntimeError(f"shard {shard} failed: {msg.get('error')}")


def check_children(run: RunState) -> None:
    for name, child in list(run.procs.children):
        if name.startswith("attacker:"):
            continue  # attackers end when their attacks are done
        if not isinstance(child, ChildProcess) or child.proc is None:
            continue
        if child.alive():
            back_up(run, name)
            continue
        if is_system_process(name) and held_down(run, name):
            continue
        if (
            name.startswith("shard:")
            and child.proc.returncode == 0
            and (
                name.split(":", 1)[1] in {str(k) for k in run.done}
                or time.monotonic() >= (run.end_mono or math.inf) - 1.0
            )
        ):
            continue  # finished: its loop ends at its last slot due before the end, maybe before we look
        if is_system_process(name) and name in open_exits(run):
            continue  # recorded once per exit
        how = child.exit_text() if hasattr(child, "exit_text") else exit_words(child.proc.returncode)
        if is_system_process(name) and not getattr(child, "lost", None):
            unplanned_exit(run, name, child, how)  # the system failed: the run goes on and shows what followed
            continue
        raise RuntimeError(f"{name} {how}; log {child.log_path}:\n{child.tail(15)}")


def measure_clocks(run: RunState, strict: bool = True, only: set[str] | None = None) -> dict[str, clocks.ClockOffset]:
    """Each shard's clock offset (ping/pong on its control link) and each replica's (a replica here shares this
    clock; one on a cluster node is timed through its actor); `only` these names when given. `strict`: a shard
    that does not answer is an error (its start barrier would be wrong); at the end it keeps its start
    measurement instead."""
    out: dict[str, clocks.ClockOffset] = {}
    for name, child in list(run.procs.children):
        if only is not None and name not in only:
            continue
        try:
            if name.startswith("shard:"):
                link = run.control.link(int(name.split(":", 1)[1])) if run.control is not None else None
                if link is None:
                    raise TimeoutError(f"{name} has no control link")
                offset = link.measure_clock(timeout_s=5.0 if strict else 1.0)
            elif name.startswith("server:"):
                measure = getattr(child, "measure_clock", None)
                offset = measure() if measure is not None else clocks.SAME_CLOCK
            else:
                continue
        except (TimeoutError, ProcessLookupError) as exc:
            if strict:
                raise RuntimeError(f"cannot measure {name}'s clock: {exc}") from None
            continue
        out[name] = clocks.settle(offset, is_local(child))
    return out


def measure_node_walls(run: RunState) -> dict[str, clocks.ClockOffset]:
    """Each cluster node's wall clock offset from this runner's, by node id, timed through one of its children's
    actors; a node on this host shares its wall clock (exactly 0). A node that does not answer is left out
    (the requests whose hops its clock would split are not split)."""
    out: dict[str, clocks.ClockOffset] = {}
    for name, child in list(run.procs.children):
        node_id = (getattr(child, "node", None) or {}).get("node_id")
        measure = getattr(child, "measure_wall_clock", None)
        if node_id:
            run.child_nodes[name] = node_id
        if not node_id or node_id in out or measure is None:
            continue
        try:
            out[node_id] = clocks.settle(measure(), is_local(child))
        except (TimeoutError, ProcessLookupError):
            continue
    return out


def write_clock_file(run: RunState) -> None:
    """clock.json: t = 0 on this runner's monotonic clock (records say t, servers' audit lines mono_ms: this
    joins them, bench incident) and every child's clock offset from it (bench.fleet.clock)."""
    (run.run_dir / "clock.json").write_text(
        json.dumps(
            {
                "t0_mono_ms": run.t0_mono * 1e3,
                "offsets": {n: o.to_json() for n, o in sorted(run.clocks.items())},
                **(
                    {"node_walls": {n: o.to_json() for n, o in sorted(run.node_walls.items())}}
                    if run.node_walls
                    else {}
                ),
            },
            indent=1,
        )
    )
