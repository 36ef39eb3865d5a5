"""Runs a scenario through the real runner with the proxy and servers stubbed out and fake engines.

Used by test_runner_lifecycle to exercise process ownership (start, barrier, stop, Ctrl-C) without
depending on the server and chaos packages. `python -m tests.bench.lifecycle_main RUN_DIR DURATION`
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from bench.run.procset import install_signal_handlers
from bench.run.runner import Run, SiteLink
from bench.scenario.schema import parse_scenario

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


def main() -> int:
    run_dir, duration = Path(sys.argv[1]), float(sys.argv[2])
    install_signal_handlers()
    s = parse_scenario(textwrap.dedent(SCENARIO.format(duration=duration)))
    Run.start_proxy = lambda self: setattr(self, "sites", {"lab": SiteLink("lab", "tcp/127.0.0.1:9")})
    Run.start_servers = lambda self: None
    outcome = Run(s, run_dir, progress=False, engine_factory="tests.bench.fake_engine:make").execute()
    print(f"verdict {outcome.verdict}", flush=True)
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
