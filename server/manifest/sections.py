"""The manifest's schema: one frozen pydantic dataclass per section, `Manifest` at the top, and the
translation of pydantic's error records into `ManifestError` (``file:line: dotted.key: problem; fix``).

Each field's type, bounds and description drive the validation, `Manifest.to_dict()`, the JSON Schema
and the reference table of docs/manifest.md (server/manifest/doc.py). A section's `_resolve` runs its
cross-field checks and fills derived defaults (`model_id`, `execution_horizon`, `model.revision`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BeforeValidator, TypeAdapter, ValidationError, model_validator
from pydantic.dataclasses import dataclass
from pydantic_core import ArgsKwargs

from server.manifest.checks import _checkpoint_meta, _is_chunk
from server.manifest.fields import (
    _CONFIG,
    DEFAULT_EXECUTION_HORIZON,
    Bool,
    Checkpoint,
    Device,
    Dir,
    Endpoints,
    File,
    Int,
    KeyChunk,
    KeyRoot,
    ListenEndpoints,
    ManifestError,
    Num,
    OutFile,
    Str,
    Strs,
    _f,
    _in,
    _raise,
    _scheduler_names,
    _scoring_names,
    _Section,
    _show,
    _upper,
)
from server.scheduling import DEFAULT_BATCH_WINDOW_MS
from wire import configerrors as ce
from wire.errors import WireError
from wire.keys import sanitize
from wire.suggest import closest
from wire.tensors import DEFAULT_LIMITS
from wire.transport import MAX_LEASE_MS, MIN_LEASE_MS

# ---- the schema ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class ModelConfig(_Section):
    """The checkpoint this replica serves (one model per process, design 004 8.1)."""

    repo_or_path: Checkpoint = _f(
        doc="local checkpoint directory (config.json, model.safetensors, stats.json; or a LeRobot "
        "save_pretrained directory); a hub id is refused: download it first"
    )
    revision: KeyChunk | None = _f(
        None, "revision in the keys and reported to clients", default_doc="checkpoint's, else `main`"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = _f("float32", "weights dtype")
    device: Device = _f("cpu", "torch device: cpu, cuda or cuda:N (cuda needs a CUDA build of torch)")
    action_names: Strs | None = _f(
        None,
        "the action columns in order, for a checkpoint that does not name them (LeRobot's config has no names: "
        "its dataset's `action` feature names); a checkpoint with names refuses other ones",
        default_doc="checkpoint's (LeRobot: `action_0` ...)",
    )
    hyper_params: dict[str, Any] = _f(
        {},
        "serve the checkpoint with other sampling hyper-parameters, e.g. "
        "`{guidance_jacobian: identity}`: only num_steps, noise_seed, max_guidance_weight, "
        "guidance_jacobian, prefix_schedule, rtc_mode, autocast, batch_buckets, compile "
        "(the others define the trained network); checked when the model loads",
    )

    def _resolve(self, fail: Callable[[str, str], None]) -> ModelConfig:
        if self.revision is None:
            rev = _checkpoint_meta(self.repo_or_path).get("revision")
            self._derive(revision=rev if isinstance(rev, str) and _is_chunk(rev) else "main")
        return self


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class EmulatedLatency(_Section):
    """Accelerator time added to every forward pass on a CPU host; reported as emulated everywhere."""

    distribution: Literal["fixed", "normal", "lognormal", "uniform"] = _f(
        "fixed", "shape of the samples", noun="distribution"
    )
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

    def _resolve(self, fail: Callable[[str, str], None]) -> EmulatedLatency:
        if self.min_ms > self.max_ms:
            fail("min_ms", f"{self.min_ms:g} is above max_ms {self.max_ms:g}; make min_ms <= max_ms")
        return self


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class TlsConfig(_Section):
    """TLS towards the router (wire.transport.make_config); setting root_ca_certificate enables it."""

    root_ca_certificate: File | None = _f(None, "CA file that signed the router's certificate (enables TLS)")
    connect_certificate: File | None = _f(None, "this server's certificate (mTLS)")
    connect_private_key: File | None = _f(None, "its private key (mTLS)")

    def _resolve(self, fail: Callable[[str, str], None]) -> TlsConfig:
        if bool(self.connect_certificate) != bool(self.connect_private_key):
            missing = "connect_private_key" if self.connect_certificate else "connect_certificate"
            fail(missing, "mTLS needs both connect_certificate and connect_private_key; give the other one")
        if self.connect_certificate and not self.root_ca_certificate:
            fail(
                "root_ca_certificate",
                "a client certificate without root_ca_certificate does not enable TLS; give the CA file",
            )
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
    listen_endpoints: ListenEndpoints = _f(
        (), "endpoints this server also listens on (peers; port 0: any free port); usually empty"
    )
    lease_ms: Int = _f(
        1000, "this session's lease: how fast the router notices the server died", lo=MIN_LEASE_MS, hi=MAX_LEASE_MS
    )
    connect_timeout_s: Num = _f(
        30.0,
        "keep retrying an unreachable router (backoff 0.1 s doubling to 2 s) this long "
        "before giving up with exit 2: a replica restarted while its router is busy or "
        "restarting waits for it; 0 = one attempt",
        lo=0.0,
    )
    tls: TlsConfig = _f(TlsConfig, "TLS files")

    def _resolve(self, fail: Callable[[str, str], None]) -> ZenohConfig:
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

    enabled: Bool = _f(
        True,
        "one dispatch loop per model, `max_inflight` forward passes at a time; the "
        "legacy single loop is not implemented, so only true is accepted",
    )

    def _resolve(self, fail: Callable[[str, str], None]) -> PipelineDispatch:
        if not self.enabled:
            fail("enabled", "the legacy single dispatch loop is not implemented; remove the key or set true")
        return self


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class SchedulingConfig(_Section):
    """Which pending request runs next (server/scheduling.py) and how the queue overflows (003)."""

    strategy: _in(_scheduler_names) = _f("round_robin", "scheduler strategy (server.scheduling registry)")
    scoring: _in(_scoring_names) | None = _f(
        None, "registered scoring function for deadline_aware/model_deadline; null = built-in"
    )
    max_queue_size: Int = _f(500, "pending requests (one per session) before the overflow policy", lo=1)
    request_ttl_ms: Num = _f(5000.0, "a request waiting longer is answered EXPIRED", gt=0.0)
    overflow_policy: Literal["drop_oldest", "drop_newest", "reject"] = _f(
        "drop_oldest",
        "what a full queue does: evict the oldest request, refuse the new one quietly, or refuse "
        "it with an error to the client",
    )
    max_retries: Int = _f(0, "re-queue a failed forward pass up to N times", lo=0, hi=100)
    max_batch: Int = _f(1, "sessions per forward pass (1 = no micro-batching)", lo=1, hi=1024)
    batch_window_ms: Num = _f(
        DEFAULT_BATCH_WINDOW_MS, "how long a partial batch waits for more sessions", lo=0.0, hi=1000.0
    )
    pipeline_dispatch: PipelineDispatch = _f(PipelineDispatch, "per-model dispatch loops")

    def _resolve(self, fail: Callable[[str, str], None]) -> SchedulingConfig:
        if self.scoring is not None:
            try:
                from server.scheduling import make_scheduler
            except ImportError:
                return self
            try:
                make_scheduler(self.strategy, scoring=self.scoring)
            except (ValueError, TypeError, KeyError):
                fail(
                    "scoring",
                    f"strategy {self.strategy} takes no scoring function; remove scoring or use "
                    "deadline_aware or model_deadline",
                )
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

    def _resolve(self, fail: Callable[[str, str], None]) -> ClientsConfig:
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
    max_prefix_rows: Int | None = _f(None, "largest RTC prefix a client may send (rows); null = the chunk size", lo=1)


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class SecurityConfig(_Section):
    """Per-session protection (server/guard.py; docs/security.md): identity proofs and limits."""

    require_session_auth: Bool = _f(
        True,
        "observations and resets must carry the session's auth tag (wire.auth); "
        "false accepts untagged ones (old clients; no identity binding)",
    )
    max_observation_bytes: Int | None = _f(
        None,
        "largest observation body a session may send (answered TOO_LARGE); null = limits.max_message_bytes",
        lo=1024,
    )
    max_request_rate_hz: Num = _f(
        100.0,
        "observations per second one session may send (token bucket, answered RATE_LIMITED); 0 = no limit",
        lo=0.0,
    )
    request_burst: Int | None = _f(None, "token bucket depth; null = one second of max_request_rate_hz", lo=1)
    max_sessions_per_client: Int = _f(
        4, "sessions one client uuid may hold on this replica (answered TOO_MANY_SESSIONS)", lo=1, hi=1000
    )
    reopen_idle_s: Num = _f(
        5.0,
        "a session without observations for this long (or whose client token is gone) "
        "may be replaced by an open without previous_auth",
        gt=0.0,
    )


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
    disconnect_timeout_s: Num = _f(10.0, "a session without observations for this long is closed; 0 = never", lo=0.0)


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

    backend: Literal["local", "ray_serve"] = _f(
        "local", "`local`: this process's torch; `ray_serve`: a Ray Serve deployment (needs the `cluster` extra)"
    )
    replicas: Int = _f(1, "Serve replicas of the model (ray_serve)", lo=1, hi=1024)
    gpus_per_replica: Num = _f(0.0, "GPUs each Serve replica reserves (ray_serve; 1 for a cuda model)", lo=0.0)
    cpus_per_replica: Num = _f(1.0, "CPUs each Serve replica reserves (ray_serve)", gt=0.0)
    max_inflight: Int = _f(
        4,
        "forward passes one Serve replica runs at once; beyond replicas x this, micro-batches "
        "wait here, in the mailbox, where queue depth and capacity refusals show it",
        lo=1,
        hi=1024,
    )
    address: Str | None = _f(
        None, "Ray cluster address (ray_serve); null = RAY_ADDRESS, else a local Ray started by this process"
    )


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class ServedModel(_Section):
    """What one served model is: the top level of a manifest, and each entry of `extra_models`."""

    model: ModelConfig = _f(doc="the checkpoint")
    model_id: KeyChunk | None = _f(
        None, "model id in the keys (unique in the process)", default_doc="checkpoint directory name"
    )
    default_task: Str = _f("", "task used when a client sends none")
    pin_task: Bool = _f(False, "refuse sessions asking for another task than default_task")
    serving_mode: Literal["shared", "exclusive"] = _f(
        "shared", "shared: many sessions; exclusive: one (forced for chunk-stateful policies)"
    )
    max_sessions: Int = _f(8, "capacity; session opens beyond it get CAPACITY with the load", lo=1, hi=100000)
    warmup_inferences: Int = _f(2, "dummy forward passes before the replica declares itself ready", lo=0, hi=1000)
    allow_resampling: Bool = _f(
        False,
        "accept clients whose control rate differs from the trained fps (each chunk "
        "then plays at the client's rate, stretched or squeezed in time; the ack "
        "warns); false = refuse them with FPS_MISMATCH",
    )
    trained_fps: Num | None = _f(None, "override the checkpoint's trained fps; null = the checkpoint's", gt=0.0)
    execution_horizon: Int | None = _f(None, "RTC prefix rows", lo=1, default_doc="checkpoint's, else 10")
    emulated_latency: EmulatedLatency | None = _f(
        None, "emulated accelerator time per forward pass: ms, or a mapping; null = none"
    )
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
    extra_models: tuple[ExtraModel, ...] = _f(
        (),
        "more models served by this process, each with its own sessions, "
        "mailbox and dispatch loop (started at its first request)",
    )
    torch_threads: Int = _f(1, "torch intra-op threads (1 keeps a 2-core host responsive)", lo=1, hi=1024)
    dispatch_priority: Literal["normal", "nice", "fifo"] = _f(
        "normal",
        "the dispatch loops' scheduling: fifo = SCHED_FIFO 4 (falls back to nice -10 where the host "
        "refuses real-time, then to normal), nice = nice -10; the log line 'dispatch priority:' says what took "
        "effect. The bench leaves it normal: raised, its replicas starved its shards on 2 cores (docs/bench.md)",
    )
    zenoh: ZenohConfig = _f(doc="router connection")
    health_port: Int | None = _f(
        0, "HTTP /healthz /readyz /metrics /sessions port; 0 = any free port, -1 or null = off", lo=-1, hi=65535
    )
    health_host: Str = _f("127.0.0.1", "address the health server binds")
    audit_path: OutFile | None = _f(None, "JSON-lines audit log (one line per request); null = off")
    log_level: Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR"], BeforeValidator(_upper)] = _f(
        "INFO", "server log level"
    )
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
    def from_dict(cls, data: Mapping, source: str = "<dict>") -> Manifest:
        """Validate plain data (no line numbers); raises ManifestError."""
        return _build(cls, data, "", None, source)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def _resolve(self, fail: Callable[[str, str], None]) -> Manifest:
        resolved = super()._resolve(fail)
        seen = {resolved.model_id: "model"}
        for i, extra in enumerate(resolved.extra_models):
            if extra.model_id in seen:
                fail(
                    "extra_models",
                    f"extra_models[{i}] has model_id {extra.model_id!r}, already served by "
                    f"{seen[extra.model_id]}; give each model its own model_id",
                )
            seen[extra.model_id] = f"extra_models[{i}]"
        mob = resolved.security.max_observation_bytes
        if mob is not None and mob > resolved.limits.max_message_bytes:
            fail(
                "security",
                f"max_observation_bytes {mob} exceeds limits.max_message_bytes "
                f"{resolved.limits.max_message_bytes} (the decoder refuses larger bodies anyway); lower it",
            )
        return resolved

    def for_model(self, model_id: str) -> Manifest:
        """The manifest as one served model sees it: `model_id` and its fields in the top-level places,
        every process-wide section unchanged, no extra models."""
        if model_id == self.model_id:
            return dataclasses.replace(self, extra_models=()) if self.extra_models else self
        for extra in self.extra_models:
            if extra.model_id == model_id:
                return dataclasses.replace(
                    self, extra_models=(), **{f.name: getattr(extra, f.name) for f in fields(ServedModel)}
                )
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
    # a LeRobot Diffusion config says n_action_steps: the rows its chunk has (server/policies/lerobot.py)
    chunk = meta.get("chunk_size", meta.get("n_action_steps") if meta.get("type") == "diffusion" else None)
    horizon = section.execution_horizon
    if horizon is None:
        h = meta.get("execution_horizon")
        if not (isinstance(h, int) and h >= 1):
            h = (
                min(DEFAULT_EXECUTION_HORIZON, chunk)
                if isinstance(chunk, int) and chunk >= 1
                else DEFAULT_EXECUTION_HORIZON
            )
        horizon = changes["execution_horizon"] = h
    if isinstance(chunk, int) and horizon > chunk:
        fail("execution_horizon", f"{horizon} exceeds the checkpoint's chunk_size {chunk}; use at most {chunk}")
    section._derive(**changes)
    return section


manifest_from_dict = Manifest.from_dict


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
