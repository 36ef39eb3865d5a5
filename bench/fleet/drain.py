"""Draining a shard's engines, on its status thread: each engine's request records and state transitions,
read back into the shard's `requests` and `transitions` buffers (times since the run's t=0)."""

from __future__ import annotations

import math
import time

INT32_MAX = 2**31 - 1  # a record's int32 column: a server's count beyond it (a u32 on the wire) is held at it


def drain(shard) -> None:
    """Every engine's request records and state transitions since the last drain, into the shard's buffers."""
    rel_now = time.monotonic() - shard.t0
    for rs in shard.robots:
        eng = rs.engine
        if eng is None:
            continue
        try:
            recs = eng.drain_records()
            trans = eng.drain_transitions()
        except Exception:
            continue
        for rec in recs or ():
            rtt = _f(rec.get("rtt_ms"))
            t = rec.get("t")
            t = rel_now if t is None else _rel(shard, t)
            shard.requests.append(
                robot=rs.rid,
                t=t,
                seq=int(rec.get("seq", rec.get("seq_id", -1)) or -1),
                rtt_ms=rtt,
                queue_wait_ms=_f(rec.get("queue_wait_ms")),
                inference_ms=_f(rec.get("inference_ms")),
                network_ms=_f(rec.get("network_ms")),
                encode_ms=_f(rec.get("encode_ms")),
                send_lag_ms=_f(rec.get("send_lag_ms")),
                merge_lag_ms=_f(rec.get("merge_lag_ms")),
                delay_steps=int(rec.get("delay_steps") or 0),
                execution_steps=int(rec.get("execution_steps") or 0),
                steps_remaining=int(rec.get("steps_remaining") or 0),
                superseded_seqs=min(int(rec.get("superseded_seqs") or 0), INT32_MAX),
                outcome=str(rec.get("outcome", "")),
                sent_ns=int(rec.get("sent_ns") or 0),
                downlink_from_router_ms=_f(rec.get("downlink_from_router_ms")),
            )
            if math.isfinite(rtt):
                shard.recent_rtt.append(rtt)
        for tr in trans or ():
            t, frm, to, reason = _transition_fields(tr)
            shard.transitions.append(
                robot=rs.rid,
                t=_rel(shard, t) if t is not None else rel_now,
                from_state=_state_str(frm),
                to_state=_state_str(to),
                reason=str(reason or ""),
            )


def _rel(shard, t: float) -> float:
    """Engine timestamps are monotonic seconds; records use seconds since the run's t=0."""
    return float(t) - shard.t0


def _f(v) -> float:
    try:
        return float(v) if v is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def _state_str(s) -> str:
    if s is None:
        return ""
    name = getattr(s, "name", None) or getattr(s, "value", None) or str(s)
    return str(name).upper().split(".")[-1]


def _transition_fields(tr):
    if isinstance(tr, dict):
        return tr.get("t"), tr.get("from", tr.get("from_state")), tr.get("to", tr.get("to_state")), tr.get("reason")
    if hasattr(tr, "to") or hasattr(tr, "to_state"):
        return (
            getattr(tr, "t", None),
            getattr(tr, "from_state", getattr(tr, "frm", None)),
            getattr(tr, "to_state", getattr(tr, "to", None)),
            getattr(tr, "reason", ""),
        )
    t, frm, to, *rest = tr
    return t, frm, to, (rest[0] if rest else "")
