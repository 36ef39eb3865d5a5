"""The policy server's manifest: one YAML file (design 004 8.6 merged with 003's scheduling/models/clients).

    m.yaml ──► wire.yamlines ──► overrides (flags, --set) ──► pydantic validation ──► Manifest
               (every key keeps   merged into the same         types, ranges, choices, files, unknown
                its line number)  tree, marked "override"      keys, then each section's cross-field checks

The pydantic dataclasses below ARE the schema: each field's type, bounds and description drive the
validation, `Manifest.to_dict()`, the JSON Schema editors use (`policy-server schema manifest`)
and the reference table in docs/manifest.md (`python -m server.manifest --doc`). Errors are
`ManifestError`, whose text is ``file:line: dotted.key: what is wrong; what to do``: pydantic's
error records are translated here, with the line looked up in the YAML tree.

Invariants: weights load only from a local directory (a hub id is refused with the command that
downloads it); a value from `--set` or a flag goes through exactly the checks a file value does;
a validated Manifest has no "to be decided later" defaults except `trained_fps` and
`session.max_prefix_rows`, which the server takes from the checkpoint it loads.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import re
import sys
import types
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Mapping

import yaml
from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, Strict, TypeAdapter, ValidationError, model_validator
from pydantic.dataclasses import dataclass
from pydantic_core import ArgsKwargs
from pydantic_core import PydanticUndefined as MISSING

from wire import configerrors as ce, yamlines
from wire.configerrors import Doc, problem
from wire.errors import WireError
from wire.keys import sanitize, sanitize_root
from wire.suggest import closest
from wire.tensors import DEFAULT_LIMITS
from wire.transport import MAX_LEASE_MS, MIN_LEASE_MS, endpoint_problem
from wire.yamlines import OVERRIDE, LineDict

__all__ = [
    "Manifest", "ManifestError", "load_manifest", "manifest_from_dict", "apply_overrides",
    "add_cli_arguments", "overrides_from_args", "schema_doc", "json_schema",
    "ModelConfig", "EmulatedLatency", "ZenohConfig", "TlsConfig", "DebugConfig", "SchedulingConfig",
    "PipelineDispatch", "ModelsConfig", "ModelLimits", "ClientsConfig", "ClientDefaults", "KnownClient",
    "SessionConfig", "SecurityConfig", "LimitsConfig", "ResponseTracking", "DrainConfig",
]

FALLBACK_SCHEDULERS = ("round_robin", "deadline_aware", "model_deadline", "priority_tiered", "batch_optimized")
DEFAULT_EXECUTION_HORIZON = 10


class ManifestError(ValueError):
    """A manifest problem: ``source:line: dotted.key: problem; fix`` (line omitted when unknown)."""

    def __init__(self, source: str, line: int | str | None, key: str, message: str):
        self.source, self.line, self.key, self.message = source, line, key, message
        if line == OVERRIDE:
            where = f"{source} (override)"
        elif line:
            where = f"{source}:{line}"
        else:
            where = source
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")


# ---- field and value types ---------------------------------------------------------------------------------------

def _f(default: Any = MISSING, doc: str = "", *, lo: float | None = None, hi: float | None = None,
       gt: float | None = None, **meta: Any) -> Any:
    """A manifest field: `doc` explains it; lo/hi/gt bound a number; meta may hold noun, default_doc."""
    kw: dict[str, Any] = {"description": doc, "json_schema_extra": Doc(**meta)}
    for name, v in (("ge", lo), ("le", hi), ("gt", gt)):
        if v is not None:
            kw[name] = v
    if default is MISSING:
        return Field(**kw)
    if isinstance(default, (list, dict, set)):
        value = default
        return Field(default_factory=lambda: type(value)(value), **kw)
    if isinstance(default, type) and is_dataclass(default):
        return Field(default_factory=default, **kw)
    return Field(default, **kw)


class _Kind:
    """A marker in a field's type naming the check it runs (for the docs table)."""

    def __init__(self, word: str, names: Callable[[], list[str] | None] | None = None):
        self.word, self.names = word, names


def _raise(message: str) -> None:
    problem(message)


def _run_check(word: str, v: Any) -> Any:
    _CHECKS[word](v, _raise)
    return v


def _checked(word: str) -> Any:
    return Annotated[str, Strict(), AfterValidator(functools.partial(_run_check, word)), _Kind(word)]


def _in(names: Callable[[], list[str] | None]) -> Any:
    def check(v: str) -> str:
        known = names()
        if known is not None and v not in known:
            _raise(f"{v!r} is not one of {', '.join(known)}; pick one of them")
        return v
    return Annotated[str, Strict(), AfterValidator(check), _Kind("choices", names)]


def _not_nan(v: float) -> float:
    if math.isnan(v):
        _raise("must be a number, got nan")
    return v


def _one_or_many(v: Any) -> Any:
    return [v] if isinstance(v, str) else v


def _upper(v: Any) -> Any:
    return v.upper() if isinstance(v, str) else v


Int = Annotated[int, Strict()]
Num = Annotated[float, Strict(), AfterValidator(_not_nan)]
Str = Annotated[str, Strict()]
Bool = Annotated[bool, Strict()]
Checkpoint = _checked("checkpoint_dir")
File = _checked("file")
Dir = _checked("not_file")
OutFile = _checked("not_dir")
KeyChunk = _checked("key_chunk")
KeyRoot = _checked("key_root")
Endpoint = _checked("endpoint")
ListenEndpoint = _checked("listen_endpoint")  # port 0: any free port
Device = _checked("device")
Endpoints = Annotated[tuple[Endpoint, ...], BeforeValidator(_one_or_many)]
ListenEndpoints = Annotated[tuple[ListenEndpoint, ...], BeforeValidator(_one_or_many)]
Strs = Annotated[tuple[Str, ...], BeforeValidator(_one_or_many)]

_CONFIG = ConfigDict(extra="forbid")
_show, _unwrap, _markers, _bounds, _num, _range_text = ce.show, ce.unwrap, ce.markers, ce.bounds, ce.num, ce.range_text
_meta = ce.doc_meta


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class _Section:
    """Shared by every manifest section: cross-field checks after the fields, plain data, dict-style `get`."""

    @model_validator(mode="after")
    def _cross_checks(self):
        resolve = getattr(self, "_resolve", None)
        if resolve is not None:
            resolve(lambda key, message: problem(message, key))
        return self

    def _derive(self, **changes: Any) -> None:
        """Fill derived defaults while the section is being validated (it is frozen afterwards)."""
        for k, v in changes.items():
            object.__setattr__(self, k, v)

    def to_dict(self) -> dict:
        return _plain(self)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


def _plain(v: Any) -> Any:
    if is_dataclass(v):
        return {f.name: _plain(getattr(v, f.name)) for f in fields(v)}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def _scheduler_names() -> list[str]:
    try:  # the registry lives with the strategies; import late so a half-built tree still validates
        from server.scheduling import scheduler_names

        return list(scheduler_names())
    except ImportError:
        return list(FALLBACK_SCHEDULERS)


def _scoring_names() -> list[str] | None:
    try:
        from server.scheduling import scoring_names

        return list(scoring_names())
    except ImportError:
        return None  # any name; the server checks it when it builds the scheduler


# ---- the schema ------------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class ModelConfig(_Section):
    """The checkpoint this replica serves (one model per process, design 004 8.1)."""

    repo_or_path: Checkpoint = _f(doc="local checkpoint directory (config.json, model.safetensors, stats.json); "
                                      "a hub id is refused: download it first")
    revision: KeyChunk | None = _f(None, "revision in the keys and reported to clients",
                       default_doc="checkpoint's, else `main`")
    dtype: Literal["float32", "bfloat16", "float16"] = _f("float32", "weights dtype")
    device: Device = _f("cpu", "torch device: cpu, cuda or cuda:N (cuda needs a CUDA build of torch)")
    hyper_params: dict[str, Any] = _f({}, "serve the checkpoint with other sampling hyper-parameters, e.g. "
                                          "`{guidance_jacobian: identity}`: only num_steps, noise_seed, max_guidance_weight, "
                                          "guidance_jacobian, prefix_schedule, rtc_mode, autocast, batch_buckets, compile "
                                          "(the others define the trained network); checked when the model loads")

    def _resolve(self, fail: Callable[[str, str], None]) -> "ModelConfig":
        if self.revision is None:
            rev = _checkpoint_meta(self.repo_or_path).get("revision")
            self._derive(revision=rev if isinstance(rev, str) and _is_chunk(rev) else "main")
        return self


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class EmulatedLatency(_Section):
    """Accelerator time added to every forward pass on a CPU host; reported as emulated everywhere."""

    distribution: Literal["fixed", "normal", "lognormal", "uniform"] = _f("fixed", "shape of the samples",
                                                                         noun="distribution")
    mean_ms: Num = _f(0.0, "mean (fixed: the value; uniform without max_ms: range is 0..2*mean)", lo=0.0)
    std_ms: Num = _f(0.0, "standard deviation (normal, lognormal)", lo=0.0)
    min_ms: Num = _f(0.0, "lower clamp (uniform: lower bound)", lo=0.0)
    max_ms: Num = _f(math.inf, "upper clamp (uniform: upper bound)", lo=0.0)
    per_batch_item_ms: Num = _f(0.0, "added per extra session in a micro-batch", lo=0.0)
    seed: Int | None = _f(None, "RNG seed for reproducible samples; null = fresh")

    @model_validator(mode="before")
    @classmethod
    def _from_scalar(cls, v: Any) -> Any:
        """`emulated_latency: 20` is the fixed 20 ms."""
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return {"distribution": "fixed", "mean_ms": v}
        if not isinstance(v, (Mapping, ArgsKwargs, EmulatedLatency)):
            _raise(f"must be a number of ms or a mapping {{distribution, mean_ms, ...}}, got {_show(v)}")
        return v

    def _resolve(self, fail: Callable[[str, str], None]) -> "EmulatedLatency":
        if self.min_ms > self.max_ms:
            fail("min_ms", f"{self.min_ms:g} is above max_ms {self.max_ms:g}; make min_ms <= max_ms")
        return self


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class TlsConfig(_Section):
    """TLS towards the router (wire.transport.make_config); setting root_ca_certificate enables it."""

    root_ca_certificate: File | None = _f(None, "CA file that signed the router's certificate (enables TLS)")
    connect_certificate: File | None = _f(None, "this server's certificate (mTLS)")
    connect_private_key: File | None = _f(None, "its private key (mTLS)")

    def _resolve(self, fail: Callable[[str, str], None]) -> "TlsConfig":
        if bool(self.connect_certificate) != bool(self.connect_private_key):
            missing = "connect_private_key" if self.connect_certificate else "connect_certificate"
            fail(missing, "mTLS needs both connect_certificate and connect_private_key; give the other one")
        if self.connect_certificate and not self.root_ca_certificate:
            fail("root_ca_certificate", "a client certificate without root_ca_certificate does not enable TLS; "
                                        "give the CA file")
        if self.root_ca_certificate:
            from wire.transport import TlsError, TlsFiles

            try:  # expired, not PEM, key of another certificate, another CA: say so now, not at connect time
                TlsFiles(self.root_ca_certificate, self.connect_certificate, self.connect_private_key).check()
            except TlsError as exc:
                fail("connect_certificate" if self.connect_certificate else "root_ca_certificate", str(exc))
        return self


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class ZenohConfig(_Section):
    """How the server reaches the router (client mode; design 004 6.6)."""

    connect_endpoints: Endpoints = _f(doc="router endpoints, e.g. [tcp/127.0.0.1:7447] or [tls/host:7447]")
    listen_endpoints: ListenEndpoints = _f((), "endpoints this server also listens on (peers; port 0: any free "
                                                "port); usually empty")
    lease_ms: Int = _f(1000, "this session's lease: how fast the router notices the server died", lo=MIN_LEASE_MS,
                       hi=MAX_LEASE_MS)
    connect_timeout_s: Num = _f(30.0, "keep retrying an unreachable router (backoff 0.1 s doubling to 2 s) this long "
                                "before giving up with exit 2: a replica restarted while its router is busy or "
                                "restarting waits for it; 0 = one attempt", lo=0.0)
    tls: TlsConfig = _f(TlsConfig, "TLS files")

    def _resolve(self, fail: Callable[[str, str], None]) -> "ZenohConfig":
        if not self.connect_endpoints:
            fail("connect_endpoints", "needs at least one router endpoint, e.g. [tcp/127.0.0.1:7447]")
        secure = [e for e in self.connect_endpoints + self.listen_endpoints if e.startswith(("tls/", "quic/"))]
        if secure and not self.tls.root_ca_certificate:
            fail("tls", f"endpoint {secure[0]} needs zenoh.tls.root_ca_certificate; give the CA file")
        return self


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class DebugConfig(_Section):
    """Debug capture for byte-exact offline replay (`policy-server replay`)."""

    capture_dir: Dir | None = _f(None, "keep request/response batches here; null = off")
    capture_max: Int = _f(256, "newest forward passes kept (a ring of files)", lo=1)


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class PipelineDispatch(_Section):
    """Per-model dispatch loops (design 003 "Pipeline Dispatch")."""

    enabled: Bool = _f(True, "one dispatch loop per model, `max_inflight` forward passes at a time; the "
                             "legacy single loop is not implemented, so only true is accepted")

    def _resolve(self, fail: Callable[[str, str], None]) -> "PipelineDispatch":
        if not self.enabled:
            fail("enabled", "the legacy single dispatch loop is not implemented; remove the key or set true")
        return self


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class SchedulingConfig(_Section):
    """Which pending request runs next (server/scheduling.py) and how the queue overflows (003)."""

    strategy: _in(_scheduler_names) = _f("round_robin", "scheduler strategy (server.scheduling registry)")
    scoring: _in(_scoring_names) | None = _f(None, "registered scoring function for deadline_aware/model_deadline; "
                                                   "null = built-in")
    max_queue_size: Int = _f(500, "pending requests (one per session) before the overflow policy", lo=1)
    request_ttl_ms: Num = _f(5000.0, "a request waiting longer is answered EXPIRED", gt=0.0)
    overflow_policy: Literal["drop_oldest", "drop_newest", "reject"] = _f(
        "drop_oldest", "what a full queue does: evict the oldest request, refuse the new one quietly, or refuse "
                       "it with an error to the client")
    max_retries: Int = _f(0, "re-queue a failed forward pass up to N times", lo=0, hi=100)
    max_batch: Int = _f(1, "sessions per forward pass (1 = no micro-batching)", lo=1, hi=1024)
    batch_window_ms: Num = _f(2.0, "how long a partial batch waits for more sessions", lo=0.0, hi=1000.0)
    pipeline_dispatch: PipelineDispatch = _f(PipelineDispatch, "per-model dispatch loops")

    def _resolve(self, fail: Callable[[str, str], None]) -> "SchedulingConfig":
        if self.scoring is not None:
            try:
                from server.scheduling import make_scheduler
            except ImportError:
                return self
            try:
                make_scheduler(self.strategy, scoring=self.scoring)
            except (ValueError, TypeError, KeyError):
                fail("scoring", f"strategy {self.strategy} takes no scoring function; remove scoring or use "
                                "deadline_aware or model_deadline")
        return self


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class ModelLimits(_Section):
    """Dispatch concurrency of one model id."""

    max_inflight: Int = _f(1, "concurrent forward passes of this model", lo=1, hi=64)


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class ModelsConfig(_Section):
    """Per-model dispatch concurrency (003 "Pipeline Dispatch")."""

    known: dict[KeyChunk, ModelLimits] = _f({}, "per model id: {max_inflight: N}")
    default_max_inflight: Int = _f(1, "concurrent forward passes of a model not in `known`", lo=1, hi=64)


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class ClientDefaults(_Section):
    """Settings of a client that `clients.known` does not list."""

    latency_budget_ms: Num = _f(50.0, "latency budget (deadline scheduling)", gt=0.0)


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class KnownClient(_Section):
    """One enumerated client."""

    id: KeyChunk = _f(doc="client uuid (as in its keys)")
    model: KeyChunk | None = _f(None, "model id it uses; null = any")
    latency_budget_ms: Num | None = _f(None, "its latency budget; null = clients.defaults", gt=0.0)
    priority: Int = _f(0, "priority tier for priority_tiered (0 = most urgent)", lo=0, hi=1000)


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class ClientsConfig(_Section):
    """Who may open sessions and with which budget (003 "Configuration")."""

    defaults: ClientDefaults = _f(ClientDefaults, "settings of unlisted clients")
    known: tuple[KnownClient, ...] = _f((), "[{id, model, latency_budget_ms, priority}] per-client settings")
    accept_unknown: Bool = _f(True, "accept clients not in `known`")
    allowlist: Strs = _f((), "client uuids or tag=value allowed to open sessions; empty = all")

    def _resolve(self, fail: Callable[[str, str], None]) -> "ClientsConfig":
        seen: set[str] = set()
        for c in self.known:
            if c.id in seen:
                fail("known", f"client {c.id!r} is listed twice; keep one entry")
            seen.add(c.id)
        if not self.accept_unknown and not self.known:
            fail("accept_unknown", "false with no clients.known refuses every client; list clients or set true")
        return self


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class SessionConfig(_Section):
    """Session lifetime."""

    gc_grace_s: Num = _f(2.0, "a session whose client liveliness is lost is closed after this", lo=0.0, hi=3600.0)
    max_prefix_rows: Int | None = _f(None, "largest RTC prefix a client may send (rows); null = the chunk size",
                                     lo=1)


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class SecurityConfig(_Section):
    """Per-session protection (server/guard.py; docs/security.md): identity proofs and limits."""

    require_session_auth: Bool = _f(True, "observations and resets must carry the session's auth tag (wire.auth); "
                                          "false accepts untagged ones (old clients; no identity binding)")
    max_observation_bytes: Int | None = _f(None, "largest observation body a session may send (answered TOO_LARGE); "
                                                 "null = limits.max_message_bytes", lo=1024)
    max_request_rate_hz: Num = _f(100.0, "observations per second one session may send (token bucket, answered "
                                           "RATE_LIMITED); 0 = no limit", lo=0.0)
    request_burst: Int | None = _f(None, "token bucket depth; null = one second of max_request_rate_hz", lo=1)
    max_sessions_per_client: Int = _f(4, "sessions one client uuid may hold on this replica (answered "
                                         "TOO_MANY_SESSIONS)", lo=1, hi=1000)
    reopen_idle_s: Num = _f(5.0, "a session without observations for this long (or whose client token is gone) "
                                   "may be replaced by an open without previous_auth", gt=0.0)


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class LimitsConfig(_Section):
    """Decoder size limits (wire.tensors.Limits, field for field)."""

    max_message_bytes: Int = _f(DEFAULT_LIMITS.max_message_bytes, "largest observation body", lo=1024)
    max_tensors: Int = _f(DEFAULT_LIMITS.max_tensors, "tensors per message", lo=1)
    max_rank: Int = _f(DEFAULT_LIMITS.max_rank, "dimensions per tensor", lo=1)
    max_elements: Int = _f(DEFAULT_LIMITS.max_elements, "elements per tensor", lo=1)
    max_images: Int = _f(DEFAULT_LIMITS.max_images, "images per message", lo=0)
    max_image_pixels: Int = _f(DEFAULT_LIMITS.max_image_pixels, "pixels per image", lo=1)
    max_string_chars: Int = _f(DEFAULT_LIMITS.max_string_chars, "characters per string (task)", lo=1)
    max_map_entries: Int = _f(DEFAULT_LIMITS.max_map_entries, "entries per map", lo=1)
    max_list_items: Int = _f(DEFAULT_LIMITS.max_list_items, "items per list", lo=1)


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class ResponseTracking(_Section):
    """How the server follows each client's request cadence."""

    cadence_alpha: Num = _f(0.3, "EWMA weight of a session's request cadence", gt=0.0, hi=1.0)
    disconnect_timeout_s: Num = _f(10.0, "a session without observations for this long is closed; 0 = never",
                                     lo=0.0)


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class DrainConfig(_Section):
    """SIGTERM behaviour."""

    timeout_s: Num = _f(10.0, "longest wait for the work in flight before exiting", lo=0.0, hi=3600.0)


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class DispatchConfig(_Section):
    """Where a model's forward passes run (design 003 "Dispatcher ... LocalDispatcher or RayDispatcher"). Sessions,
    validation, mailboxes, scheduling, micro-batching and the per-session processors stay in this process
    either way; with `ray_serve` each micro-batch's forward pass (RTC guidance included) goes to a Ray Serve
    deployment of the same checkpoint (server.dispatch, docs/server.md "Dispatch on Ray Serve")."""

    backend: Literal["local", "ray_serve"] = _f("local", "`local`: this process's torch; `ray_serve`: a Ray Serve "
                                                         "deployment (needs the `cluster` extra)")
    replicas: Int = _f(1, "Serve replicas of the model (ray_serve)", lo=1, hi=1024)
    gpus_per_replica: Num = _f(0.0, "GPUs each Serve replica reserves (ray_serve; 1 for a cuda model)", lo=0.0)
    cpus_per_replica: Num = _f(1.0, "CPUs each Serve replica reserves (ray_serve)", gt=0.0)
    max_inflight: Int = _f(4, "forward passes one Serve replica runs at once; beyond replicas x this, micro-batches "
                              "wait here, in the mailbox, where queue depth and capacity refusals show it", lo=1, hi=1024)
    address: Str | None = _f(None, "Ray cluster address (ray_serve); null = RAY_ADDRESS, else a local Ray started "
                                   "by this process")


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class ServedModel(_Section):
    """What one served model is: the top level of a manifest, and each entry of `extra_models`."""

    model: ModelConfig = _f(doc="the checkpoint")
    model_id: KeyChunk | None = _f(None, "model id in the keys (unique in the process)",
                       default_doc="checkpoint directory name")
    default_task: Str = _f("", "task used when a client sends none")
    pin_task: Bool = _f(False, "refuse sessions asking for another task than default_task")
    serving_mode: Literal["shared", "exclusive"] = _f(
        "shared", "shared: many sessions; exclusive: one (forced for chunk-stateful policies)")
    max_sessions: Int = _f(8, "capacity; session opens beyond it get CAPACITY with the load", lo=1, hi=100000)
    warmup_inferences: Int = _f(2, "dummy forward passes before the replica declares itself ready", lo=0, hi=1000)
    allow_resampling: Bool = _f(False, "accept clients whose control rate differs from the trained fps (each chunk "
                                       "then plays at the client's rate, stretched or squeezed in time; the ack "
                                       "warns); false = refuse them with FPS_MISMATCH")
    trained_fps: Num | None = _f(None, "override the checkpoint's trained fps; null = the checkpoint's", gt=0.0)
    execution_horizon: Int | None = _f(None, "RTC prefix rows", lo=1, default_doc="checkpoint's, else 10")
    emulated_latency: EmulatedLatency | None = _f(None, "emulated accelerator time per forward pass: ms, or a mapping; "
                                                        "null = none")
    dispatch: DispatchConfig = _f(DispatchConfig, "where forward passes run: here, or on Ray Serve")

    def _resolve(self, fail: Callable[[str, str], None]):
        return _resolve_model_fields(self, fail)


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class ExtraModel(ServedModel):
    """Another model this process serves beside `model` (same replica_id, router, scheduling, clients,
    limits, health port and audit log). Fields left out take their defaults, not the top level's."""


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class Manifest(ServedModel):
    """One policy server replica: `load_manifest(path, overrides)` or `Manifest.from_dict(d)`."""

    replica_id: KeyChunk = _f("r0", "replica id in the keys (replicas of a model share a router)")
    root: KeyRoot = _f("@fleet", "the verbatim root key chunk")
    extra_models: tuple[ExtraModel, ...] = _f((), "more models served by this process, each with its own sessions, "
                                                   "mailbox and dispatch loop (started at its first request)")
    torch_threads: Int = _f(1, "torch intra-op threads (1 keeps a 2-core host responsive)", lo=1, hi=1024)
    dispatch_priority: Literal["normal", "nice", "fifo"] = _f(
        "normal", "the dispatch loops' scheduling: fifo = SCHED_FIFO 4 (falls back to nice -10 where the host "
        "refuses real-time, then to normal), nice = nice -10; the log line 'dispatch priority:' says what took "
        "effect. The bench leaves it normal: raised, its replicas starved its shards on 2 cores (docs/bench.md)")
    zenoh: ZenohConfig = _f(doc="router connection")
    health_port: Int | None = _f(0, "HTTP /healthz /readyz /metrics /sessions port; 0 = any free port, -1 or null = off",
                                 lo=-1, hi=65535)
    health_host: Str = _f("127.0.0.1", "address the health server binds")
    audit_path: OutFile | None = _f(None, "JSON-lines audit log (one line per request); null = off")
    log_level: Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR"], BeforeValidator(_upper)] = _f(
        "INFO", "server log level")
    debug: DebugConfig = _f(DebugConfig, "debug capture")
    scheduling: SchedulingConfig = _f(SchedulingConfig, "scheduling")
    models: ModelsConfig = _f(ModelsConfig, "per-model dispatch")
    clients: ClientsConfig = _f(ClientsConfig, "clients")
    session: SessionConfig = _f(SessionConfig, "sessions")
    limits: LimitsConfig = _f(LimitsConfig, "decoder limits")
    security: SecurityConfig = _f(SecurityConfig, "per-session identity binding and limits")
    response_tracking: ResponseTracking = _f(ResponseTracking, "cadence and disconnects")
    drain: DrainConfig = _f(DrainConfig, "drain on SIGTERM")

    @classmethod
    def from_dict(cls, data: Mapping, source: str = "<dict>") -> "Manifest":
        """Validate plain data (no line numbers); raises ManifestError."""
        return _build(cls, data, "", None, source)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def _resolve(self, fail: Callable[[str, str], None]) -> "Manifest":
        resolved = super()._resolve(fail)
        seen = {resolved.model_id: "model"}
        for i, extra in enumerate(resolved.extra_models):
            if extra.model_id in seen:
                fail("extra_models", f"extra_models[{i}] has model_id {extra.model_id!r}, already served by "
                                     f"{seen[extra.model_id]}; give each model its own model_id")
            seen[extra.model_id] = f"extra_models[{i}]"
        mob = resolved.security.max_observation_bytes
        if mob is not None and mob > resolved.limits.max_message_bytes:
            fail("security", f"max_observation_bytes {mob} exceeds limits.max_message_bytes "
                             f"{resolved.limits.max_message_bytes} (the decoder refuses larger bodies anyway); lower it")
        return resolved

    def for_model(self, model_id: str) -> "Manifest":
        """The manifest as one served model sees it: `model_id` and its fields in the top-level places,
        every process-wide section unchanged, no extra models."""
        if model_id == self.model_id:
            return dataclasses.replace(self, extra_models=()) if self.extra_models else self
        for extra in self.extra_models:
            if extra.model_id == model_id:
                return dataclasses.replace(self, extra_models=(), **{f.name: getattr(extra, f.name) for f in fields(ServedModel)})
        raise KeyError(f"model {model_id!r} is not in this manifest (serves {', '.join(self.model_ids)})")

    @property
    def model_ids(self) -> list[str]:
        return [self.model_id, *(e.model_id for e in self.extra_models)]


def _resolve_model_fields(section, fail: Callable[[str, str], None]):
    """model_id from the checkpoint directory name, execution_horizon from the checkpoint (Manifest and ExtraModel)."""
    meta = _checkpoint_meta(section.model.repo_or_path)
    changes: dict[str, Any] = {}
    if section.model_id is None:
        name = Path(os.path.abspath(section.model.repo_or_path)).name
        try:
            changes["model_id"] = name if _is_chunk(name) else sanitize(name, "model_id", slugify=True)
        except WireError:
            fail("model_id", f"the directory name {name!r} makes no model id; give model_id")
    horizon = section.execution_horizon
    if horizon is None:
        h = meta.get("execution_horizon")
        horizon = changes["execution_horizon"] = h if isinstance(h, int) and h >= 1 else DEFAULT_EXECUTION_HORIZON
    chunk = meta.get("chunk_size")
    if isinstance(chunk, int) and horizon > chunk:
        fail("execution_horizon", f"{horizon} exceeds the checkpoint's chunk_size {chunk}; use at most {chunk}")
    section._derive(**changes)
    return section


manifest_from_dict = Manifest.from_dict



# ---- value checks keyed by the `check` word ---------------------------------------------------------------------

_DEVICE_RE = re.compile(r"^(cpu|cuda|cuda:\d+)$")


def _check_checkpoint_dir(v: str, fail) -> None:
    if not v:
        fail("must be a non-empty path to a local checkpoint directory")
    if os.path.isdir(v):
        return
    if os.path.exists(v):
        fail(f"{v!r} is a file; give the checkpoint directory that holds config.json, model.safetensors, stats.json")
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", v) and not v.startswith("."):
        fail(f"{v!r} is not a local directory. Weights load only from local paths: download it first "
             f"(`huggingface-cli download {v} --local-dir checkpoints/{v.split('/')[-1]}`) and give that path")
    fail(f"directory {v!r} does not exist (relative paths start at {os.getcwd()}); give a local checkpoint directory")


def _check_file(v: str, fail) -> None:
    if not os.path.isfile(v):
        fail(f"file {v!r} does not exist; check the path (relative paths start at {os.getcwd()})")


def _check_not_file(v: str, fail) -> None:
    if os.path.isfile(v):
        fail(f"{v!r} is a file; give a directory (created if missing)")


def _check_not_dir(v: str, fail) -> None:
    if os.path.isdir(v):
        fail(f"{v!r} is a directory; give a file path (created if missing)")


def _check_key_chunk(v: str, fail) -> None:
    try:
        sanitize(v, "value")
    except WireError as exc:
        fail(f"{str(exc).split('] ', 1)[-1]}; rename it")


def _check_key_root(v: str, fail) -> None:
    try:
        sanitize_root(v)
    except WireError as exc:
        fail(f"{str(exc).split('] ', 1)[-1]}; e.g. @fleet")


def _check_endpoint(v: str, fail) -> None:
    why = endpoint_problem(v)  # the edge's config checks its endpoints with the same rule
    if why:
        fail(why)


def _check_listen_endpoint(v: str, fail) -> None:
    why = endpoint_problem(v, listen=True)
    if why:
        fail(why)


def _cuda_device_count() -> int | None:
    """CUDA devices torch sees; None when torch is not installed (a seam for tests)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _check_device(v: str, fail) -> None:
    if not _DEVICE_RE.match(v):
        fail(f"{v!r} is not a device; use cpu, cuda or cuda:N")
    if v == "cpu":
        return
    n = _cuda_device_count()
    if n is None:
        fail("torch is not installed; `pip install fleet-inference[server]` or use device: cpu")
    if n == 0:
        fail(f"{v!r} but this torch has no CUDA device (build or driver); use device: cpu, "
             "or install a CUDA build of torch on a GPU host")
    idx = int(v.split(":")[1]) if ":" in v else 0
    if idx >= n:
        fail(f"{v!r} but torch sees {n} CUDA device(s); use cuda:0..cuda:{n - 1} (or CUDA_VISIBLE_DEVICES)")


def device_problem(device: str) -> str | None:
    """Why a model cannot run on `device` on this host (the manifest's `device` rule), or None."""
    problems: list[str] = []

    class _Refused(Exception):
        pass

    def fail(message: str) -> None:
        problems.append(message)
        raise _Refused

    try:
        _check_device(device, fail)
    except _Refused:
        pass
    return problems[0] if problems else None


_CHECKS: dict[str, Callable[[str, Callable[[str], None]], None]] = {
    "checkpoint_dir": _check_checkpoint_dir,
    "file": _check_file,
    "not_file": _check_not_file,
    "not_dir": _check_not_dir,
    "key_chunk": _check_key_chunk,
    "key_root": _check_key_root,
    "endpoint": _check_endpoint,
    "listen_endpoint": _check_listen_endpoint,
    "device": _check_device,
}


def _is_chunk(s: str) -> bool:
    try:
        sanitize(s)
        return True
    except WireError:
        return False


def _checkpoint_meta(directory: str) -> dict:
    """config.json of the checkpoint when it reads as JSON, else {} (loading it is the server's job)."""
    try:
        meta = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}

# ---- pydantic's error records -> ManifestError -------------------------------------------------------------------

def _all_leaf_paths(cls: type, prefix: str = "") -> list[str]:
    out = []
    for name, info in cls.__pydantic_fields__.items():
        tp = ce.unwrap(info.annotation)[0]
        p = f"{prefix}{name}"
        out.extend(_all_leaf_paths(tp, p + ".") if is_dataclass(tp) else [p])
    return out


def _unknown_key_hint(cls: type, key: str, path: str) -> str:
    here = list(cls.__pydantic_fields__)
    elsewhere = [p for p in _all_leaf_paths(Manifest) if p.rsplit(".", 1)[-1] == key]
    if elsewhere:
        return f"did you mean {elsewhere[0]}?"
    close = closest(key, here)
    if close:
        return f"did you mean {path + '.' if path else ''}{close}?"
    close = closest(key, _all_leaf_paths(Manifest), cutoff=0.75)
    if close:
        return f"did you mean {close}?"
    return f"known keys here: {', '.join(here)}"


def _unknown_key(cls: type, key: str, path: str) -> str:
    return f"unknown key; {_unknown_key_hint(cls, key, path)}"


def _build(cls: type, raw: Any, path: str, loc: int | str | None, source: str):
    """Validate `raw` (plain or line-tracking data) as `cls`; the first problem becomes a ManifestError
    naming `source`, the line of the key (or of the nearest key above it) and the dotted key."""
    prefix = tuple(p for p in path.split(".") if p) if path else ()
    try:
        return _adapter(cls).validate_python(raw)
    except ValidationError as exc:
        where, line, message = ce.locate(cls, exc, raw, _unknown_key, loc)
        raise ManifestError(source, line, ce.dotted(prefix + where) or (path or "(top level)"), message) from None


@functools.cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


# ---- YAML with line numbers: wire.yamlines (shared with the scenario language) -------------------------------------

def _parse(text: str, source: str) -> Any:
    try:
        return yamlines.load(text)
    except yamlines.YamlError as exc:
        raise ManifestError(source, exc.line or None, "", f"not valid YAML: {exc.problem}; fix it at that line") from None


# ---- loading and overrides ---------------------------------------------------------------------------------------

def validate_manifest(raw: Mapping[str, Any], source: str) -> Manifest:
    """A manifest given as data (a bench replica's, merged from its scenario): validated as a file would be;
    ManifestError names `source`, the dotted key and the fix."""
    return _build(Manifest, raw, "", None, source)


def load_manifest(path: str | os.PathLike, overrides: list[str] | Mapping[str, Any] | None = None) -> Manifest:
    """Read `path`, apply `overrides` (later wins), validate; raise ManifestError naming file, line, key, fix."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ManifestError(source, None, "", f"cannot read the manifest: {exc.strerror}; check the path") from None
    except UnicodeDecodeError as exc:
        raise ManifestError(source, None, "", f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
                                              "give a YAML manifest saved as UTF-8") from None
    raw = _parse(text, source)
    if raw is None:
        raise ManifestError(source, None, "", "the manifest is empty; start from examples/manifests/minimal.yaml")
    if not isinstance(raw, Mapping):
        raise ManifestError(source, 1, "", f"the manifest must be a YAML mapping of keys, got {_show(raw)}")
    apply_overrides(raw, overrides, source)
    return _build(Manifest, raw, "", None, source)


def apply_overrides(raw: dict, overrides: list[str] | Mapping[str, Any] | None, source: str = "<override>") -> dict:
    """Apply `--set a.b=value` strings (value read as YAML) or a {dotted.key: value} mapping to `raw`, in order.

    A mapping value merges into an existing mapping; anything else replaces. Touched keys are
    marked as overridden, so errors about them say so instead of naming a file line."""
    if not overrides:
        return raw
    items = list(overrides.items()) if isinstance(overrides, Mapping) else [_split(o) for o in overrides]
    for dotted, value in items:
        parts = str(dotted).split(".")
        if not all(parts):
            raise ManifestError(source, OVERRIDE, str(dotted), "is not a dotted key like scheduling.max_batch")
        cur = raw
        for i, p in enumerate(parts[:-1]):
            nxt = cur.get(p)
            if nxt is None:
                nxt = LineDict()
                _set(cur, p, nxt)
            elif not isinstance(nxt, dict):
                raise ManifestError(source, OVERRIDE, ".".join(parts[: i + 1]),
                                    f"is {_show(nxt)}, not a mapping, so {dotted} cannot be set; override "
                                    f"{'.'.join(parts[: i + 1])} itself")
            cur = nxt
        _merge(cur, parts[-1], value)
    return raw


def _set(m: dict, key: str, value: Any) -> None:
    m[key] = value
    if isinstance(m, LineDict):
        m.key_lines[key] = OVERRIDE


def _merge(m: dict, key: str, value: Any) -> None:
    old = m.get(key)
    if isinstance(value, Mapping) and isinstance(old, dict):
        for k, v in value.items():
            _merge(old, k, v)
    else:
        _set(m, key, dict(value) if isinstance(value, Mapping) else value)


def _split(text: str) -> tuple[str, Any]:
    key, sep, value = str(text).partition("=")
    if not sep or not key.strip():
        raise ManifestError("--set", None, "", f"{text!r} is not KEY=VALUE (e.g. scheduling.max_batch=8)")
    if not value.strip():
        return key.strip(), None
    try:
        return key.strip(), yaml.safe_load(value)
    except yaml.YAMLError:
        return key.strip(), value



# ---- command-line flags ------------------------------------------------------------------------------------------

# (flag, dotted key, argparse type, metavar, help): single common fields; `--set` reaches everything else.
_FLAGS: list[tuple[str, str, Callable, str, str]] = [
    ("--model-path", "model.repo_or_path", str, "DIR", "local checkpoint directory"),
    ("--model-id", "model_id", str, "ID", "model id in the keys"),
    ("--replica-id", "replica_id", str, "ID", "replica id in the keys"),
    ("--max-sessions", "max_sessions", int, "N", "session capacity"),
    ("--health-port", "health_port", int, "PORT", "health/metrics port (0 = any, -1 = off)"),
    ("--serving-mode", "serving_mode", str, "MODE", "shared or exclusive"),
    ("--scheduler", "scheduling.strategy", str, "NAME", "scheduler strategy"),
    ("--max-batch", "scheduling.max_batch", int, "N", "sessions per forward pass"),
    ("--emulated-latency-ms", "emulated_latency", float, "MS", "emulated accelerator ms per forward pass (fixed)"),
    ("--audit-path", "audit_path", str, "FILE", "JSON-lines audit log"),
    ("--capture-dir", "debug.capture_dir", str, "DIR", "debug capture directory"),
]


def _dest(key: str) -> str:
    return "ov_" + key.replace(".", "__")


def add_cli_arguments(ap: argparse.ArgumentParser) -> None:
    """Add the override flags (a group) to `ap`; read them back with `overrides_from_args`."""
    g = ap.add_argument_group("manifest overrides (checked like the file; the file, then flags, then --set)")
    for flag, key, typ, metavar, help_ in _FLAGS:
        g.add_argument(flag, dest=_dest(key), type=typ, default=None, metavar=metavar, help=f"{help_} ({key})")
    g.add_argument("--connect", dest=_dest("zenoh.connect_endpoints"), action="append", default=None,
                   metavar="ENDPOINT", help="router endpoint, repeatable; replaces zenoh.connect_endpoints")
    g.add_argument("--set", dest="ov_set", action="append", default=[], metavar="KEY=VALUE",
                   help="any manifest key, value read as YAML, e.g. --set drain.timeout_s=5")


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """{dotted.key: value} from the flags `add_cli_arguments` added; `--set` entries come last and win."""
    out: dict[str, Any] = {}
    for _flag, key, _typ, _metavar, _help in _FLAGS:
        v = getattr(args, _dest(key), None)
        if v is not None:
            out[key] = v
    connect = getattr(args, _dest("zenoh.connect_endpoints"), None)
    if connect:
        out["zenoh.connect_endpoints"] = list(connect)
    for text in getattr(args, "ov_set", None) or []:
        k, v = _split(text)
        out.pop(k, None)  # re-insert so dict order keeps "--set last"
        out[k] = v
    return out



# ---- reference documentation and JSON Schema ---------------------------------------------------------------------

_KIND_TEXT = {"checkpoint_dir": "directory", "file": "file", "not_file": "str", "not_dir": "str",
              "endpoint": "endpoint", "listen_endpoint": "endpoint", "key_chunk": "key chunk", "key_root": "@chunk", "device": "cpu \\| cuda \\| cuda:N"}


def _type_text(tp: Any, info: Any) -> str:
    marks = _markers(tp) + list(getattr(info, "metadata", ()) or ())
    tp, nullable = _unwrap(tp)
    nullable = nullable and not _meta(info).get("default_doc")
    origin = typing.get_origin(tp)
    if origin is Literal:
        text = " \\| ".join(typing.get_args(tp))
    elif origin is tuple:
        text = f"list of {_type_text(typing.get_args(tp)[0], None)}"
    elif origin is dict:
        text = "mapping"
    elif is_dataclass(tp):
        text = "number (ms) or mapping" if tp is EmulatedLatency else "mapping"
    else:
        text = {bool: "bool", int: "int", float: "float", str: "str"}[tp]
        for m in marks:
            if isinstance(m, _Kind) and m.word in _KIND_TEXT:
                text = _KIND_TEXT[m.word]
            elif isinstance(m, _Kind) and m.word == "choices" and m.names() is not None:
                text = " \\| ".join(m.names())
        lo, hi, gt = _bounds(info)
        if lo is not None or hi is not None or gt is not None:
            text += " " + _range_text(lo, hi, gt)
    return text + (" or null" if nullable else "")


def _default_text(info: Any) -> str:
    meta = _meta(info)
    if meta.get("default_doc"):
        return meta["default_doc"]
    if info.is_required():
        return "**required**"
    v = info.default_factory() if info.default is MISSING else info.default
    if is_dataclass(v):
        return ""
    if v is None:
        return "null"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return f"`{json.dumps(_plain(v))}`" if not isinstance(v, str) else f"`{v}`" if v else '`""`'


def schema_doc() -> str:
    """The manifest reference table (the generated part of docs/manifest.md)."""
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]

    def walk(cls: type, prefix: str) -> None:
        for name, info in cls.__pydantic_fields__.items():
            key = f"{prefix}{name}"
            tp = _unwrap(info.annotation)[0]
            doc = (info.description or "").replace("|", "\\|")
            origin = typing.get_origin(tp)
            if is_dataclass(tp) and tp is not EmulatedLatency:
                walk(tp, key + ".")
                continue
            rows.append(f"| `{key}` | {_type_text(info.annotation, info)} | {_default_text(info)} | {doc} |")
            if is_dataclass(tp):
                walk(tp, key + ".")
            elif origin is dict and is_dataclass(_unwrap(typing.get_args(tp)[1])[0]):
                walk(_unwrap(typing.get_args(tp)[1])[0], key + ".<model_id>.")
            elif origin is tuple and is_dataclass(_unwrap(typing.get_args(tp)[0])[0]):
                walk(_unwrap(typing.get_args(tp)[0])[0], key + "[].")

    walk(Manifest, "")
    return "\n".join(rows)


def json_schema() -> dict:
    """The manifest as JSON Schema (draft 2020-12), for editors (docs/manifest.md "Editor support").

    It checks shapes, types, bounds and fixed choices; what needs the file system or the plugin
    registries (files exist, scheduler names, cross-field rules) only `load_manifest` checks."""
    schema = ce.finite(_adapter(Manifest).json_schema())
    defs = schema.setdefault("$defs", {})
    # what the validators accept beyond the field's type: a number for emulated_latency, a single
    # string for a list of strings, the log level in any case
    for owner in [schema, *defs.values()]:
        for name, prop in owner.get("properties", {}).items():
            if name == "emulated_latency":
                prop["anyOf"] = [{"type": "number", "minimum": 0}, *prop.get("anyOf", [])]
            elif name in ("connect_endpoints", "listen_endpoints", "allowlist"):
                prop["anyOf"] = [{"type": "string"}, {k: prop.pop(k) for k in ("type", "items") if k in prop}]
            elif name == "log_level" and "enum" in prop:
                prop["enum"] = prop["enum"] + [v.lower() for v in prop["enum"]]
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "fleet-inference policy server manifest"
    return schema


if __name__ == "__main__":
    if sys.argv[1:] == ["--doc"]:
        print(schema_doc())
    elif sys.argv[1:] == ["--json-schema"]:
        print(json.dumps(json_schema(), indent=2))
    elif len(sys.argv) >= 2 and sys.argv[1] == "--check":
        try:
            print(load_manifest(sys.argv[2], sys.argv[3:]).to_yaml(), end="")
        except (ManifestError, IndexError) as exc:
            print(f"server.manifest: {exc}", file=sys.stderr)
            raise SystemExit(2)
    else:
        print("usage: python -m server.manifest --doc | --json-schema | --check M.YAML [KEY=VALUE ...]")
