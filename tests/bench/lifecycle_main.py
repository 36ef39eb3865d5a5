"""Runs a scenario through the real runner with the proxy and servers stubbed out and fake engines.

Used by test_runner_lifecycle to exercise process ownership (start, barrier, stop, Ctrl-C) without
depending on the server and chaos packages. `python -m tests.bench.lifecycle_main RUN_DIR DURATION [stall]`:
with `stall`, the host starves the shards during the measured window (SIGSTOP 80 ms of every 200),
as a saturated host would.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from bench.run.procset import install_signal_handlers
from bench.run.runner import Run, SiteLink
from bench.run.starters import STARTERS
from bench.run.state import RunState
from bench.scenario.load import parse_scenario

SCENARIO = """\
name: lifecycle
duration_s: {duration}
warmup_s: 1
fleet:
  shards: 2
  groups:
    - {{name: a, robot: reacher, count: 4, site: lab, cameras: {{kind: synthetic, height: 32, width: 32}}}}
sites: {{lab: lan}}
servers: {{replicas: [{{id: r0, checkpoint: reacher}}]}}
assertions:
  - dead_robots == 0
  - ticks > 50
  - group[a].none_ticks > 1000000
"""


def stall_shards(run: RunState) -> None:
    """A starved host: every shard gets no CPU for 80 ms of every 200 during the measured window."""
    import os
    import signal
    import threading
    import time

    def loop():
        while run.t0_mono is None or time.monotonic() < run.t0_mono:
            time.sleep(0.05)
        while time.monotonic() < run.end_mono - 0.3:
            pids = [c.pid for n, c in run.procs.children if n.startswith("shard:") and c.pid]
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            time.sleep(0.08)
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
            time.sleep(0.12)

    threading.Thread(target=loop, daemon=True).start()


def main() -> int:
    run_dir, duration = Path(sys.argv[1]), float(sys.argv[2])
    # Ctrl-C as in a terminal's foreground: a test suite started in the background by a non-interactive shell
    # (`... &`) starts every descendant with SIGINT ignored, and Python then installs no KeyboardInterrupt
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)
    install_signal_handlers()
    s = parse_scenario(textwrap.dedent(SCENARIO.format(duration=duration)))
    STARTERS["proxy"] = lambda run: setattr(run, "sites", {"lab": SiteLink("lab", "tcp/127.0.0.1:9")})
    STARTERS["server"] = lambda run: None
    run = Run(s, run_dir, progress=False, engine_factory="tests.bench.fake_engine:make")
    if sys.argv[3:] == ["stall"]:
        stall_shards(run.state)  # it waits for t = 0, which the run's measured window sets
    outcome = run.execute()
    print(f"verdict {outcome.verdict}", flush=True)
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
