"""The replicas' queues replayed: how much of the server's queue wait the bench host added.

A starved replica's forward pass runs slower than its own unloaded time (fidelity.replica_figures says by how
much); every request queued behind that pass waits longer too. That second cost cannot be read off a request
alone: it depends on what arrived while the replica was busy. So each replica's dispatch is replayed, twice, on
the requests it answered (their arrival times as they were), by the rule of server/service.py's dispatch loop:

- when the loop is free it takes what is queued, oldest first, up to `max_batch`;
- if that emptied the queue, the batch is not full and the replica has more live sessions than the batch holds,
  it waits up to `batch_window_ms` for more, taking each arrival at once, and stops early when the batch is
  full or holds every live session;
- the batch is picked (its queue wait ends) and the loop is busy for its forward pass plus the rest of its work
  (the chunks encoded and handed to Zenoh, the audit lines), then free again.

The replays differ in what a batch keeps the loop busy for:
- `observed`: the host's load at that moment, read off the replica's observed batch in progress then: its
  forward pass beyond its own unloaded time and its other work beyond the per-request cost, added to the
  replayed batch's own unloaded costs (added, not scaled: a stall does not grow with the batch);
- `unloaded`: the replica's unloaded forward pass at the replayed size (server.runtime.unloaded_forward_ms)
  plus the per-request cost of the other work times the size (that cost: the 10th percentile over the run's
  batches, the ones the host left most alone).
Per request, its reported queue wait less its wait in the `unloaded` replay is the queue wait the bench added
(`queue_wait_bench_ms`): a wait less its part is the unloaded replay's; the forward pass beyond its unloaded
time is `inference_bench_ms`. Estimates, and
rather below the bench's whole share than above it: the per-request cost is read on the loaded host, and the
arrivals stay as they were (a faster server would have answered sooner; a robot asks again on its own schedule,
so the closed loop moves little). A request's part can be negative: a faster loop picks sooner, in smaller
batches, and a request arriving just after a pick waits for it. The `observed` replay against the waits the
replica reported is the replay's own error (`replay_error_ms`, p50 and p99 of the two distributions'
difference): the figure to read before trusting the split. Not replayed (said in `note`): a replica with
several dispatch loops (`max_inflight` > 1), a strategy other than first-come order that could reorder a
backlog deeper than one batch, a replica without an unloaded reference or without `picked_mono_ms` in its
audit (a server older than this module).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SESSION_LINGER_MS = 1000.0  # a session counts as live this long after its last request (the window's rule)
REPLAYED_STRATEGIES = ("round_robin", "batch_optimized")  # one pending request per session: a backlog of under
# max_batch sessions is taken whole, so the order within it does not move a pick


@dataclass(frozen=True)
class Scheduling:
    """What of a replica's manifest the replay follows."""

    max_batch: int = 1
    batch_window_ms: float = 2.0
    loops: int = 1
    strategy: str = "round_robin"

    @classmethod
    def of_manifest(cls, manifest: dict | None, model_id: str | None = None) -> Scheduling:
        """server.manifest's defaults where the manifest is silent (scheduling.max_batch 1, batch_window_ms 2,
        models.default_max_inflight 1, models.known.<id>.max_inflight)."""
        m = manifest or {}
        sched = m.get("scheduling") or {}
        models = m.get("models") or {}
        loops = models.get("default_max_inflight", 1)
        known = models.get("known") or {}
        if isinstance(known, dict) and model_id in known:
            loops = (known[model_id] or {}).get("max_inflight", loops)
        return cls(
            max_batch=max(1, int(sched.get("max_batch", 1) or 1)),
            batch_window_ms=float(sched.get("batch_window_ms", 2.0) or 0.0),
            loops=max(1, int(loops or 1)),
            strategy=str(sched.get("strategy", "round_robin")),
        )


def live_sessions(arrival_ms: np.ndarray, session: np.ndarray, linger_ms: float = SESSION_LINGER_MS):
    """A function t -> how many sessions were live at t: from a session's first request to `linger_ms` after its
    last (the replica's session table, as near as its answered requests show it)."""
    _, code = np.unique(session, return_inverse=True)
    first = np.full(code.max() + 1 if code.size else 0, np.inf)
    last = np.full_like(first, -np.inf)
    np.minimum.at(first, code, arrival_ms)
    np.maximum.at(last, code, arrival_ms)
    starts, ends = np.sort(first), np.sort(last + linger_ms)

    def count(t: float) -> int:
        return int(np.searchsorted(starts, t, "right") - np.searchsorted(ends, t, "left"))

    return count


def replay(arrival_ms: np.ndarray, busy_ms, max_batch: int, window_ms: float, live=None) -> np.ndarray:
    """Each request's pick time (ms) when one dispatch loop serves these arrivals by the rule above.
    `busy_ms(b, t)`: how long a batch of b picked at t keeps the loop; `live(t)`: live sessions at t (None: the
    window always waits). Returns picks in the order of `arrival_ms`."""
    arrival_ms = np.asarray(arrival_ms, dtype=float)
    n = arrival_ms.size
    order = np.argsort(arrival_ms, kind="stable")
    a = arrival_ms[order]
    pick = np.empty(n)
    free = -np.inf
    head = 0  # a[head:nxt] is queued, a[nxt:] has not arrived yet
    nxt = 0
    while head < n:
        t = max(free, a[head])
        nxt = max(nxt, int(np.searchsorted(a, t, "right")))
        take = min(max_batch, nxt - head)
        end = head + take
        if take < max_batch and end == nxt and window_ms > 0 and (live is None or live(t) > take):
            close = t + window_ms  # the queue is empty now: each arrival in the window is taken at once
            while end - head < max_batch and (live is None or live(t) > end - head):
                if nxt < n and a[nxt] <= close:
                    t = a[nxt]
                    nxt += 1
                    end += 1
                else:
                    t = close  # the window ran out
                    break
        pick[order[head:end]] = t
        free = t + busy_ms(end - head, t)
        head = end
    return pick


def _at_batch(ref: dict, b) -> np.ndarray:
    from bench.evidence.fidelity import _at_batch as at

    return at(ref, np.atleast_1d(np.asarray(b, dtype=float)))


def forward_excess(forward_ms: np.ndarray, batch: np.ndarray, unloaded: dict) -> np.ndarray:
    """Each forward pass beyond the replica's unloaded time at its batch size: `inference_bench_ms`."""
    return forward_ms - _at_batch(unloaded, batch)


def replica_share(
    rows: dict[str, np.ndarray], unloaded: dict[int, float], sched: Scheduling
) -> tuple[np.ndarray, np.ndarray, dict]:
    """One replica's answered requests (`rows`: arrays `picked_mono_ms`, `queue_wait_ms`, `forward_ms`, `batch`,
    `sent_mono_ms`, `session`): per request (queue_wait_bench_ms, inference_bench_ms) and the replica's figures."""
    n = rows["picked_mono_ms"].size
    qw_bench, inf_bench = np.full(n, np.nan), np.full(n, np.nan)
    fig: dict = {"requests": int(n)}
    if not n:
        return qw_bench, inf_bench, fig
    picked, wait = rows["picked_mono_ms"], rows["queue_wait_ms"]
    fwd, size, sent = rows["forward_ms"], rows["batch"], rows["sent_mono_ms"]
    inf_bench = forward_excess(fwd, size, unloaded)
    arrival = picked - wait
    # the observed batches: one pick each; busy = pick to its last chunk handed to Zenoh
    order = np.argsort(picked, kind="stable")
    p_sorted = picked[order]
    first = np.concatenate([[True], np.diff(p_sorted) != 0])
    starts = np.nonzero(first)[0]
    b_pick = p_sorted[starts]
    b_fwd = fwd[order][starts]
    b_size = np.maximum(size[order][starts], 1.0)
    b_sent = np.maximum.reduceat(sent[order], starts)
    b_rest = np.maximum(b_sent - b_pick - b_fwd, 0.0)  # the batch's work beside its forward pass
    b_excess = forward_excess(b_fwd, b_size, unloaded)  # what the host added to its forward pass
    # the rest as a per-request cost (its 10th percentile: the batches the host left alone) plus what the host
    # added to that batch; a stall does not grow with the batch's size, the chunks to hand over do
    per_request = float(np.percentile(b_rest / b_size, 10))
    b_stall = np.maximum(b_rest - per_request * b_size, 0.0)
    fig["batches"] = int(starts.size)
    size_cache: dict[int, float] = {}

    def unloaded_at(b: int) -> float:
        if b not in size_cache:
            size_cache[b] = float(_at_batch(unloaded, b)[0])
        return size_cache[b]

    def busy(host: bool):
        def fn(b: int, t: float) -> float:
            if not host:
                return unloaded_at(b) + per_request * b
            k = max(int(np.searchsorted(b_pick, t, "right")) - 1, 0)  # the observed batch in progress at t
            return max(unloaded_at(b) + b_excess[k], 0.0) + per_request * b + b_stall[k]

        return fn

    live = live_sessions(arrival, rows["session"])
    observed = replay(arrival, busy(True), sched.max_batch, sched.batch_window_ms, live)
    bare = replay(arrival, busy(False), sched.max_batch, sched.batch_window_ms, live)
    qw_bench = wait - (bare - arrival)  # so a request's wait less its part is its wait in the unloaded replay
    replayed = observed - arrival
    fig.update(
        queue_wait_ms_p50=_r(np.percentile(wait, 50)),
        queue_wait_ms_p99=_r(np.percentile(wait, 99)),
        replayed_ms_p50=_r(np.percentile(replayed, 50)),
        replayed_ms_p99=_r(np.percentile(replayed, 99)),
        replay_error_ms_p50=_r(np.percentile(replayed, 50) - np.percentile(wait, 50)),
        replay_error_ms_p99=_r(np.percentile(replayed, 99) - np.percentile(wait, 99)),
        unloaded_ms_p50=_r(np.percentile(bare - arrival, 50)),
        unloaded_ms_p99=_r(np.percentile(bare - arrival, 99)),
    )
    return qw_bench, inf_bench, fig


def _r(x, nd=3):
    return None if x is None or not np.isfinite(x) else round(float(x), nd)


def server_share(
    audit, unloaded: dict[str, dict | None], scheduling: dict[str, Scheduling]
) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    """Every audit row's (queue_wait_bench_ms, inference_bench_ms), NaN where not measured or not an answered
    request, and one figure dict per replica of `unloaded` (`scheduling`: each one's dispatch rule; a replica
    missing there is not replayed) ({replica, requests, batches, queue_wait_ms_p50/p99,
    replayed_ms_p50/p99, replay_error_ms_p50/p99, unloaded_ms_p50/p99}, or with a `note` saying why not)."""
    from bench.evidence.audit import equals, floats, strings

    n = audit.num_rows
    qw_all, inf_all = np.full(n, np.nan), np.full(n, np.nan)
    figures: list[dict] = []
    if not n:
        return qw_all, inf_all, figures
    cols = {k: floats(audit, k) for k in ("picked_mono_ms", "queue_wait_ms", "forward_ms", "batch", "sent_mono_ms")}
    answered = equals(audit, "outcome", "ok") & ~np.isnan(cols["forward_ms"]) & (np.nan_to_num(cols["batch"]) > 0)
    ok = answered.copy()
    for k in ("picked_mono_ms", "queue_wait_ms", "sent_mono_ms"):
        ok &= ~np.isnan(cols[k])
    replica, session = strings(audit, "replica"), strings(audit, "session_id")
    for rid in sorted(unloaded):
        ref, sched = unloaded.get(rid), scheduling.get(rid)
        mine = answered & (replica == rid)
        row: dict = {"replica": rid, "requests": int(mine.sum())}
        if not ref:
            row["note"] = "no unloaded forward time in its log: not measured"
        else:
            inf_all[mine] = forward_excess(cols["forward_ms"][mine], cols["batch"][mine], ref)
        if not ref or not mine.any():
            figures.append(row)
            continue
        why = None
        if sched is None:
            why = "its manifest (the dispatch rule) could not be read: the queue not replayed"
        elif sched.loops > 1:
            why = f"{sched.loops} dispatch loops (max_inflight): the queue not replayed (the replay models one)"
        elif sched.strategy not in REPLAYED_STRATEGIES:
            why = f"strategy {sched.strategy}: the queue not replayed (the replay takes a backlog oldest first)"
        elif not (ok & mine).any():
            why = "its audit has no picked_mono_ms (a server older than the replay): the queue not replayed"
        if why:
            row["note"] = why
        else:
            idx = np.nonzero(ok & mine)[0]
            rows = {k: v[idx] for k, v in cols.items()}
            rows["session"] = session[idx]
            qw, _, fig = replica_share(rows, ref, sched)
            qw_all[idx] = qw
            row.update(fig)
        figures.append(row)
    return qw_all, inf_all, figures
