"""The scheduling priority of a shard's threads: the control loop's raised as a robot's real-time loop
runs, and the ordinary one given back to the threads it starts."""

from __future__ import annotations

import os
import threading

from wire.procs import raise_priority

LOOP_FIFO_PRIORITY = 10  # SCHED_FIFO priority of the control loop thread, as a robot's real-time loop runs


def raise_loop_priority() -> str:
    """Run the calling thread (the control loop) as a real robot runs its loop: SCHED_FIFO when the host
    allows it, else nice -10, else unchanged. Returns which one took effect (reported in summary.json).

    On a loaded 2-core host the loop thread otherwise spends more time runnable-but-waiting for a core
    than running (measured: 28 % running, 39 % on the run queue), and that host lateness would hide what
    the network and the servers did. The loop sleeps between slots and its work is bounded (one slot of
    robots), and the kernel's RT throttling keeps 5 % of each second for everything else."""
    return raise_priority(os.environ.get("BENCH_LOOP_PRIORITY", "fifo"), LOOP_FIFO_PRIORITY, threading.get_native_id())


def normal_thread_priority() -> None:
    """Threads started by the loop thread inherit its policy: give them the ordinary one back."""
    try:
        os.sched_setscheduler(threading.get_native_id(), os.SCHED_OTHER, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 0)
    except (AttributeError, OSError):
        pass
