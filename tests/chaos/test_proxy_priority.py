"""The proxy's scheduling (`chaos.toxiproxy --priority`): what it asks for, how it falls back where the host refuses,
and what a started proxy reports (`ProxyServer.priority`, the bench's `summary.json` → `chaos_proxy.priority`)."""

from __future__ import annotations

import os

import pytest

from chaos.launch import scheduling_of, start_proxy_server
from chaos.toxiproxy import __main__ as proxy_main
from tests.chaos.harness import connect, echo  # noqa: F401  (fixture)


def _refuse(*_args, **_kwargs):
    raise PermissionError(1, "Operation not permitted")


def test_fifo_falls_back_to_nice_then_to_normal_where_the_host_refuses(monkeypatch):
    asked = []
    monkeypatch.setattr(
        proxy_main.os,
        "sched_setscheduler",
        lambda pid, policy, param: asked.append((pid, policy, param.sched_priority)),
    )
    assert proxy_main.raise_priority("fifo") == f"SCHED_FIFO {proxy_main.FIFO_PRIORITY}"
    assert asked == [(0, os.SCHED_FIFO, proxy_main.FIFO_PRIORITY)]  # this thread: the event loop's

    niced = []
    monkeypatch.setattr(proxy_main.os, "sched_setscheduler", _refuse)
    monkeypatch.setattr(proxy_main.os, "setpriority", lambda which, who, value: niced.append(value))
    assert proxy_main.raise_priority("fifo") == "nice -10"
    assert niced == [-10]

    monkeypatch.setattr(proxy_main.os, "setpriority", _refuse)
    assert proxy_main.raise_priority("fifo") == "normal"
    assert proxy_main.raise_priority("nice") == "normal"


def test_normal_changes_nothing(monkeypatch):
    monkeypatch.setattr(proxy_main.os, "sched_setscheduler", _refuse)
    monkeypatch.setattr(proxy_main.os, "setpriority", _refuse)
    assert proxy_main.raise_priority("normal") == "normal"


def test_the_proxy_stays_below_the_control_loops():
    from bench.fleet.shard import LOOP_FIFO_PRIORITY

    assert 0 < proxy_main.FIFO_PRIORITY < LOOP_FIFO_PRIORITY  # a robot's tick first, the network second


def test_unknown_priority_is_refused_by_the_command_line(capsys):
    with pytest.raises(SystemExit) as exc:
        proxy_main.parse_args(["--priority", "realtime"])
    assert exc.value.code == 2
    assert "invalid choice: 'realtime'" in capsys.readouterr().err


@pytest.mark.integration
def test_a_started_proxy_reports_the_scheduling_its_process_has(tmp_path, monkeypatch):
    monkeypatch.setenv("CHAOS_PROXY", "python")
    fifo = start_proxy_server(tmp_path / "fifo.log", priority="fifo")
    plain = start_proxy_server(tmp_path / "plain.log")
    try:
        assert fifo.priority == scheduling_of(fifo.pid)  # read from the live process, not from what was asked
        assert fifo.priority in (f"SCHED_FIFO {proxy_main.FIFO_PRIORITY}", "nice -10", "normal")
        assert f"event loop priority: {fifo.priority} (asked: fifo)" in (tmp_path / "fifo.log").read_text()
        # a plain proxy changes nothing: it keeps the scheduling it inherits from this process ("normal" in CI,
        # "nice 19" when the suite runs under `nice -n 19`, as on a shared host)
        assert plain.priority == scheduling_of(plain.pid) == scheduling_of(os.getpid())
    finally:
        fifo.stop()
        plain.stop()
    assert scheduling_of(fifo.pid) == "unknown"  # gone


def test_the_bench_asks_fifo_unless_told_otherwise(monkeypatch):
    from bench.run.mesh import proxy_argv, proxy_priority

    monkeypatch.delenv("BENCH_PROXY_PRIORITY", raising=False)
    assert proxy_priority() == "fifo"
    assert proxy_argv("127.0.0.1", 9)[-2:] == ["--priority", "fifo"]
    monkeypatch.setenv("BENCH_PROXY_PRIORITY", "normal")
    assert proxy_argv("127.0.0.1", 9)[-2:] == ["--priority", "normal"]


def test_a_proxy_on_another_node_is_known_by_its_log_line(tmp_path):
    from chaos.launch import priority_in_log

    log = tmp_path / "chaos-proxy-n1.log"
    log.write_text(
        "2026-11-26 13:00:02,715 INFO chaos.toxiproxy: event loop priority: nice -10 (asked: fifo)\n"
        "toxiproxy-server-py ready: listening on 127.0.0.1:1 version x\n"
    )
    assert priority_in_log(log) == "nice -10"
    log.write_text("toxiproxy-server-py ready: listening on 127.0.0.1:1 version x\n")  # started without --priority
    assert priority_in_log(log) is None
    assert priority_in_log(tmp_path / "absent.log") is None


def test_the_proxy_runs_on_the_event_loop_asked_and_says_which(tmp_path, echo):  # noqa: F811
    """`--loop asyncio` and `--loop uvloop` (auto's choice where installed) both carry bytes, and the log names
    the loop that ran."""
    from chaos.client import ChaosClient
    from chaos.launch import start_proxy_server
    from chaos.toxiproxy.__main__ import LOOP_LOG_TEXT, loop_factory

    pytest.importorskip("uvloop")
    assert loop_factory("auto")[0] == "uvloop" and loop_factory("asyncio")[0] == "asyncio"
    for loop in ("asyncio", "uvloop"):
        log = tmp_path / f"{loop}.log"
        proxy = start_proxy_server(log, loop=loop)
        try:
            api = ChaosClient(proxy.api_url)
            listen = api.create_proxy("x", upstream=f"127.0.0.1:{echo.port}")["listen"]
            api.add_toxic("x", "latency", {"latency": 5}, name="lat", stream="downstream")
            s = connect(listen)
            s.sendall(b"ping")  # at once: before the proxy has dialled the upstream (uvloop reads it early)
            assert s.recv(4) == b"ping"
            s.close()
        finally:
            proxy.stop()
        assert f"{LOOP_LOG_TEXT}{loop}" in log.read_text()
