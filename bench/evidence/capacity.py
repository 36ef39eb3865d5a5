"""Sweeps as a load test: one row per sweep value, the knee, and design P10's capacity formula.

    value ─► bench run (one variant) ─► summary.json ─► row: pass?, throughput, goodput,
                                                         queue vs compute vs network time
    rows ─► knee = the last value before the first failing one (the scenario's assertions are
            the target: a staleness or None-tick bound) ─► N_max formula ─► ratio

Rows follow Triton's perf_analyzer: per load step, throughput (answered requests/s), goodput
(requests answered within the deadline, /s), and where the time went (server queue wait, server
compute, network, and of the network the replica's own time outside its queue and compute: `srv`,
server_overhead_ms). The deadline of a request is the RTC latency budget `H * dt / 2` of its robot
(P10's second term): a chunk later than that is merged with a delay the guidance cannot absorb.

P10: `N_max = min(0.8 / (r * t), (H * dt / 2 - RTT) / t)` with `t` the server time per request,
`r` the request rate per session, `H` the execution horizon, `dt` the control period and `RTT` the
network round trip. Measured `r`, `t` and `RTT` come from the lightest load step (where queueing
has not yet inflated them); nominal ones may be given in the sweep's `formula` section.

Invariant: the knee is only ever read off runs that completed; a run that errored ends the sweep
and leaves the knee undefined (null), never guessed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path


def n_max(r_hz: float, t_s: float, horizon: int, dt_s: float, rtt_s: float) -> dict:
    """P10's two bounds and their minimum; NaN where an input is missing or not positive."""
    if not (r_hz > 0 and t_s > 0 and dt_s > 0):
        return {"utilization_bound": math.nan, "latency_bound": math.nan, "n_max": math.nan}
    util = 0.8 / (r_hz * t_s)
    lat = (horizon * dt_s / 2.0 - max(rtt_s, 0.0)) / t_s
    return {"utilization_bound": util, "latency_bound": lat, "n_max": min(util, lat)}


def _p(fig: dict, name: str, q: str):
    v = fig.get(name)
    return v.get(q) if isinstance(v, dict) else None


def step_row(value, summary: dict) -> dict:
    """One load step from a variant's summary.json."""
    f = summary.get("figures", {})
    dur = float(summary.get("duration_s") or 0) or math.nan
    robots = int(summary.get("robots") or 0)
    requests = f.get("requests") or 0
    ok = (f.get("rtt_ms") or {}).get("count") or 0
    good = f.get("goodput_requests")
    return {
        "value": value,
        "verdict": summary.get("verdict"),
        "robots": robots,
        "throughput_rps": ok / dur if dur == dur else None,
        "goodput_rps": (good / dur) if good is not None and dur == dur else None,
        "goodput_ratio": (good / ok) if good is not None and ok else None,
        "requests_per_robot_s": (requests / dur / robots) if robots and dur == dur else None,
        "queue_wait_ms_p50": _p(f, "queue_wait_ms", "p50"),
        "queue_wait_ms_p95": _p(f, "queue_wait_ms", "p95"),
        "inference_ms_p50": _p(f, "inference_ms", "p50"),
        "network_ms_p50": _p(f, "network_ms", "p50"),
        "server_overhead_ms_p50": _p(f, "server_overhead_ms", "p50"),
        "rtt_ms_p50": _p(f, "rtt_ms", "p50"),
        "rtt_ms_p99": _p(f, "rtt_ms", "p99"),
        "none_tick_ratio": f.get("none_tick_ratio"),
        "staleness_violations": f.get("staleness_violations"),
        "server_queue_depth_max": f.get("server_queue_depth_max"),
        "failed_assertions": [a["expression"] for a in summary.get("assertions", []) if a.get("result") != "pass"],
        "verdict_without_bench": verdict_without_bench(summary),
        "groups": {g: {k: gf.get(k) for k in GROUP_COLUMNS} for g, gf in (summary.get("groups") or {}).items()},
    }


GROUP_COLUMNS = (
    "seam_jerk_p95",
    "seam_step_p95",
    "task_success_rate",
    "none_tick_ratio",
    "gating_tick_ratio",
    "fallback_tick_ratio",
)


def format_group_table(rows: list[dict]) -> str:
    """Per group and value: smoothness and success (what a `runs` sweep over a network or engine key compares)."""
    lines = [f"{'value':>8} {'group':>10} " + " ".join(f"{c:>19}" for c in GROUP_COLUMNS)]
    for r in rows:
        for g, cols in (r.get("groups") or {}).items():
            lines.append(
                f"{str(r['value']):>8} {g:>10} "
                + " ".join(
                    f"{format(cols[c], '.4f') if isinstance(cols.get(c), (int, float)) else '-':>19}"
                    for c in GROUP_COLUMNS
                )
            )
    return "\n".join(lines)


def verdict_without_bench(summary: dict) -> str | None:
    """A load step's verdict had the bench host added nothing it measured: a failed step passes where every
    failed assertion passed again on its figures less the bench's share (runner's `without_bench`). None for an
    errored step. An upper bound of the system's where the share's forward part is (on a GPU replica a
    launch-bound pass also waits for its own process's threads)."""
    verdict = summary.get("verdict")
    if verdict == "pass" or verdict == "error" or verdict is None:
        return None if verdict in ("error", None) else "pass"
    failed = [a for a in summary.get("assertions", []) if a.get("result") != "pass"]
    return "pass" if failed and all((a.get("without_bench") or {}).get("result") == "pass" for a in failed) else "fail"


def knee_of(rows: list[dict], verdict: str = "verdict"):
    """(knee, first_failure): the last value before the first non-passing step (by `verdict`: a row's own, or
    `verdict_without_bench`)."""
    knee = None
    for row in rows:
        if row.get(verdict) != "pass":
            return knee, row["value"]
        knee = row["value"]
    return knee, None


def _num(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def capacity_report(rows: list[dict], horizon: int, dt_s: float, formula: dict | None) -> dict:
    knee, first_failure = knee_of(rows)
    light = rows[0] if rows else {}
    r = _num(light.get("requests_per_robot_s"))
    t = _num(light.get("inference_ms_p50")) / 1e3
    rtt = _num(light.get("network_ms_p50")) / 1e3
    measured = {
        "r_hz": r,
        "t_ms": t * 1e3,
        "rtt_ms": rtt * 1e3,
        "horizon": horizon,
        "dt_s": dt_s,
        **n_max(r, t, horizon, dt_s, rtt),
    }
    nominal = None
    if formula:
        nominal = {
            "r_hz": float(formula.get("r_hz", r)),
            "t_ms": float(formula.get("t_ms", t * 1e3)),
            "rtt_ms": float(formula.get("rtt_ms", rtt * 1e3)),
            "horizon": int(formula.get("horizon", horizon)),
            "dt_s": float(formula.get("dt_s", dt_s)),
        }
        nominal.update(
            n_max(nominal["r_hz"], nominal["t_ms"] / 1e3, nominal["horizon"], nominal["dt_s"], nominal["rtt_ms"] / 1e3)
        )
    bare_knee, bare_failure = knee_of(rows, "verdict_without_bench")
    figures = {
        "knee": knee,
        "first_failure": first_failure,
        "steps": len(rows),
        "n_max": measured["n_max"],
        "n_max_nominal": nominal["n_max"] if nominal else None,
        # the same sweep read without the bench's measured share: how much of the knee is the bench host's
        "knee_without_bench": bare_knee,
        "first_failure_without_bench": bare_failure,
    }
    figures["knee_ratio"] = (knee / measured["n_max"]) if knee is not None and measured["n_max"] > 0 else None
    figures["knee_ratio_nominal"] = (
        (knee / nominal["n_max"]) if knee is not None and nominal and nominal["n_max"] > 0 else None
    )
    return {"figures": _clean(figures), "formula_measured": _clean(measured), "formula_nominal": _clean(nominal)}


def _clean(d):
    if d is None:
        return None
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def format_table(rows: list[dict]) -> str:
    head = (
        f"{'value':>8} {'verdict':>7} {'thr/s':>7} {'good/s':>7} {'good%':>6} {'queue p50/p95 ms':>17} "
        f"{'compute p50':>11} {'net p50':>7} {'srv p50':>7} {'rtt p99':>8} {'none%':>6}"
    )
    lines = [head]

    def f(v, spec):
        return format(v, spec) if isinstance(v, (int, float)) else "-"

    for r in rows:
        q = f"{f(r['queue_wait_ms_p50'], '.1f')}/{f(r['queue_wait_ms_p95'], '.1f')}"
        good = f(r["goodput_ratio"] * 100, ".1f") if isinstance(r["goodput_ratio"], (int, float)) else "-"
        none = f(r["none_tick_ratio"] * 100, ".2f") if isinstance(r["none_tick_ratio"], (int, float)) else "-"
        lines.append(
            f"{str(r['value']):>8} {str(r['verdict']):>7} {f(r['throughput_rps'], '.1f'):>7} "
            f"{f(r['goodput_rps'], '.1f'):>7} {good:>6} {q:>17} {f(r['inference_ms_p50'], '.1f'):>11} "
            f"{f(r['network_ms_p50'], '.1f'):>7} {f(r.get('server_overhead_ms_p50'), '.1f'):>7} "
            f"{f(r['rtt_ms_p99'], '.1f'):>8} {none:>6}"
        )
    return "\n".join(lines)


def format_capacity(cap: dict) -> str:
    fig, m, n = cap["figures"], cap["formula_measured"], cap["formula_nominal"]

    def g(v, spec=".1f"):
        return format(v, spec) if isinstance(v, (int, float)) else "-"

    out = [
        f"knee (last step holding every assertion): {fig['knee']}   first failing step: {fig['first_failure']}"
        + (
            f"   without the bench's measured share: knee {fig.get('knee_without_bench')}, first failing "
            f"{fig.get('first_failure_without_bench')}"
            if (fig.get("knee_without_bench"), fig.get("first_failure_without_bench"))
            != (fig["knee"], fig["first_failure"])
            else ""
        ),
        f"N_max = min(0.8/(r*t), (H*dt/2 - RTT)/t) measured: r={g(m['r_hz'], '.2f')} Hz t={g(m['t_ms'])} ms "
        f"H={m['horizon']} dt={g(m['dt_s'], '.4f')} s RTT={g(m['rtt_ms'])} ms -> min({g(m['utilization_bound'])}, "
        f"{g(m['latency_bound'])}) = {g(m['n_max'])};  knee/N_max = {g(fig['knee_ratio'], '.2f')}",
    ]
    if n:
        out.append(
            f"N_max nominal: r={g(n['r_hz'], '.2f')} Hz t={g(n['t_ms'])} ms H={n['horizon']} dt={g(n['dt_s'], '.4f')} s "
            f"RTT={g(n['rtt_ms'])} ms -> min({g(n['utilization_bound'])}, {g(n['latency_bound'])}) = {g(n['n_max'])};  "
            f"knee/N_max = {g(fig['knee_ratio_nominal'], '.2f')}"
        )
    return "\n".join(out)


def write_sweep(
    base: Path, scenario, labels: list[str], rows: list[dict], capacity: dict | None, sweep_assertions: list[dict]
) -> Path:
    path = Path(base) / "sweep.json"
    path.write_text(
        json.dumps(
            {
                "scenario": scenario.name,
                "key": scenario.sweep["key"],
                "variants": [
                    {"label": lbl, "value": r["value"], "summary": str(Path(base) / lbl / "summary.json"), "row": r}
                    for lbl, r in zip(labels, rows)
                ],
                "capacity": capacity,
                "assertions": sweep_assertions,
            },
            indent=2,
            default=str,
        )
    )
    return path
