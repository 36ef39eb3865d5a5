"""The manifest schema: every error names file, line and dotted key; overrides pass the same checks."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import server.manifest as sm
from server.manifest import (
    EmulatedLatency,
    Manifest,
    ManifestError,
    add_cli_arguments,
    load_manifest,
    overrides_from_args,
)
from wire.tensors import Limits

ROOT = Path(__file__).parents[2]


@pytest.fixture
def ckpt(tmp_path) -> Path:
    """A checkpoint directory as the manifest sees it (the manifest never loads the weights)."""
    d = tmp_path / "reacher_v2"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"type": "flow_matching", "chunk_size": 30, "execution_horizon": 8}))
    return d


def base(ckpt: Path) -> str:
    """Four lines; cases append from line 5."""
    return f"model:\n  repo_or_path: {ckpt}\nzenoh:\n  connect_endpoints: [tcp/127.0.0.1:7447]\n"


def write(tmp_path: Path, text: str, name: str = "m.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# (id, text appended to the 4-line base, line, dotted key, words in the message)
BAD_APPENDED = [
    ("unknown key", "max_sesions: 3\n", 5, "max_sesions", "unknown key; did you mean max_sessions?"),
    ("key of another section", "strategy: round_robin\n", 5, "strategy", "did you mean scheduling.strategy?"),
    (
        "bad choice",
        "scheduling:\n  overflow_policy: drop_all\n",
        6,
        "scheduling.overflow_policy",
        "'drop_all' is not one of drop_oldest, drop_newest, reject; pick one of them",
    ),
    ("unknown scheduler", "scheduling:\n  strategy: fastest\n", 6, "scheduling.strategy", "round_robin"),
    (
        "scoring without a scored strategy",
        "scheduling:\n  scoring: deadline\n",
        6,
        "scheduling.scoring",
        "takes no scoring function",
    ),
    ("batch too large", "scheduling:\n  max_batch: 2000\n", 6, "scheduling.max_batch", "2000 is outside [1, 1024]"),
    (
        "legacy dispatch",
        "scheduling:\n  pipeline_dispatch: {enabled: false}\n",
        6,
        "scheduling.pipeline_dispatch.enabled",
        "not implemented",
    ),
    ("range", "max_sessions: 0\n", 5, "max_sessions", "0 is outside"),
    ("int type", "max_sessions: eight\n", 5, "max_sessions", "must be an integer"),
    ("float for int", "warmup_inferences: 2.5\n", 5, "warmup_inferences", "must be an integer"),
    ("bool type", "pin_task: 'yes'\n", 5, "pin_task", "must be true or false"),
    ("string type", "default_task: 3\n", 5, "default_task", "must be a string"),
    ("null not allowed", "max_sessions: null\n", 5, "max_sessions", "may not be null"),
    ("serving mode", "serving_mode: pooled\n", 5, "serving_mode", "is not one of shared, exclusive"),
    (
        "emulated distribution",
        "emulated_latency: {distribution: gamma}\n",
        5,
        "emulated_latency.distribution",
        "distribution 'gamma' is not one of fixed, normal, lognormal, uniform",
    ),
    ("emulated type", "emulated_latency: fast\n", 5, "emulated_latency", "must be a number of ms or a mapping"),
    ("emulated negative", "emulated_latency: -3\n", 5, "emulated_latency.mean_ms", "is outside"),
    (
        "emulated min above max",
        "emulated_latency:\n  mean_ms: 5\n  min_ms: 10\n  max_ms: 3\n",
        7,
        "emulated_latency.min_ms",
        "above max_ms",
    ),
    (
        "emulated unknown key",
        "emulated_latency: {mean_ms: 5, sede: 1}\n",
        5,
        "emulated_latency.sede",
        "did you mean emulated_latency.seed?",
    ),
    ("model id with a slash", "model_id: arm/left\n", 5, "model_id", "rename it"),
    ("replica id verbatim", "replica_id: '@r0'\n", 5, "replica_id", "may not start with '@'"),
    ("root without @", "root: fleet\n", 5, "root", "starting with '@'"),
    (
        "horizon beyond chunk",
        "execution_horizon: 40\n",
        5,
        "execution_horizon",
        "exceeds the checkpoint's chunk_size 30",
    ),
    ("trained fps zero", "trained_fps: 0\n", 5, "trained_fps", "give a value > 0"),
    ("health port", "health_port: 70000\n", 5, "health_port", "outside [-1, 65535]"),
    ("log level", "log_level: verbose\n", 5, "log_level", "is not one of DEBUG, INFO, WARNING, ERROR"),
    ("capture max", "debug:\n  capture_max: 0\n", 6, "debug.capture_max", "outside"),
    ("limits", "limits:\n  max_message_bytes: 10\n", 6, "limits.max_message_bytes", "outside"),
    ("cadence alpha", "response_tracking:\n  cadence_alpha: 1.5\n", 6, "response_tracking.cadence_alpha", "outside"),
    (
        "model inflight",
        "models:\n  known:\n    arm: {max_inflight: 0}\n",
        7,
        "models.known.arm.max_inflight",
        "outside",
    ),
    ("model id key", "models:\n  known:\n    'a*b': {max_inflight: 2}\n", 7, "models.known.a*b", "rename it"),
    ("duplicate client", "clients:\n  known:\n    - {id: a}\n    - {id: a}\n", 6, "clients.known", "listed twice"),
    (
        "client priority",
        "clients:\n  known:\n    - {id: a}\n    - {id: b, priority: -1}\n",
        8,
        "clients.known[1].priority",
        "outside",
    ),
    ("client unknown key", "clients:\n  known:\n    - {id: a, name: arm}\n", 7, "clients.known[0].name", "unknown key"),
    ("client without id", "clients:\n  known:\n    - {priority: 1}\n", 7, "clients.known[0].id", "is required"),
    ("nobody accepted", "clients:\n  accept_unknown: false\n", 6, "clients.accept_unknown", "refuses every client"),
    ("section not a mapping", "drain: 5\n", 5, "drain", "must be a mapping of timeout_s"),
    ("duplicate key is YAML", "max_sessions: 3\nmax_sessions: 4\n", 6, "", "duplicate key 'max_sessions'"),
]


@pytest.mark.parametrize("name,extra,line,key,words", BAD_APPENDED, ids=[b[0] for b in BAD_APPENDED])
def test_bad_values_name_the_file_line_key_and_fix(tmp_path, ckpt, name, extra, line, key, words):
    path = write(tmp_path, base(ckpt) + extra)
    with pytest.raises(ManifestError) as err:
        load_manifest(path)
    text = str(err.value)
    assert text.startswith(f"{path}:{line}: " + (f"{key}: " if key else "")), text
    assert words in text, text
    assert err.value.line == line and err.value.key == key


def _model_cases(tmp_path: Path, ckpt: Path):
    exists = tmp_path / "ca.pem"  # the test writes it
    ep = "zenoh:\n  connect_endpoints: [tcp/127.0.0.1:7447]\n"
    return [
        # (id, text, line, key, words)
        (
            "hub id",
            f"{ep}model:\n  repo_or_path: lerobot/pi0\n",
            4,
            "model.repo_or_path",
            "Weights load only from local paths: download it first",
        ),
        (
            "missing directory",
            f"{ep}model:\n  repo_or_path: {tmp_path}/nope/ckpt\n",
            4,
            "model.repo_or_path",
            "does not exist",
        ),
        ("a file, not a directory", f"{ep}model:\n  repo_or_path: {exists}\n", 4, "model.repo_or_path", "is a file"),
        ("required key", f"{ep}model:\n  dtype: float32\n", 3, "model.repo_or_path", "is required"),
        (
            "dtype",
            f"{base(ckpt)}".replace("model:\n", "model:\n  dtype: int8\n"),
            2,
            "model.dtype",
            "'int8' is not one of float32, bfloat16, float16",
        ),
        (
            "device word",
            base(ckpt).replace("model:\n", "model:\n  device: tpu\n"),
            2,
            "model.device",
            "use cpu, cuda or cuda:N",
        ),
        (
            "revision as a number",
            base(ckpt).replace("model:\n", "model:\n  revision: 1.0\n"),
            2,
            "model.revision",
            "must be a string, got 1.0 (a number); quote it",
        ),
        (
            "endpoint without protocol",
            f"model:\n  repo_or_path: {ckpt}\nzenoh:\n  connect_endpoints:\n    - tcp/a:1\n    - 127.0.0.1:7447\n",
            6,
            "zenoh.connect_endpoints[1]",
            "write it as protocol/address, e.g. tcp/127.0.0.1:7447",
        ),
        (
            "no endpoints",
            f"model:\n  repo_or_path: {ckpt}\nzenoh:\n  connect_endpoints: []\n",
            4,
            "zenoh.connect_endpoints",
            "at least one router endpoint",
        ),
        (
            "tls file missing",
            base(ckpt) + f"  tls:\n    root_ca_certificate: {tmp_path}/missing.pem\n",
            6,
            "zenoh.tls.root_ca_certificate",
            "does not exist",
        ),
        (
            "certificate without key",
            base(ckpt) + f"  tls:\n    root_ca_certificate: {exists}\n    connect_certificate: {exists}\n",
            5,
            "zenoh.tls.connect_private_key",
            "needs both",
        ),
        (
            "tls endpoint without CA",
            f"model:\n  repo_or_path: {ckpt}\nzenoh:\n  connect_endpoints: [tls/r:7447]\n",
            3,
            "zenoh.tls",
            "needs zenoh.tls.root_ca_certificate",
        ),
        ("audit path is a directory", base(ckpt) + f"audit_path: {tmp_path}\n", 5, "audit_path", "is a directory"),
        (
            "capture dir is a file",
            base(ckpt) + f"debug: {{capture_dir: {exists}}}\n",
            5,
            "debug.capture_dir",
            "is a file",
        ),
        ("yaml syntax", "model:\n  repo_or_path: x\n   bad: indent\n", 3, "", "not valid YAML"),
        ("tab", "model:\n\trepo_or_path: x\n", 2, "", "not valid YAML"),
        ("top level list", "- a\n- b\n", 1, "", "must be a YAML mapping"),
    ]


CASE_IDS = [c[0] for c in _model_cases(Path("/x"), Path("/x/c"))]


@pytest.mark.parametrize("case", CASE_IDS)
def test_model_zenoh_files_and_syntax_errors_name_the_line(tmp_path, ckpt, case):
    (tmp_path / "ca.pem").write_text("x")
    _, text, line, key, words = next(c for c in _model_cases(tmp_path, ckpt) if c[0] == case)
    path = write(tmp_path, text)
    with pytest.raises(ManifestError) as err:
        load_manifest(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}:{line}: " + (f"{key}: " if key else "")), msg
    assert words in msg, msg


def test_missing_sections_and_empty_files_are_errors(tmp_path, ckpt):
    with pytest.raises(ManifestError, match=r"m\.yaml: model\.repo_or_path: is required"):
        load_manifest(write(tmp_path, "zenoh:\n  connect_endpoints: [tcp/a:1]\n"))
    with pytest.raises(ManifestError, match=r"zenoh\.connect_endpoints: is required"):
        load_manifest(write(tmp_path, f"model: {{repo_or_path: {ckpt}}}\n"))
    for text in ("", "# only a comment\n"):
        with pytest.raises(ManifestError, match="the manifest is empty; start from examples/manifests/minimal.yaml"):
            load_manifest(write(tmp_path, text, "e.yaml"))
    with pytest.raises(ManifestError, match="cannot read the manifest"):
        load_manifest(tmp_path / "absent.yaml")


def test_cuda_device_is_checked_against_what_torch_sees(tmp_path, ckpt, monkeypatch):
    path = write(tmp_path, base(ckpt).replace("model:\n", "model:\n  device: cuda:1\n"))
    monkeypatch.setattr(sm.checks, "_cuda_device_count", lambda: 0)
    with pytest.raises(ManifestError, match=r"m\.yaml:2: model\.device: 'cuda:1' but this torch has no CUDA"):
        load_manifest(path)
    monkeypatch.setattr(sm.checks, "_cuda_device_count", lambda: 1)
    with pytest.raises(ManifestError, match=r"torch sees 1 CUDA device\(s\); use cuda:0\.\.cuda:0"):
        load_manifest(path)
    monkeypatch.setattr(sm.checks, "_cuda_device_count", lambda: 2)
    assert load_manifest(path).model.device == "cuda:1"


# ---- defaults and derived values -------------------------------------------------------------------------------


def test_defaults_are_complete_and_round_trip(tmp_path, ckpt):
    m = load_manifest(write(tmp_path, base(ckpt)))
    d = m.to_dict()
    assert d["scheduling"] == {
        "strategy": "round_robin",
        "scoring": None,
        "max_queue_size": 500,
        "request_ttl_ms": 5000.0,
        "overflow_policy": "drop_oldest",
        "max_retries": 0,
        "max_batch": 1,
        "batch_window_ms": 2.0,
        "pipeline_dispatch": {"enabled": True},
    }
    assert d["max_sessions"] == 8 and d["drain"]["timeout_s"] == 10.0 and d["health_port"] == 0
    assert d["zenoh"]["connect_endpoints"] == ["tcp/127.0.0.1:7447"] and d["zenoh"]["lease_ms"] == 1000
    assert Manifest.from_dict(d) == m and Manifest.from_dict(d).to_dict() == d
    assert load_manifest(write(tmp_path, m.to_yaml(), "again.yaml")) == m
    assert json.loads(json.dumps(d)) == d  # plain data all the way down


def test_derived_defaults_come_from_the_checkpoint_directory(tmp_path, ckpt):
    m = load_manifest(write(tmp_path, base(ckpt)))
    assert (m.model_id, m.model.revision, m.execution_horizon) == ("reacher_v2", "main", 8)
    (ckpt / "config.json").write_text(json.dumps({"revision": "v1.2", "chunk_size": 30}))
    m = load_manifest(write(tmp_path, base(ckpt) + "model_id: arm\nexecution_horizon: 12\n"))
    assert (m.model_id, m.model.revision, m.execution_horizon) == ("arm", "v1.2", 12)
    (ckpt / "config.json").unlink()
    m = load_manifest(write(tmp_path, base(ckpt)))
    assert m.execution_horizon == sm.DEFAULT_EXECUTION_HORIZON and m.model.revision == "main"
    odd = tmp_path / "My Policy"
    odd.mkdir()
    assert (
        Manifest.from_dict({"model": {"repo_or_path": str(odd)}, "zenoh": {"connect_endpoints": ["tcp/a:1"]}}).model_id
        == "my-policy"
    )


def test_scalars_are_normalised(tmp_path, ckpt):
    text = base(ckpt) + "emulated_latency: 20\nlog_level: debug\nscheduling:\n  request_ttl_ms: 3000\n"
    m = load_manifest(write(tmp_path, text), ["zenoh.listen_endpoints=tcp/0.0.0.0:7448"])
    assert m.emulated_latency == EmulatedLatency(distribution="fixed", mean_ms=20.0)
    assert m.log_level == "DEBUG" and m.scheduling.request_ttl_ms == 3000.0
    assert isinstance(m.scheduling.request_ttl_ms, float) and m.zenoh.listen_endpoints == ("tcp/0.0.0.0:7448",)


def test_the_manifest_is_frozen(tmp_path, ckpt):
    m = load_manifest(write(tmp_path, base(ckpt)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.max_sessions = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.scheduling.max_batch = 3
    assert dataclasses.replace(m, max_sessions=3).max_sessions == 3


def test_from_dict_reports_the_source_without_lines(ckpt):
    with pytest.raises(ManifestError) as err:
        Manifest.from_dict(
            {
                "model": {"repo_or_path": str(ckpt)},
                "zenoh": {"connect_endpoints": ["tcp/a:1"]},
                "scheduling": {"max_batch": 0},
            },
            source="bench r0",
        )
    assert str(err.value).startswith("bench r0: scheduling.max_batch: 0 is outside")
    assert sm.manifest_from_dict == Manifest.from_dict


# ---- overrides ------------------------------------------------------------------------------------------------


def parse_flags(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser()
    add_cli_arguments(ap)
    return overrides_from_args(ap.parse_args(argv))


def test_overrides_win_in_order_file_then_flags_then_set(tmp_path, ckpt):
    path = write(tmp_path, base(ckpt) + "max_sessions: 4\nscheduling:\n  strategy: deadline_aware\n")
    assert load_manifest(path).max_sessions == 4
    assert load_manifest(path, {"max_sessions": 6}).max_sessions == 6
    assert load_manifest(path, ["max_sessions=6", "max_sessions=7"]).max_sessions == 7
    assert load_manifest(path, parse_flags(["--max-sessions", "5"])).max_sessions == 5
    assert load_manifest(path, parse_flags(["--set", "max_sessions=9", "--max-sessions", "5"])).max_sessions == 9
    m = load_manifest(path, {"scheduling": {"max_batch": 4}})  # a mapping merges into the file's section
    assert (m.scheduling.strategy, m.scheduling.max_batch) == ("deadline_aware", 4)


def test_every_flag_maps_to_its_key(tmp_path, ckpt):
    other = tmp_path / "other_ckpt"
    other.mkdir()
    ov = parse_flags(
        [
            "--model-path",
            str(other),
            "--model-id",
            "arm",
            "--replica-id",
            "r7",
            "--max-sessions",
            "3",
            "--health-port",
            "-1",
            "--connect",
            "tcp/a:1",
            "--connect",
            "tcp/b:2",
            "--serving-mode",
            "exclusive",
            "--scheduler",
            "priority_tiered",
            "--max-batch",
            "8",
            "--emulated-latency-ms",
            "12.5",
            "--audit-path",
            str(tmp_path / "a.jsonl"),
            "--capture-dir",
            str(tmp_path / "cap"),
        ]
    )
    m = load_manifest(write(tmp_path, base(ckpt)), ov)
    assert m.model.repo_or_path == str(other) and (m.model_id, m.replica_id, m.max_sessions) == ("arm", "r7", 3)
    assert m.health_port == -1 and m.zenoh.connect_endpoints == ("tcp/a:1", "tcp/b:2")
    assert (m.serving_mode, m.scheduling.strategy, m.scheduling.max_batch) == ("exclusive", "priority_tiered", 8)
    assert m.emulated_latency.mean_ms == 12.5 and m.audit_path.endswith("a.jsonl")
    assert m.debug.capture_dir.endswith("cap")
    assert parse_flags([]) == {}


def test_overrides_pass_the_same_checks_and_say_they_are_overrides(tmp_path, ckpt):
    path = write(tmp_path, base(ckpt) + "emulated_latency: 20\n")
    cases = [
        (["scheduling.max_batch=0"], "scheduling.max_batch: 0 is outside"),
        (["scheduling.max_bacth=4"], "scheduling.max_bacth: unknown key; did you mean scheduling.max_batch?"),
        (parse_flags(["--scheduler", "fastest"]), "scheduling.strategy: 'fastest' is not one of"),
        (parse_flags(["--model-path", "lerobot/pi0"]), "Weights load only from local paths"),
        (["emulated_latency.std_ms=1"], "emulated_latency: is 20 (an integer), not a mapping"),
        (["zenoh.connect_endpoints=localhost:7447"], "zenoh.connect_endpoints[0]: 'localhost:7447' is not a Zenoh"),
        (
            ["zenoh.connect_endpoints=tcp/a"],
            "zenoh.connect_endpoints[0]: 'tcp/a' is not a Zenoh endpoint: tcp needs host:port",
        ),  # wire.transport.endpoint_problem, the edge's rule too
        (["zenoh.connect_endpoints=tcp/a:0"], "a port from 1 to 65535"),  # no router listens on port 0
    ]
    for overrides, words in cases:
        with pytest.raises(ManifestError) as err:
            load_manifest(path, overrides)
        assert str(err.value).startswith(f"{path} (override): ") and words in str(err.value), str(err.value)
        assert err.value.line == sm.OVERRIDE
    with pytest.raises(ManifestError, match="is not KEY=VALUE"):
        load_manifest(path, ["max_sessions"])
    # a server may listen on any free port (port 0), as Zenoh allows
    assert load_manifest(path, ["zenoh.listen_endpoints=[tcp/127.0.0.1:0]"]).zenoh.listen_endpoints == (
        "tcp/127.0.0.1:0",
    )


def test_set_values_are_read_as_yaml(tmp_path, ckpt):
    path = write(tmp_path, base(ckpt) + f"audit_path: {tmp_path / 'a.jsonl'}\n")
    m = load_manifest(
        path,
        [
            "zenoh.connect_endpoints=[tcp/a:1, tcp/b:2]",
            "audit_path=null",
            "default_task=fold the towel",
            "emulated_latency={distribution: normal, mean_ms: 20, std_ms: 3}",
            "audit_path=",
        ],
    )
    assert m.zenoh.connect_endpoints == ("tcp/a:1", "tcp/b:2") and m.audit_path is None
    assert m.default_task == "fold the towel" and m.emulated_latency.std_ms == 3.0


# ---- contract with the rest of the tree --------------------------------------------------------------------


def test_limits_mirror_the_wire_decoder_limits(tmp_path, ckpt):
    m = load_manifest(write(tmp_path, base(ckpt) + "limits: {max_images: 4}\n"))
    assert set(vars(m.limits)) == set(Limits.__dataclass_fields__)
    assert Limits(**vars(m.limits)) == dataclasses.replace(Limits(), max_images=4)


def test_readers_in_the_server_get_plain_types(tmp_path, ckpt):
    m = load_manifest(
        write(tmp_path, base(ckpt) + "models: {known: {arm: {max_inflight: 2}}}\nclients: {allowlist: [robot-1]}\n")
    )
    assert isinstance(m.models.known, dict) and m.models.known["arm"].max_inflight == 2
    assert m.clients.allowlist == ("robot-1",) and m.get("max_sessions") == 8 and m.get("nope", 1) == 1
    emulated = load_manifest(write(tmp_path, base(ckpt) + "emulated_latency: {mean_ms: 5}\n")).emulated_latency
    # server.runtime.EmulatedLatency.from_manifest reads these attributes off a non-dict value
    assert all(
        hasattr(emulated, k) for k in ("distribution", "mean_ms", "std_ms", "min_ms", "max_ms", "per_batch_item_ms")
    )


def test_scheduler_choices_fall_back_when_the_registry_is_missing(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_scheduling(name, *a, **k):
        if name == "server.scheduling":
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_scheduling)
    assert sm._scheduler_names() == list(sm.FALLBACK_SCHEDULERS) and sm._scoring_names() is None


def test_docs_reference_matches_the_schema():
    # A fresh interpreter, as a user regenerates it: other tests register extra strategies in this one.
    generated = subprocess.run(
        [sys.executable, "-m", "server.manifest", "--doc"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert generated in (ROOT / "docs" / "manifest.md").read_text(), (
        "docs/manifest.md is stale: regenerate its table with `python -m server.manifest --doc`"
    )
    documented = {line.split("`")[1] for line in generated.splitlines()[2:]}
    assert "scheduling.overflow_policy" in documented and "zenoh.tls.root_ca_certificate" in documented


@pytest.mark.parametrize("name", ["minimal.yaml", "full.yaml"])
def test_shipped_example_manifests_load(name, monkeypatch):
    monkeypatch.chdir(ROOT)
    m = load_manifest(ROOT / "examples" / "manifests" / name)
    assert m.zenoh.connect_endpoints and m.model_id == "reacher"


def test_full_example_sets_every_section():
    raw = yaml.safe_load((ROOT / "examples" / "manifests" / "full.yaml").read_text())
    assert set(raw) >= {f.name for f in dataclasses.fields(Manifest)} - {"trained_fps", "torch_threads"}


# ---- JSON Schema for editors -----------------------------------------------------------------------------------


def test_json_schema_is_shipped_current_and_validates_the_examples():
    import jsonschema

    printed = subprocess.run(
        [sys.executable, "-m", "server.cli", "schema", "manifest"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    schema = json.loads(printed)
    assert schema == json.loads((ROOT / "docs" / "schemas" / "manifest.schema.json").read_text()), (
        "docs/schemas/manifest.schema.json is stale: policy-server schema manifest > docs/schemas/manifest.schema.json"
    )
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for name in ("minimal.yaml", "full.yaml"):
        data = yaml.safe_load((ROOT / "examples" / "manifests" / name).read_text())
        assert not list(validator.iter_errors(data)), name
    base_data = {"model": {"repo_or_path": "ckpt"}, "zenoh": {"connect_endpoints": "tcp/a:1"}, "emulated_latency": 20}
    assert validator.is_valid(base_data)
    for bad in (
        {"max_sesions": 3},
        {"scheduling": {"max_batch": 0}},
        {"serving_mode": "pooled"},
        {"clients": {"known": [{"id": "a", "name": "x"}]}},
    ):
        assert not validator.is_valid({**base_data, **bad}), bad
