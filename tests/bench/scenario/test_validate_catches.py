"""`bench validate` refuses what `bench run` would refuse, before any process starts, with file:line,
the key and what to do: one test per case the twin evaluation found (shared/notes/twin-evaluation-2026-11.md,
"Friction in the scenario language"), each of which validate used to pass or word badly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench.cli import main
from bench.scenario.load import SCENARIOS_DIR

ROOT = Path(__file__).resolve().parents[3]

BASE = """\
name: t
duration_s: 10
fleet:
  groups:
    - name: g
      robot: reacher
      count: 2
      site: lab
      engine:
        buffer_time_s: 0.5
sites:
  lab: {profile: lan}
servers:
  replicas:
    - {id: r0, checkpoint: reacher}
assertions:
  - dead_robots == 0
"""


def validate(tmp_path: Path, text: str, capsys) -> tuple[int, str]:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    rc = main(["validate", str(path)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err.replace(str(path), "s.yaml")


CASES = [
    # (id, the base with one change, line, key, words)
    (
        "fallback holdd",
        BASE.replace("buffer_time_s: 0.5", "fallback: holdd"),
        10,
        "fleet.groups[0].engine.fallback",
        "did you mean 'hold'",
    ),
    (
        "profile override bandwidth.rat",
        BASE.replace("lab: {profile: lan}", "lab:\n    profile: lan\n    overrides: {bandwidth.rat: 250}"),
        14,
        "sites.lab.overrides.bandwidth.rat",
        "unknown attribute bandwidth.rat (did you mean 'rate'?)",
    ),
    (
        "horizon 0 with a shadow engine",
        BASE.replace("buffer_time_s: 0.5", "execution_horizon: 0\n      shadow: {engine: rtc}"),
        10,
        "fleet.groups[0].engine.execution_horizon",
        "the shadow engine (rtc, local) refuses it",
    ),
    (
        "site shorthand with a bad profile",
        BASE.replace("lab: {profile: lan}", "lab: wan50"),
        12,
        "sites.lab.profile",
        "unknown network profile 'wan50' (did you mean 'wan_50ms'?)",
    ),
    (
        "misspelt checkpoint",
        BASE.replace("checkpoint: reacher}", "checkpoint: reacherr}"),
        15,
        "servers.replicas[0].checkpoint",
        "bench train --robot reacher",
    ),
    (
        "missing checkpoint with a matching model id",
        BASE.replace("checkpoint: reacher}", "checkpoint: reacher_v9, model_id: reacher}"),
        15,
        "servers.replicas[0].checkpoint",
        "is missing",
    ),
    (
        "rtc for rtc_enabled",
        BASE.replace("buffer_time_s: 0.5", "rtc: false"),
        10,
        "fleet.groups[0].engine.rtc",
        "not a RemoteEngineConfig field (did you mean 'rtc_enabled'?)",
    ),
    (
        "fixed_delay_steps is not an engine field",
        BASE.replace("buffer_time_s: 0.5", "fixed_delay_steps: 2"),
        10,
        "fleet.groups[0].engine.fixed_delay_steps",
        "not a RemoteEngineConfig field",
    ),
    (
        "engine value the engine refuses",
        BASE.replace("buffer_time_s: 0.5", "reconnect_initial_backoff_s: 5\n        reconnect_max_backoff_s: 1"),
        11,
        "fleet.groups[0].engine.reconnect_max_backoff_s",
        "must be >= reconnect_initial_backoff_s",
    ),
    (
        "engine type",
        BASE.replace("buffer_time_s: 0.5", "buffer_time_s: soon"),
        10,
        "fleet.groups[0].engine.buffer_time_s",
        "must be a number",
    ),
    (
        "assertion with a unit",
        BASE.replace("dead_robots == 0", "p99(rtt_ms) < 5ms"),
        17,
        "assertions[0]",
        "units are not written: write 5 instead of 5ms",
    ),
    (
        "assertion with a spaced unit",
        BASE.replace("dead_robots == 0", "duration_s > 2 s"),
        17,
        "assertions[0]",
        "units are not written",
    ),
    (
        "group key typo",
        BASE.replace("count: 2", "count: 2\n      stagger_episode: true"),
        8,
        "fleet.groups[0].stagger_episode",
        "did you mean 'stagger_episodes'",
    ),
    (
        "robot type typo",
        BASE.replace("robot: reacher", "robot: reachr"),
        6,
        "fleet.groups[0].robot",
        "did you mean 'reacher'",
    ),
    (
        "cluster routers word",
        BASE + "cluster: {routers: each_node}\n",
        18,
        "cluster.routers",
        "'each_node' is not one of per_node, driver; pick one of them (did you mean 'per_node'?)",
    ),
    # a satellite link with 100 ms more each way (2 x (400 + 10) ms) against the default 1 s lease: no robot would get
    # a session (the plain satellite profile's 620 ms passes: 1.5 x 620 = 930)
    (
        "default lease on a slower satellite link",
        BASE.replace("lab: {profile: lan}", "lab:\n    profile: satellite\n    overrides: {latency.latency: 400}"),
        9,
        "fleet.groups[0].engine",
        "lease_ms 1000 (the default) is under 1.5 x the worst round trip of site 'lab' (satellite: 820 ms)",
    ),
    (
        "lease under a slow link's round trip",
        BASE.replace("buffer_time_s: 0.5", "lease_ms: 2000").replace(
            "lab: {profile: lan}", "lab:\n    profile: lan\n    overrides: {latency.latency: 1500}"
        ),
        10,
        "fleet.groups[0].engine.lease_ms",
        "set engine.lease_ms >= 4500",
    ),
    # YAML 1.1 (PyYAML) reads an exponent without a dot and a sign as text: the message says so and how to write it
    (
        "an integer in scientific notation",
        BASE.replace("count: 2", "count: 2e0"),
        7,
        "fleet.groups[0].count",
        "must be an integer, got '2e0' (a string); give a positive integer; YAML reads 2e0 as text: write it out (2)",
    ),
    (
        "a number in scientific notation",
        BASE.replace("duration_s: 10", "duration_s: 1e1"),
        2,
        "duration_s",
        "YAML reads 1e1 as text: write it with a dot and a signed exponent (1.0e+1)",
    ),
    (
        "an engine number in scientific notation",
        BASE.replace("buffer_time_s: 0.5", "buffer_time_s: 5e-1"),
        10,
        "fleet.groups[0].engine.buffer_time_s",
        "write it with a dot and a signed exponent (5.0e-1)",
    ),
    # a sweep's values: every run checked as the sweep builds it (a bad one was a traceback, exit 1, when its run came)
    (
        "a sweep value the run refuses",
        BASE + "sweep: {key: fleet.groups.g.count, values: [2, 0]}\n",
        18,
        "sweep.values[1]",
        "with fleet.groups.g.count = 0: fleet.groups[0].count: 0 is outside (0, inf)",
    ),
    (
        "a sweep value given twice",
        BASE + "sweep: {key: fleet.groups.g.count, values: [2, 3, 2]}\n",
        18,
        "sweep.values[2]",
        "2 is given twice: each value is one run, named after it",
    ),
    (
        "capacity steps out of order",
        BASE + "sweep: {key: fleet.groups.g.count, values: [4, 2], mode: capacity}\n",
        18,
        "sweep.values[1]",
        "2 after 4: a capacity sweep's steps increase (its knee is the last step held before the "
        "first that failed); sort them: [2, 4]",
    ),
    # the runner judges sweep assertions against a capacity sweep's knee only: in runs mode they were skipped silently
    (
        "sweep assertions outside capacity mode",
        BASE + "sweep: {key: fleet.groups.g.count, values: [2, 3], assertions: ['knee >= 2']}\n",
        18,
        "sweep.assertions",
        "sweep assertions are judged only with mode: capacity (this sweep's mode is 'runs'); set mode: capacity",
    ),
    # a replica restarted with another model: its checkpoint or manifest found before the run, not by the restart
    (
        "restart_with a missing checkpoint",
        BASE + "faults:\n  - {at: 2, target: server:r0, action: restart_with, checkpoint: reacher_v9}\n",
        19,
        "faults[0].checkpoint",
        "checkpoint 'reacher_v9' is missing",
    ),
    (
        "restart_with a missing manifest",
        BASE + "faults:\n  - {at: 2, target: server:r0, action: restart_with, manifest: no/such/manifest.yaml}\n",
        19,
        "faults[0].manifest",
        "manifest 'no/such/manifest.yaml' is not a file (relative paths start at",
    ),
    # the replicas' manifests as the run merges them, checked by the server's own schema (a bad key or value ended
    # the replica before ready, mid-start)
    (
        "a manifest key the server does not know",
        BASE.replace("servers:\n", "servers:\n  manifest: {scheduling: {max_btch: 4}}\n"),
        14,
        "servers.replicas[r0]",
        "servers.manifest: scheduling.max_btch: unknown key; did you mean scheduling.max_batch?",
    ),
    (
        "a replica's manifest value the server refuses",
        BASE.replace("checkpoint: reacher}", "checkpoint: reacher, manifest: {session.gc_grace_s: -1}}"),
        15,
        "servers.replicas[r0]",
        "its manifest: session.gc_grace_s: -1 is outside [0, 3600]",
    ),
    (
        "a sweep over a checkpoint one of whose values is missing",
        BASE + "sweep: {key: servers.replicas.r0.checkpoint, values: [reacher, reacher_v9]}\n",
        18,
        "sweep.values[1]",
        "with servers.replicas.r0.checkpoint = 'reacher_v9': servers.replicas[0].checkpoint: checkpoint 'reacher_v9' is "
        "missing",
    ),
    (
        "a formula outside capacity mode",
        BASE + "sweep: {key: fleet.groups.g.count, values: [2, 3], formula: {t_ms: 20}}\n",
        18,
        "sweep.formula",
        "the formula is compared with a capacity sweep's knee only (this sweep's mode is 'runs')",
    ),
    (
        "a list that must not be empty",
        BASE.replace("  replicas:\n    - {id: r0, checkpoint: reacher}\n", "  replicas: []\n"),
        14,
        "servers.replicas",
        "needs at least 1 item, got 0",
    ),
    (
        "a camera named twice",
        BASE.replace("site: lab\n", "site: lab\n      cameras: {names: [front, wrist, front]}\n"),
        9,
        "fleet.groups[0].cameras.names",
        "'front' given more than once; each camera needs its own name",
    ),
]


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_validate_refuses_with_file_line_key_and_fix(tmp_path, capsys, case):
    _, text, line, key, words = next(c for c in CASES if c[0] == case)
    rc, err = validate(tmp_path, text, capsys)
    assert rc == 2, err
    assert err.startswith(f"INVALID s.yaml:{line}: {key}: "), err
    assert words in err, err


def test_the_base_validates_and_run_refuses_exactly_what_validate_does(tmp_path, capsys):
    assert validate(tmp_path, BASE, capsys)[0] == 0
    # a lease over 1.5 x the satellite round trip is fine (scenarios/satellite.yaml sets 3000)
    sat = BASE.replace("lab: {profile: lan}", "lab: {profile: satellite}").replace(
        "buffer_time_s: 0.5", "lease_ms: 930"
    )
    assert validate(tmp_path, sat, capsys)[0] == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(BASE.replace("buffer_time_s: 0.5", "fallback: holdd"))
    assert main(["run", str(bad), "--reports", str(tmp_path / "reports")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bench: invalid scenario: {bad}:10: fleet.groups[0].engine.fallback: ")
    assert not (tmp_path / "reports").exists()  # refused before anything started


def test_a_reports_root_that_cannot_be_written_is_refused_before_the_run(tmp_path, capsys):
    """`--reports` under a file: exit 2 naming it, before any process (it was a traceback and exit 1, a failed
    system's code, from the run's first mkdir); `--check` says the same, and a root still to be made is fine."""
    path = tmp_path / "s.yaml"
    path.write_text(BASE)
    (tmp_path / "a-file").write_text("")
    for extra in ([], ["--check"]):
        assert main(["run", str(path), "--reports", str(tmp_path / "a-file" / "reports"), *extra]) == 2
        err = capsys.readouterr().err
        assert f"bench: reports: cannot write under '{tmp_path / 'a-file' / 'reports'}'" in err, err
        assert "a-file is a file); give --reports a directory you can write" in err and "Traceback" not in err
    assert main(["run", str(path), "--reports", str(tmp_path / "new" / "reports"), "--check"]) == 0
    assert not (tmp_path / "new").exists() and not list(tmp_path.glob("**/.bench-write-check-*"))


def test_set_overrides_pass_the_same_checks(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(BASE)
    assert main(["validate", str(path), "--set", "fleet.groups.0.engine.fallback=holdd"]) == 2
    assert "fleet.groups[0].engine.fallback" in capsys.readouterr().err


# ---- the JSON Schema editors use ---------------------------------------------------------------------------------


def _schema() -> dict:
    printed = subprocess.run(
        [sys.executable, "-m", "bench.cli", "schema", "scenario"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return json.loads(printed)


def test_the_json_schema_validates_every_shipped_scenario_and_rejects_unknown_keys():
    import jsonschema

    schema = _schema()
    assert schema == json.loads((ROOT / "docs" / "schemas" / "scenario.schema.json").read_text()), (
        "docs/schemas/scenario.schema.json is stale: bench schema scenario > docs/schemas/scenario.schema.json"
    )
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    shipped = sorted(SCENARIOS_DIR.glob("**/*.yaml"))
    assert len(shipped) >= 10
    for path in shipped:
        errors = [e.message for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
        assert not errors, f"{path}: {errors}"
    base = yaml.safe_load(BASE)
    assert validator.is_valid(base)
    for change in ({"duraton_s": 5}, {"sites": {"lab": "dialup"}}, {"security": "tls"}):
        assert not validator.is_valid({**base, **change}), change
    group = base["fleet"]["groups"][0]
    for bad in ({"cuont": 2}, {"engine": {"rtc": False}}, {"engine": {"fallback": "holdd"}}, {"count": 0}):
        assert not validator.is_valid({**base, "fleet": {"groups": [{**group, **bad}]}}), bad


def _with_late_replica(extra: str = "", start_at: float = 4) -> str:
    return (
        BASE.replace(
            "    - {id: r0, checkpoint: reacher}\n",
            f"    - {{id: r0, checkpoint: reacher}}\n    - {{id: r1, checkpoint: reacher, start_at: {start_at}}}\n",
        )
        + extra
    )


def test_a_replica_with_start_at_becomes_a_start_fault_and_its_misuses_are_refused(tmp_path, capsys):
    from bench.scenario.load import parse_scenario

    s = parse_scenario(_with_late_replica(), source="s.yaml", check_checkpoints=False)
    assert {"at": 4.0, "target": "server:r1", "action": "start"} in s.faults
    assert [r.start_at for r in s.replicas] == [None, 4.0]
    rc, err = validate(tmp_path, _with_late_replica(start_at=10), capsys)
    assert rc == 2 and "servers.replicas[1].start_at" in err and "not before the end of the run (10 s)" in err
    rc, err = validate(tmp_path, _with_late_replica("faults:\n  - {at: 2, target: server:r1, action: kill}\n"), capsys)
    assert rc == 2 and "server:r1 starts at 4 s (its start_at): a fault on it at 2 s finds no process" in err
    rc, err = validate(tmp_path, BASE + "faults:\n  - {at: 2, target: server:r0, action: start}\n", capsys)
    assert rc == 2 and "give the replica `start_at: 2`" in err
