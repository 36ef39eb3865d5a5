"""`policy-server` as a process: --help, user errors without tracebacks, SIGTERM drain, manifests."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml

from server.manifest import ManifestError, load_manifest, manifest_from_dict
from tests.server.test_service import S, ckpt  # noqa: F401  (fixture reuse)
from tests.server.zclient import RawClient
from wire import DrainNotice, ReplicaKeys, SessionAck
from wire.procs import ChildProcess

CLI = [sys.executable, "-m", "server.cli"]


def run(args, timeout=60):
    return subprocess.run(CLI + args, capture_output=True, text=True, timeout=timeout)


def test_help_answers():
    out = run(["--help"])
    assert out.returncode == 0 and "--manifest" in out.stdout and "--max-batch" in out.stdout
    assert run(["replay", "--help"]).returncode == 0


def write(tmp_path, data, name="m.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data) if isinstance(data, dict) else data)
    return p


BAD = [
    ("unknown key", {"max_sesions": 3}, "max_sesions: unknown key; did you mean max_sessions?"),
    (
        "bad choice",
        {"scheduling": {"overflow_policy": "drop_all"}},
        "scheduling.overflow_policy: 'drop_all' is not one of",
    ),
    ("range", {"max_sessions": 0}, "max_sessions: 0 is outside"),
    ("type", {"pin_task": "yes"}, "pin_task: must be true or false"),
    ("hub id", {"model": {"repo_or_path": "lerobot/pi0"}}, "Weights load only from local paths"),
    ("emulated", {"emulated_latency": {"distribution": "gamma"}}, "distribution 'gamma' is not one of"),
]


@pytest.mark.parametrize("name,patch,words", BAD, ids=[b[0] for b in BAD])
def test_manifest_errors_name_the_key_and_line_without_a_traceback(tmp_path, ckpt, name, patch, words):  # noqa: F811
    data = {"model": {"repo_or_path": str(ckpt)}, "zenoh": {"connect_endpoints": ["tcp/127.0.0.1:1"]}}
    for k, v in patch.items():
        data[k] = {**data.get(k, {}), **v} if isinstance(v, dict) and isinstance(data.get(k), dict) else v
    path = write(tmp_path, data)
    out = run(["--manifest", str(path)])
    assert out.returncode == 2
    assert words in out.stderr
    assert f"{path}:" in out.stderr and "Traceback" not in out.stderr


def test_yaml_syntax_and_empty_files_are_user_errors(tmp_path):
    assert "not valid YAML" in run(["--manifest", str(write(tmp_path, "model: [\n"))]).stderr
    assert "empty" in run(["--manifest", str(write(tmp_path, "", "e.yaml"))]).stderr


def test_flags_and_set_override_with_the_same_checks(tmp_path, ckpt):  # noqa: F811
    path = write(tmp_path, {"model": {"repo_or_path": str(ckpt)}, "zenoh": {"connect_endpoints": ["tcp/127.0.0.1:1"]}})
    m = load_manifest(path, {"scheduling.max_batch": 8, "max_sessions": 3})
    assert m.scheduling.max_batch == 8 and m.max_sessions == 3
    with pytest.raises(ManifestError, match="scheduling.max_batch: 0 is outside"):
        load_manifest(path, ["scheduling.max_batch=0"])
    out = run(["--manifest", str(path), "--check", "--max-sessions", "5", "--set", "drain.timeout_s=3"])
    assert out.returncode == 0 and "checkpoint OK" in out.stdout


def test_defaults_are_complete_and_round_trip(ckpt):  # noqa: F811
    m = manifest_from_dict({"model": {"repo_or_path": str(ckpt)}, "zenoh": {"connect_endpoints": ["tcp/x:1"]}})
    d = m.to_dict()
    assert d["scheduling"]["strategy"] == "round_robin" and d["max_sessions"] == 8 and d["drain"]["timeout_s"] == 10.0
    assert manifest_from_dict(d).to_dict() == d


def test_an_unreachable_router_is_a_one_line_error(tmp_path, ckpt):  # noqa: F811
    from wire.procs import free_port

    path = write(
        tmp_path,
        {
            "model": {"repo_or_path": str(ckpt)},
            "warmup_inferences": 0,
            "zenoh": {"connect_endpoints": [f"tcp/127.0.0.1:{free_port()}"], "connect_timeout_s": 0.5},
        },
    )
    out = run(["--manifest", str(path)])
    assert out.returncode == 2 and "cannot reach a Zenoh router" in out.stderr and "Traceback" not in out.stderr
    assert "gave up after" in out.stderr and "connect_timeout_s" in out.stderr
    assert out.stderr.splitlines()[-1].startswith("policy-server: cannot reach"), "one prefix, not two"


def test_a_server_started_before_its_router_waits_for_it_and_serves(tmp_path, ckpt):  # noqa: F811
    """The restart path of a replica whose router is down or saturated: retry with backoff, never exit 2 on a
    refusal that clears before zenoh.connect_timeout_s (seen at 1,000 robots: the restarted replica exited)."""
    from wire.procs import free_port, start_router

    port = free_port()
    path = write(
        tmp_path,
        {
            "model": {"repo_or_path": str(ckpt)},
            "model_id": "arm",
            "warmup_inferences": 0,
            "zenoh": {"connect_endpoints": [f"tcp/127.0.0.1:{port}"], "connect_timeout_s": 60},
        },
    )
    server = ChildProcess(
        CLI + ["--manifest", str(path)], tmp_path / "server.log", name="server", ready_text="router not reachable yet"
    )
    server.start(timeout_s=60)  # it tried, was refused, and is still alive
    router = None
    try:
        router, endpoint = start_router(port, tmp_path / "router.log")
        server.ready_text = "policy-server ready"
        server.wait_ready(timeout_s=60)
        c = RawClient(endpoint, ReplicaKeys("arm", "main", "r0"), "robot-1")
        try:
            assert isinstance(c.open(), SessionAck)
        finally:
            c.close()
    finally:
        server.stop()
        if router is not None:
            router.stop()


def test_sigterm_drains_notifies_clients_and_exits_zero(tmp_path, ckpt, router):  # noqa: F811
    path = write(
        tmp_path,
        {
            "model": {"repo_or_path": str(ckpt)},
            "model_id": "arm",
            "warmup_inferences": 1,
            "zenoh": {"connect_endpoints": [router]},
            "drain": {"timeout_s": 3.0},
            "emulated_latency": 200,
        },
    )
    child = ChildProcess(
        CLI + ["--manifest", str(path)], tmp_path / "server.log", ready_text="policy-server ready", name="server"
    ).start(timeout_s=60)
    c = RawClient(router, ReplicaKeys("arm", "main", "r0"), "robot-1")
    try:
        assert isinstance(c.open(), SessionAck)
        c.send(np.ones(S))  # a request in flight (200 ms emulated) when SIGTERM lands
        time.sleep(0.05)
        t0 = time.monotonic()
        child.signal(signal.SIGTERM)
        rc = child.proc.wait(10)
        took = time.monotonic() - t0
        assert rc == 0 and took < 3.0 + 2.0
        assert c.wait_for(lambda h, m: isinstance(m, DrainNotice), timeout=2) is not None
        assert "policy-server stopped" in child.tail(5)
    finally:
        c.close()
        child.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_waiting_for_the_router_stops_at_once(tmp_path, ckpt, sig):  # noqa: F811
    from wire.procs import free_port

    path = write(
        tmp_path,
        {
            "model": {"repo_or_path": str(ckpt)},
            "warmup_inferences": 0,
            "zenoh": {"connect_endpoints": [f"tcp/127.0.0.1:{free_port()}"], "connect_timeout_s": 60},
        },
    )
    server = ChildProcess(
        CLI + ["--manifest", str(path)], tmp_path / "server.log", name="server", ready_text="router not reachable yet"
    ).start(timeout_s=60)
    try:
        server.signal(sig)
        assert server.proc.wait(15) == 0, "it stops retrying, as a drain exits (not after connect_timeout_s)"
        log = server.tail(100)
        assert "policy-server stopped" in log and "gave up after" not in log and "Traceback" not in log
    finally:
        server.stop()


@pytest.mark.parametrize("key,flag", [("audit_path", "--audit-path"), ("debug.capture_dir", "--capture-dir")])
@pytest.mark.parametrize("where", ["under a file", "under /proc"])
def test_an_output_path_that_cannot_be_created_is_a_one_line_error_before_the_model_loads(
    tmp_path, ckpt, key, flag, where
):  # noqa: F811
    (tmp_path / "afile").write_text("x")
    target = str(tmp_path / "afile" / "out") if where == "under a file" else "/proc/nope/out"
    path = write(tmp_path, {"model": {"repo_or_path": str(ckpt)}, "zenoh": {"connect_endpoints": ["tcp/127.0.0.1:1"]}})
    out = run(["--manifest", str(path), "--check", flag, target])
    assert out.returncode == 2 and "Traceback" not in out.stderr and "checkpoint OK" not in out.stdout
    assert out.stderr.strip().splitlines() == [
        f"policy-server: {key}: cannot create {target!r}: "
        f"{repr(str(tmp_path / 'afile')) + ' is a file' if where == 'under a file' else 'No such file or directory'}; "
        f"give a path in a directory this process can write, or leave {key} unset"
    ]


def test_a_manifest_that_is_not_utf8_is_a_one_line_error(tmp_path):
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe\xfa")
    out = run(["--manifest", str(path), "--check"])
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"policy-server: {path}: not UTF-8 text (byte 0xff at offset 0); give a YAML manifest saved as UTF-8"
    ]


def test_a_taken_health_port_is_a_one_line_error_naming_it(tmp_path, ckpt, router):  # noqa: F811
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = write(
            tmp_path,
            {
                "model": {"repo_or_path": str(ckpt)},
                "warmup_inferences": 0,
                "health_port": port,
                "zenoh": {"connect_endpoints": [router]},
            },
        )
        out = run(["--manifest", str(path)])
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        f"policy-server: health_port: cannot listen on 127.0.0.1:{port}: "
        "Address already in use; pick another health_port"
    )


def test_bad_tls_files_and_a_refused_handshake_are_one_line_errors(tmp_path, ckpt):  # noqa: F811
    import datetime as dt

    from bench.security.pki import Pki
    from wire.procs import free_port

    pki = Pki(tmp_path / "pki")
    now = dt.datetime.now(dt.UTC)
    old = pki.issue("server-r0", not_before=now - dt.timedelta(days=3), not_after=now - dt.timedelta(days=1))
    tls = {"root_ca_certificate": old.ca, "connect_certificate": old.cert, "connect_private_key": old.key}
    path = write(
        tmp_path,
        {
            "model": {"repo_or_path": str(ckpt)},
            "warmup_inferences": 0,
            "zenoh": {"connect_endpoints": [f"tls/127.0.0.1:{free_port()}"], "tls": tls},
        },
    )
    out = run(["--manifest", str(path)])
    assert out.returncode == 2 and "zenoh.tls.connect_certificate" in out.stderr and "expired on" in out.stderr
    assert "Traceback" not in out.stderr
    good = pki.server("r0")  # valid files, nobody listening (or a router refusing): retried, then fails, no hang
    tls = {"root_ca_certificate": good.ca, "connect_certificate": good.cert, "connect_private_key": good.key}
    path = write(
        tmp_path,
        {
            "model": {"repo_or_path": str(ckpt)},
            "warmup_inferences": 0,
            "zenoh": {"connect_endpoints": [f"tls/127.0.0.1:{free_port()}"], "tls": tls, "connect_timeout_s": 2},
        },
    )
    t0 = time.monotonic()
    out = run(["--manifest", str(path)])
    assert out.returncode == 2 and "refused the handshake" in out.stderr and "Traceback" not in out.stderr
    assert time.monotonic() - t0 < 30


def test_compile_on_a_cpu_without_a_compiler_is_refused_at_load_without_a_traceback(tmp_path):
    """`model.hyper_params.compile` on a CPU host whose C++ compiler is missing ($CXX names none here): the
    server stops at load with the reason and both ways out, not at its first forward pass."""
    import os
    from pathlib import Path

    ckpt = Path(__file__).resolve().parents[2] / "bench/checkpoints/reacher_transformer"
    path = write(
        tmp_path,
        {
            "model": {"repo_or_path": str(ckpt), "hyper_params": {"compile": True}},
            "zenoh": {"connect_endpoints": ["tcp/127.0.0.1:1"]},
        },
    )
    out = subprocess.run(
        CLI + ["--manifest", str(path), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CXX": str(tmp_path / "no-such-c++")},
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "cannot load model 'reacher_transformer'" in out.stderr and "needs a C++ compiler" in out.stderr
    assert "install g++" in out.stderr and "compile: false" in out.stderr
