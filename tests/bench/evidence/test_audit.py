"""The servers' audit logs as one Arrow table (bench.evidence.audit): what the report's readers and
server_requests.parquet get from a replica's lines, torn and odd ones included."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from bench.evidence import audit
from bench.fleet.clock import SAME_CLOCK, ClockOffset


def _line(**kw) -> str:
    return json.dumps(kw, separators=(",", ":")) + "\n"


OK = dict(
    ts="2026-11-26T11:25:40.404058+00:00",
    mono_ms=1000.5,
    session_id="s1",
    client_uuid="robot-a",
    seq_id=1,
    outcome="ok",
    chunk_range=[0, 30],
    client_mono_ns=990_000_000,
    forward_ms=4.1,
    batch=2,
    received_mono_ms=995.25,
    sent_mono_ms=1000.25,
)


def test_a_torn_or_non_object_line_is_skipped_and_a_missing_key_is_null():
    lines = [
        _line(**OK),
        '{"ts":"2026-11-26T11:25:41',
        "\n",
        "[1, 2]\n",
        "17\n",
        _line(ts="x", mono_ms=1001.0, client_uuid="robot-b", outcome="denied:bad_auth", denied_count=3),
    ]
    t = audit.read_lines(lines, "r0")
    assert t.num_rows == 2
    assert t.column("outcome").to_pylist() == ["ok", "denied:bad_auth"]
    assert t.column("denied_count").to_pylist() == [None, 3]  # a key the first line lacks
    assert t.column("forward_ms").to_pylist() == [4.1, None]  # a key the second line lacks


def test_a_nested_value_is_its_json_text_as_in_the_log():
    t = audit.read_lines([_line(**OK), _line(**{**OK, "chunk_range": None, "extra": {"a": [1, 2]}})], "r0")
    assert t.column("chunk_range").to_pylist() == ["[0, 30]", None]
    assert t.column("extra").to_pylist() == [None, '{"a": [1, 2]}']
    assert pa.types.is_string(t.column("chunk_range").type)


def test_every_row_names_its_replica_and_a_replica_on_another_clock_is_moved_onto_the_runners(tmp_path):
    for rid in ("r0", "r1"):
        (tmp_path / f"audit-{rid}.jsonl").write_text(
            _line(**OK) + _line(**{**OK, "mono_ms": 2000, "sent_mono_ms": None})
        )
    skewed = ClockOffset(offset_s=5.0, uncertainty_s=0.0004, rtt_s=0.0008)
    t = audit.read([("r0", tmp_path / "audit-r0.jsonl", SAME_CLOCK), ("r1", tmp_path / "audit-r1.jsonl", skewed)])
    assert t.column("replica").to_pylist() == ["r0", "r0", "r1", "r1"]
    # r1's clock reads 5 s ahead: its stamps come back by 5000 ms (an int stamp too); r0's stay as written
    assert t.column("mono_ms").to_pylist() == [1000.5, 2000.0, 1000.5 - 5000.0, 2000.0 - 5000.0]
    assert t.column("received_mono_ms").to_pylist() == [995.25, 995.25, 995.25 - 5000.0, 995.25 - 5000.0]
    assert t.column("sent_mono_ms").to_pylist() == [1000.25, None, 1000.25 - 5000.0, None]
    assert t.column("clock_uncertainty_ms").to_pylist() == [None, None, pytest.approx(0.4), pytest.approx(0.4)]
    assert t.column("client_mono_ns").to_pylist() == [990_000_000] * 4  # not a server stamp: never moved
    assert t.column("mono_ms").type == pa.float64()


def test_the_table_is_what_the_list_of_dicts_gave_across_batches(monkeypatch):
    """The reference is the list of dicts the runner held before (every key of every row, None when missing) through
    pa.Table.from_pylist: same columns in the same order, same types, same values. Batches of 3 lines put a key and
    a type change on either side of a batch boundary."""
    monkeypatch.setattr(audit, "BATCH_ROWS", 3)
    recs = [
        OK,
        {**OK, "seq_id": 2},
        {**OK, "batch": 2.5},
        {"ts": "y", "mono_ms": 5, "outcome": "expired", "zeta": 1},
        {**OK, "superseded_seqs": [3, 4]},
        {**OK, "alpha": True},
        {**OK, "seq_id": None},
    ]
    lines = [_line(**r) for r in recs]
    rows = []
    for r in recs:
        r = {k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in r.items()}
        r["replica"] = "r0"
        rows.append(r)
    for r in rows:
        for k in sorted({k for row in rows for k in row}):
            r.setdefault(k, None)
    expected = pa.Table.from_pylist(rows)
    got = audit.read_lines(lines, "r0")
    assert got.column_names == expected.column_names
    assert got.schema == expected.schema  # batch: int in one batch, float in the next -> double
    assert got.to_pylist() == expected.to_pylist()


def test_values_no_one_type_holds_become_text_not_an_error(monkeypatch):
    monkeypatch.setattr(audit, "BATCH_ROWS", 2)
    lines = [
        _line(**{**OK, "detail": 5}),
        _line(**{**OK, "detail": 6}),
        _line(**{**OK, "detail": "why"}),
        _line(**{**OK, "detail": None}),
    ]
    t = audit.read_lines(lines, "r0")
    assert t.column("detail").to_pylist() == ["5", "6", "why", None]


def test_readers_take_a_column_no_line_had_as_null():
    t = audit.read_lines(
        [
            _line(**OK),
            _line(**{**OK, "session_id": "s2", "checkpoint_hash": "h2"}),
            _line(**{**OK, "session_id": "s2", "checkpoint_hash": "h3"}),
            _line(**{**OK, "session_id": "", "checkpoint_hash": "h4"}),
        ],
        "r0",
    )
    assert audit.checkpoints_by_session(t) == {"s2": "h3"}  # both set and not empty; a later row wins
    assert audit.checkpoints_by_session(audit.read_lines([_line(**OK)], "r0")) == {}
    assert np.isnan(audit.floats(t, "no_such_column")).all() and len(audit.floats(t, "no_such_column")) == 4
    assert not audit.equals(t, "no_such_column", "ok").any()
    assert audit.at_least(t, "seq_id", 1).all() and not audit.at_least(t, "seq_id", 2).any()
    assert not audit.at_least(t, "outcome", 0).any()  # a string column holds no number
    key, has = audit.integers(t, "client_mono_ns")
    assert key.tolist() == [990_000_000] * 4 and has.all()
    assert audit.rows_with_prefix(t, "outcome", "denied:") == []
    empty = pa.table({})
    assert audit.floats(empty, "mono_ms").shape == (0,) and audit.rows_with_prefix(empty, "outcome", "x") == []
