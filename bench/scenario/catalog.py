"""The names of every figure a run reports, what each means, and whether it is a number or a series.

Owns the vocabulary shared by assertions, summary.json, junit.xml and docs/scenarios.md.
Invariant: a figure is computed (bench.evidence.figures) under exactly the name listed here, and an
assertion can only name figures listed here; adding a figure means adding one line here and one
function in bench.evidence.figures.
"""

from __future__ import annotations

# name -> (kind, unit, doc). kind: "scalar" (a number) or "series" (one value per record; wrap it in
# p50/p95/p99/max/min/mean/count in assertions); "process_scalar" and "process_series" are one such value per
# process of the run, named with the process in brackets: `max(rss_mb[server:r0]) < 400`,
# `rss_growth_ratio[router] < 0.05` (processes: router, chaos-proxy, server:<replica>, shard:<k>, runner).
FIGURES: dict[str, tuple[str, str, str]] = {
    "robots": ("scalar", "", "robots in the run"),
    "duration_s": ("scalar", "s", "measured duration (after warmup)"),
    "ticks": ("scalar", "", "control ticks in the measured window"),
    "on_time_ticks": ("scalar", "", "ticks whose action was ready within 20 % of the period"),
    "late_ticks": ("scalar", "", "ticks later than 20 % of the period, caused by the system under test"),
    "too_late_ticks": ("scalar", "", "ticks later than one period, caused by the system under test"),
    "host_late_ticks": ("scalar", "", "late ticks caused by the bench host (the shard loop overran)"),
    "late_tick_ratio": ("scalar", "", "(late_ticks + too_late_ticks) / ticks"),
    "host_late_tick_ratio": ("scalar", "", "host_late_ticks / ticks"),
    "none_ticks": ("scalar", "", "ticks where get_action returned None"),
    "none_tick_ratio": ("scalar", "", "none_ticks / ticks"),
    "gating_ticks": (
        "scalar",
        "",
        "None ticks on a healthy link: waiting for a session's or an episode's first chunk "
        "(none_ticks = gating_ticks + hold_ticks; not a stall, not in fallback_ticks)",
    ),
    "gating_tick_ratio": ("scalar", "", "gating_ticks / ticks"),
    "fallback_ticks": ("scalar", "", "ticks served by the fallback (hold/None while stalled, zero, repeat_last)"),
    "fallback_tick_ratio": ("scalar", "", "fallback_ticks / ticks"),
    "wrong_model_actions": (
        "scalar",
        "",
        "chunk actions from a session whose checkpoint differs from the robot's first (audit lines)",
    ),
    "hold_ticks": ("scalar", "", "fallback ticks of the hold rung: None while STALLED, RECONNECTING or DEAD"),
    "repeat_last_ticks": ("scalar", "", "fallback ticks of the repeat_last rung: the last action repeated"),
    "zero_ticks": ("scalar", "", "fallback ticks of the zero rung: a zero command"),
    "staleness_violations": ("scalar", "", "executed actions older than the robot's max_action_age_s"),
    "max_action_age_s": ("scalar", "s", "oldest action executed"),
    "requests": ("scalar", "", "inference requests sent by the engines"),
    "request_errors": (
        "scalar",
        "",
        "requests that ended in an error or timeout (not superseded or abandoned at an episode reset)",
    ),
    "request_error_ratio": ("scalar", "", "request_errors / requests"),
    "goodput_requests": (
        "scalar",
        "",
        "answered requests whose rtt met the robot's latency budget: H*dt/2 (execution_horizon / fps / 2) with an RTC prefix (rtc_enabled, execution_horizon > 0), else buffer_time_s (the queue's playback left when it asked)",
    ),
    "goodput_ratio": ("scalar", "", "goodput_requests / answered requests"),
    "superseded": (
        "scalar",
        "",
        "requests superseded before they were served (the sum of the chunks' `superseded_seqs`)",
    ),
    "reconnects": ("scalar", "", "engine transitions into RECONNECTING"),
    "moves": (
        "scalar",
        "",
        "sessions the engines moved to a less loaded replica of the same checkpoint at an episode boundary "
        "(edge.remote.rebalance; failovers are reconnects, not moves)",
    ),
    "max_moves_per_robot": ("scalar", "", "the most moves one robot made"),
    "replica_load_spread": (
        "scalar",
        "",
        "max - min load (active / max sessions) across the replicas, median over the run's last 10 s",
    ),
    "rejoin_s": (
        "scalar",
        "s",
        "worst time from a restarted or added replica's return until it holds 3/4 of a fair share of the sessions "
        "(total / replicas); inf if it never did, none without such a fault",
    ),
    "dead_robots": ("scalar", "", "robots whose engine ended DEAD or failed"),
    "recovered_within_s": ("scalar", "s", "worst time from a fault window's end until every robot streams again"),
    "engine_raises": (
        "scalar",
        "",
        "engine calls (notify_observation, get_action, reset) that raised into the robot's "
        "control loop, which the engine must never do; any fails the run unless an assertion names this figure",
    ),
    "unplanned_exits": (
        "scalar",
        "",
        "replicas and routers that exited while no fault held them down (each an "
        "`unplanned_exit` in the fault log); any fails the run unless an assertion names this figure",
    ),
    "unrecovered_robots": ("scalar", "", "robots not STREAMING at the end of the run"),
    "task_success_rate": ("scalar", "", "successful episodes / finished episodes"),
    "episodes": ("scalar", "", "finished episodes"),
    "seam_step_p95": (
        "scalar",
        "",
        "p95 of |a_t - a_t-1| where a new chunk starts (bench.evidence.seams, range-scaled)",
    ),
    "seam_jerk_p95": ("scalar", "", "p95 of the third difference of actions across chunk seams (range-scaled)"),
    "seam_step_ratio": ("scalar", "", "median seam step / median within-chunk step (1 = seams invisible)"),
    "seam_jerk_ratio": ("scalar", "", "median seam jerk / median within-chunk jerk (1 = seams invisible)"),
    "server_load_max": ("scalar", "", "highest load a replica reported"),
    "server_queue_depth_max": ("scalar", "", "deepest queue a replica reported"),
    "host_cpu_percent": ("scalar", "%", "mean host CPU use (100 % = all cores)"),
    "loop_overrun_ratio": ("scalar", "", "shard loop slots whose compute exceeded their time budget"),
    "parity_queue_checks": (
        "scalar",
        "",
        "shadow groups: requests after which both engines' merged queues were compared",
    ),
    "parity_queue_mismatches": (
        "scalar",
        "",
        "shadow groups: compared requests whose merged queues (model or robot space) differ by a byte",
    ),
    "parity_action_checks": (
        "scalar",
        "",
        "shadow groups: ticks whose executed action was compared with the local engine's",
    ),
    "parity_action_mismatches": ("scalar", "", "shadow groups: compared ticks whose actions differ by a byte"),
    "parity_request_failures": (
        "scalar",
        "",
        "shadow groups: remote requests that failed (the pair restarts from empty queues)",
    ),
    "attacks": ("scalar", "", "attacks run by the scenario's attackers (bench.security.attacker), one per attack word"),
    "attack_attempts": ("scalar", "", "messages, queries, tokens or connections the attackers tried"),
    "attacks_denied": ("scalar", "", "attacks refused before any effect (router rule, TLS handshake, server proof)"),
    "attacks_contained": (
        "scalar",
        "",
        "attacks denied or contained (accepted by the transport, bounded by the server)",
    ),
    "attacks_breached": (
        "scalar",
        "",
        "attacks that worked (ground truth: a sample received, an ack, a served forgery)",
    ),
    "attack_errors": (
        "scalar",
        "",
        "attacks that could not be judged (the attacker failed); never counted as contained",
    ),
    "server_crashes": ("scalar", "", "server replicas found dead when the run stopped"),
    "security_denials": ("scalar", "", "requests the servers refused or dropped (audit lines denied:<reason>, summed)"),
    "rtt_ms": ("series", "ms", "request round trip measured by the engine (monotonic, echoed)"),
    "inference_ms": ("series", "ms", "server inference time per request"),
    "queue_wait_ms": ("series", "ms", "server queue wait per request"),
    "network_ms": ("series", "ms", "rtt - queue wait - inference: uplink_ms + downlink_ms + server_overhead_ms"),
    "server_overhead_ms": (
        "series",
        "ms",
        "the replica's time on a request outside its queue wait and inference "
        "(batch assembly, the replies' encode and send), from its audit line; "
        "bench only",
    ),
    "uplink_ms": (
        "series",
        "ms",
        "robot's send to the server's receipt (monotonic clocks joined by their measured "
        "offsets; a shard/replica pair whose clocks are unsure by over 25 % of "
        "its hop is left out; bench only)",
    ),
    "downlink_ms": (
        "series",
        "ms",
        "server's publish to the robot's receipt (monotonic clocks joined by their measured "
        "offsets; a shard/replica pair whose clocks are unsure by over 25 % of "
        "its hop is left out; bench only)",
    ),
    "uplink_to_router_ms": (
        "series",
        "ms",
        "uplink_ms up to the first router routing it (the robot's send, the site's "
        "proxy, the router's receive): the router's timestamp; local runs only",
    ),
    "uplink_from_router_ms": (
        "series",
        "ms",
        "the rest of uplink_ms: the router's forwarding and the server's receive up to its callback; local runs only",
    ),
    "downlink_to_router_ms": (
        "series",
        "ms",
        "downlink_ms up to the first router routing the chunk (the server's "
        "send, the router's receive); local runs only",
    ),
    "downlink_from_router_ms": (
        "series",
        "ms",
        "the rest of downlink_ms: the router's forwarding, the site's proxy, "
        "the robot's receive up to its callback; local runs only",
    ),
    "encode_ms": ("series", "ms", "client encode time per request, when the engine reports it"),
    "send_lag_ms": (
        "series",
        "ms",
        "from the observation's tick to the engine's worker taking it up (its wake-up; on "
        "a bench shard the workers share a process and its GIL with the control loop), "
        "per request; outside the round trip",
    ),
    "merge_lag_ms": (
        "series",
        "ms",
        "from a chunk's arrival (Zenoh's callback) to its merge into the action queue "
        "by the engine's worker, per answered request; outside the round trip",
    ),
    "delay_steps": ("series", "steps", "inference delay in control steps per request"),
    "execution_steps": (
        "series",
        "steps",
        "RTC's s per request: control steps each chunk is executed for, counted "
        "from its observation (derived from delay_steps unless buffer_time_s is set)",
    ),
    "action_age_s": ("series", "s", "age of each executed action"),
    "tick_lateness_ms": ("series", "ms", "how late each tick's action was ready"),
    "rtt_ms_p99_drift": (
        "scalar",
        "",
        "p99 rtt of the run's last window over its first, minus 1 (window: 5 min, or a "
        "sixth of a shorter run): how much slower the end is",
    ),
    "rss_mb": ("process_series", "MB", "resident memory of a process and its children, sampled every second"),
    "open_fds": ("process_series", "", "open file descriptors of a process and its children, sampled every second"),
    "rss_growth_ratio": (
        "process_scalar",
        "",
        "RSS growth after warm-up: median of the last 10 % of samples over the "
        "median of the 10 % after the first 20 %, minus 1 (a restarted process "
        "from its restart)",
    ),
    "fds_growth": ("process_scalar", "", "open descriptors at the end minus after warm-up (same windows)"),
    "rss_growth_ratio_max": (
        "scalar",
        "",
        "the largest rss_growth_ratio of the system's processes (the runner "
        "excluded: it is the bench, and it keeps the run's samples)",
    ),
    "leftover_processes": ("scalar", "", "child processes of the runner still alive after the run stopped"),
    "leftover_shm": ("scalar", "", "/dev/shm entries created during the run and still there after it stopped"),
}

STATES = ("CONNECTING", "STREAMING", "DEGRADED", "STALLED", "RECONNECTING", "DEAD", "PAUSED", "STOPPED")


def scalar_names() -> list[str]:
    return [n for n, (kind, _u, _d) in FIGURES.items() if kind == "scalar"]


def series_names() -> list[str]:
    return [n for n, (kind, _u, _d) in FIGURES.items() if kind == "series"]


def process_names() -> list[str]:
    return [n for n, (kind, _u, _d) in FIGURES.items() if kind.startswith("process_")]
