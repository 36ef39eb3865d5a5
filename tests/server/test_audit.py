"""server.audit: one strict-JSON line per write, server-stamped clocks, crash tolerance, replay filters."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from server.audit import FIELDS, AuditLog, read_audit

REPO = Path(__file__).resolve().parents[2]


def record(**overrides) -> dict:
    rec = {
        "session_id": "s-1",
        "client_uuid": "robot-217",
        "seq_id": 41,
        "episode_id": 3,
        "queue_wait_ms": 2.5,
        "inference_ms": 61.0,
        "chunk_range": [0, 50],
        "superseded_seqs": 0,
        "outcome": "ok",
    }
    rec.update(overrides)
    return rec


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_each_write_appends_exactly_one_json_line_with_all_section_12_fields(tmp_path):
    path = tmp_path / "audit" / "server.jsonl"  # parent directories are created
    with AuditLog(path) as audit:
        audit.write(record())
        audit.write({"session_id": "s-2", "outcome": "error", "error": "CUDA OOM"})
    first, second = (json.loads(line) for line in lines(path))
    assert list(first) == ["ts", "mono_ms", *FIELDS]
    assert first["chunk_range"] == [0, 50] and first["client_uuid"] == "robot-217"
    assert list(second) == ["ts", "mono_ms", *FIELDS, "error"]
    assert second["seq_id"] is None and second["error"] == "CUDA OOM"


def test_ts_is_this_servers_utc_wall_clock_and_mono_ms_its_monotonic_clock(tmp_path):
    path = tmp_path / "a.jsonl"
    before_wall, before_mono = datetime.now(UTC), time.monotonic() * 1000
    with AuditLog(path) as audit:
        audit.write(record())
        audit.write(record())
    first, second = (json.loads(line) for line in lines(path))
    ts = datetime.fromisoformat(first["ts"])
    assert ts.utcoffset() == timedelta(0)
    assert before_wall <= ts <= datetime.now(UTC)
    assert before_mono <= first["mono_ms"] <= second["mono_ms"] <= time.monotonic() * 1000


def test_a_record_cannot_bring_its_own_clock(tmp_path):
    with AuditLog(tmp_path / "a.jsonl") as audit:
        with pytest.raises(ValueError, match="server's own clock"):
            audit.write(record(ts="2020-01-01T00:00:00+00:00"))
        with pytest.raises(ValueError, match="server's own clock"):
            audit.write(record(mono_ms=1.0))


def test_numpy_values_and_non_finite_floats_still_give_strict_json(tmp_path):
    path = tmp_path / "a.jsonl"
    with AuditLog(path) as audit:
        audit.write(
            record(
                seq_id=np.uint64(7),
                inference_ms=np.float32(1.5),
                chunk_range=np.array([0, 50]),
                queue_wait_ms=float("nan"),
                extra={"x": float("inf")},
            )
        )
    (line,) = lines(path)
    rec = json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert rec["seq_id"] == 7 and rec["inference_ms"] == 1.5 and rec["chunk_range"] == [0, 50]
    assert rec["queue_wait_ms"] is None and rec["extra"] == {"x": None}


def test_stream_receives_the_same_lines(tmp_path):
    stream = io.StringIO()
    with AuditLog(tmp_path / "a.jsonl", stream=stream) as audit:
        audit.write(record())
    assert stream.getvalue().splitlines() == lines(tmp_path / "a.jsonl")
    only_stream = AuditLog(None, stream=stream)
    only_stream.write(record(seq_id=42))
    assert json.loads(stream.getvalue().splitlines()[-1])["seq_id"] == 42


def test_write_after_close_is_refused(tmp_path):
    audit = AuditLog(tmp_path / "a.jsonl")
    audit.close()
    audit.close()
    with pytest.raises(ValueError, match="closed"):
        audit.write(record())


def test_concurrent_writers_never_interleave_lines(tmp_path):
    path = tmp_path / "a.jsonl"
    threads, per_thread = 8, 200
    with AuditLog(path) as audit:
        pool = [
            threading.Thread(
                target=lambda i=i: [
                    audit.write(record(client_uuid=f"c{i}", seq_id=k, pad="x" * 500)) for k in range(per_thread)
                ]
            )
            for i in range(threads)
        ]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    recs = [json.loads(line) for line in lines(path)]
    assert len(recs) == threads * per_thread
    for i in range(threads):
        assert [r["seq_id"] for r in recs if r["client_uuid"] == f"c{i}"] == list(range(per_thread))
    assert [r["mono_ms"] for r in recs] == sorted(r["mono_ms"] for r in recs)


def test_read_audit_tolerates_a_truncated_last_line(tmp_path):
    path = tmp_path / "a.jsonl"
    with AuditLog(path) as audit:
        audit.write(record(seq_id=1))
        audit.write(record(seq_id=2))
    with open(path, "ab") as f:
        f.write(b'{"ts":"2025-01-01T00:00:00.000000+00:00","session_id":"s-1","client_uu')
    assert [r["seq_id"] for r in read_audit(path)] == [1, 2]


def test_reopening_after_a_torn_line_keeps_the_next_record_whole(tmp_path):
    path = tmp_path / "a.jsonl"
    with AuditLog(path) as audit:
        audit.write(record(seq_id=1))
    with open(path, "ab") as f:
        f.write('{"ts":"2025-01-01T00:00:00+00:00","client_uuid":"robot-é'.encode()[:-1])  # torn inside a UTF-8 char
    with AuditLog(path) as audit:
        audit.write(record(seq_id=2))
    assert [r["seq_id"] for r in read_audit(path)] == [1, 2]


def test_sigkill_loses_no_line_already_written(tmp_path):
    path = tmp_path / "a.jsonl"
    script = (
        "import sys, time\n"
        "from server.audit import AuditLog\n"
        f"audit = AuditLog({str(path)!r})\n"
        "for k in range(500):\n"
        "    audit.write({'client_uuid': 'robot-217', 'seq_id': k, 'outcome': 'ok'})\n"
        "print('written', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "written"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=10)
    assert [r["seq_id"] for r in read_audit(path)] == list(range(500))


def test_read_audit_filters_by_client_and_time_range(tmp_path):
    path = tmp_path / "a.jsonl"
    stamps = [
        "2025-03-01T14:02:59.000000+00:00",
        "2025-03-01T14:03:00.000000+00:00",
        "2025-03-01T14:03:30.000000+00:00",
        "2025-03-01T14:04:00.000000+00:00",
    ]
    with open(path, "w", encoding="utf-8") as f:
        for k, ts in enumerate(stamps):
            f.write(json.dumps({"ts": ts, "client_uuid": "robot-217" if k % 2 else "robot-9", "seq_id": k}) + "\n")
    start, end = datetime(2025, 3, 1, 14, 3, tzinfo=UTC), datetime(2025, 3, 1, 14, 4, tzinfo=UTC)
    assert [r["seq_id"] for r in read_audit(path, start=start, end=end)] == [1, 2]  # [start, end)
    assert [r["seq_id"] for r in read_audit(path, start="2025-03-01T14:03:00")] == [1, 2, 3]  # naive = UTC
    assert [r["seq_id"] for r in read_audit(path, end=start.timestamp())] == [0]  # epoch seconds
    assert [r["seq_id"] for r in read_audit(path, client_uuid="robot-217")] == [1, 3]
    assert [r["seq_id"] for r in read_audit(path, start=start, client_uuid="robot-9")] == [2]
