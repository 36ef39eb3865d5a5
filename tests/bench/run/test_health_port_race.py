"""A replica's health port is picked by the runner and bound by the replica seconds later (its torch import):
another process may take it in between, which must cost a new port, not a run that errors."""

from __future__ import annotations

import socket
import textwrap

import wire.procs as procs
from bench.run import specs
from bench.run.runner import Run
from bench.run.starters import start_servers
from bench.scenario.load import parse_scenario


def test_a_replicas_health_port_taken_before_it_binds_is_picked_again(tmp_path, monkeypatch):
    s = parse_scenario(
        textwrap.dedent("""\
        name: health_port_race
        duration_s: 1
        fleet: {groups: [{name: a, robot: reacher, count: 1, site: lab}]}
        sites: {lab: lan}
        servers: {replicas: [{id: r0, checkpoint: reacher}]}
    """)
    )
    run = Run(s, tmp_path, progress=False).state
    for d in (run.logs, run.rec_dir, run.run_dir / "manifests"):
        d.mkdir(parents=True, exist_ok=True)
    router, run.router_endpoint = procs.start_router(None, tmp_path / "router.log")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        picks = iter([taken.getsockname()[1]])  # the replica's first pick loses the race
        real_free_port = procs.free_port
        pick = lambda: next(picks, None) or real_free_port()  # noqa: E731
        monkeypatch.setattr(procs, "free_port", pick)
        monkeypatch.setattr(specs, "free_port", pick)  # the manifest's port is picked there
        try:
            start_servers(run)
            info = run.servers["r0"]
            assert info["child"].alive() and info["health_port"] != taken.getsockname()[1]
            assert "address already in use" in (run.logs / "server-r0.log").read_text().lower()
            assert f"health_port: {info['health_port']}" in info["manifest"].read_text()  # the scraper's address
        finally:
            for info in run.servers.values():
                info["child"].stop()
            router.stop()
