"""A replica's policy-server manifest as a scenario sets it (server.manifest keys), shared by the runner, which
adds the run's own keys (router, ports, audit log, certificates), and the cost model, which prices the replica.

    scenario.servers.manifest ─┐
    replica's own manifest ────┴─► overrides (dotted keys expanded, the replica's win) ─► merged over
    {model.repo_or_path: the checkpoint, the run's keys, emulated_latency}

Invariant: the runner and bench.run.sizing see the same model, scheduling and runtime keys for a replica, and
`check_on_disk` checks that manifest with the server's own schema before any process starts (`bench validate` and
`bench run`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def plain(v):
    """Mappings and lists as plain dicts and lists (a YAML mapping is a LineDict)."""
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [plain(x) for x in v]
    return v


def undot(d: dict) -> dict:
    """{"a.b": 1, "c": {"d": 2}} -> {"a": {"b": 1}, "c": {"d": 2}}."""
    out: dict = {}
    for k, v in (d or {}).items():
        parts = str(k).split(".")
        cur = out
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = undot(v) if isinstance(v, dict) else v
    return out


def deep_merge(base: dict, extra: dict) -> dict:
    """`extra` merged into `base` (nested mappings key by key, anything else replaced); returns `base`."""
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            deep_merge(base[k], v)
        else:
            base[k] = v
    return base


def overrides(scenario, replica) -> dict:
    """The scenario's `servers.manifest` with the replica's own `manifest` over it."""
    return deep_merge(
        undot(plain(dict(getattr(scenario, "server_manifest", None) or {}))),
        undot(plain(dict(getattr(replica, "manifest", None) or {}))),
    )


REPLICA_PRIORITY_ENV = "BENCH_REPLICA_PRIORITY"
PRIORITIES = ("fifo", "nice", "normal")


def replica_priority() -> str:
    """The replicas' `dispatch_priority` in a bench run: `normal` unless BENCH_REPLICA_PRIORITY names another (a
    scenario's `servers.manifest` may set it too, and wins). Not `fifo` by default: on 2 cores the shards'
    engine workers then wait behind the replicas while holding their shard's GIL, and the shards' real-time loops
    wait for that GIL (host-late ticks 6-19 % against 2-3.5 % in the full headline, docs/bench.md "The replicas'
    priority"); a starved replica's share is measured and taken off its figures instead (bench.evidence.replay)."""
    want = os.environ.get(REPLICA_PRIORITY_ENV, "normal")
    if want not in PRIORITIES:
        raise ValueError(f"{REPLICA_PRIORITY_ENV}={want!r}: expected one of {', '.join(PRIORITIES)}")
    return want


def replica_manifest(scenario, replica, run_keys: dict | None = None) -> dict:
    """The manifest of `replica`: its checkpoint, `run_keys` (what only a run knows), its emulated latency, and
    the scenario's overrides over them."""
    from bench.scenario.load import checkpoint_dir

    m: dict = {}
    if getattr(replica, "checkpoint", None):
        m["model"] = {"repo_or_path": str(checkpoint_dir(replica.checkpoint))}
    m.update(run_keys or {})
    if getattr(replica, "emulated_latency", None) is not None:
        m["emulated_latency"] = plain(replica.emulated_latency)
    return deep_merge(m, overrides(scenario, replica))


REPLICA_START_S = 120.0  # import torch, load the checkpoint, warm up, open the Zenoh session
# torch.compile of the velocity network at warm-up, every batch bucket up to max_batch with and without an RTC prefix
# (flow_transformer's `compile`, ModelRuntime.warm_buckets): measured at ~25 s a bucket and signature for vla_300m on
# the H200 (docs/results/2026-11-27-accelerator-lease-2-h200.md, benchmarks.gpu_forward --compile, two buckets of two signatures in 172 s with their timing),
# five buckets for the preset; ~10-25 s each for the tiny transformer on the 2-core VM, seven default buckets
REPLICA_COMPILE_START_S = 600.0


def replica_start_s(manifest: dict) -> float:
    """How long a replica of `manifest` may take to say it is ready: longer where its model compiles (`compile`
    in the manifest's `model.hyper_params`, else in the checkpoint's config.json), on a CUDA device or a CPU."""
    from bench.scenario.load import checkpoint_config

    model = manifest.get("model") or {}
    compile_ = (model.get("hyper_params") or {}).get("compile")
    if compile_ is None and model.get("repo_or_path"):
        compile_ = (checkpoint_config(model["repo_or_path"]).get("hyper_params") or {}).get("compile")
    return REPLICA_COMPILE_START_S if compile_ else REPLICA_START_S


def check_replica_manifests(scenario) -> None:
    """Raise ScenarioError at the first replica whose manifest (`servers.manifest`, its own `manifest`, merged over its
    checkpoint as a run merges them) the policy server would refuse: an unknown key, a bad value. Found now, not by a
    replica that exits before ready. Needs every checkpoint on disk (check_checkpoints_present first); the device is
    left to the run's CUDA check, the run's own keys (router, ports) are placeholders."""
    from bench.scenario.load import ScenarioError
    from server.manifest import ManifestError, validate_manifest
    from wire.yamlines import line_at

    def line(*path) -> int:
        return line_at(scenario.raw, path, 0) or 0

    for j, r in enumerate(scenario.replicas):
        run_keys = {
            "model_id": r.model_id,
            "replica_id": r.id,
            "max_sessions": r.max_sessions,
            "zenoh": {"connect_endpoints": ["tcp/127.0.0.1:7447"]},
        }
        manifest = replica_manifest(scenario, r, run_keys)
        if str((manifest.get("model") or {}).get("device", "cpu")).startswith("cuda"):
            manifest["model"]["device"] = "cpu"  # whether this host has CUDA is the run's check (cuda_problems)
        try:
            validate_manifest(manifest, f"servers.replicas[{r.id}]")
        except ManifestError as exc:
            first = exc.key.split(".")[0].split("[")[0]
            own = _override_key(r.manifest, first)
            shared = _override_key(scenario.server_manifest, first)
            if own is not None:
                where, scope = ("servers", "replicas", j, "manifest", own), "its manifest"
            elif shared is not None:
                where, scope = ("servers", "manifest", shared), "servers.manifest"
            else:  # a key the bench writes (its checkpoint's, the run's)
                where, scope = ("servers", "replicas", j), "the manifest the bench writes for it"
            raise ScenarioError(
                scenario.source,
                line(*where) or line(*where[:-1]) or line("servers"),
                f"servers.replicas[{r.id}]",
                f"{scope}: {exc.key + ': ' if exc.key else ''}{exc.message}",
            ) from None


def _override_key(d: Mapping | None, first: str) -> str | None:
    """The key of a manifest override that sets `first` (itself, or a dotted one: `scheduling.max_batch`)."""
    return next((str(k) for k in (d or {}) if str(k).split(".")[0] == first), None)


def check_on_disk(scenario) -> None:
    """What a run needs on disk, before any process: every checkpoint (bench.scenario.load.check_checkpoints_present)
    and every replica manifest, for the scenario and for every run of its sweep (a sweep over a checkpoint or a
    manifest key), a run's problem blamed on its `sweep.values[i]`."""
    from bench.scenario.load import ScenarioError, check_checkpoints_present, sweep_variants
    from wire.yamlines import line_at

    check_checkpoints_present(scenario)
    check_replica_manifests(scenario)
    if not scenario.sweep:
        return
    key = scenario.sweep["key"]
    for i, (_, variant) in enumerate(sweep_variants(scenario)):
        try:
            check_checkpoints_present(variant)
            check_replica_manifests(variant)
        except ScenarioError as exc:
            value = scenario.sweep["values"][i]
            raise ScenarioError(
                scenario.source,
                line_at(scenario.raw, ("sweep", "values", i), 0) or 0,
                f"sweep.values[{i}]",
                f"with {key} = {value!r}: {exc.path + ': ' if exc.path else ''}{exc.message}",
            ) from None
