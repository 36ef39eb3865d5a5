"""The policy server's manifest: one YAML file (design 004 8.6 merged with 003's scheduling/models/clients).

    m.yaml ──► line-tracking YAML ──► overrides (flags, --set) ──► dataclass walk ──► Manifest
               (every key keeps        merged into the same         unknown keys, types, ranges,
                its line number)       tree, marked "override"      choices, files, cross-field checks

The dataclasses below ARE the schema: each field's type, default and `doc` metadata drive the
validation, `Manifest.to_dict()` and the reference table in docs/manifest.md
(`python -m server.manifest --doc`). Errors are `ManifestError`, whose text is
``file:line: dotted.key: what is wrong; what to do``.

Invariants: weights load only from a local directory (a hub id is refused with the command that
downloads it); a value from `--set` or a flag goes through exactly the checks a file value does;
a validated Manifest has no "to be decided later" defaults except `trained_fps` and
`session.max_prefix_rows`, which the server takes from the checkpoint it loads.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import math
import os
import re
import sys
import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

import yaml

from wire.errors import WireError
from wire.keys import sanitize, sanitize_root
from wire.tensors import DEFAULT_LIMITS

__all__ = [
    "Manifest", "ManifestError", "load_manifest", "manifest_from_dict", "apply_overrides",
    "add_cli_arguments", "overrides_from_args", "schema_doc",
    "ModelConfig", "EmulatedLatency", "ZenohConfig", "TlsConfig", "DebugConfig", "SchedulingConfig",
    "PipelineDispatch", "ModelsConfig", "ModelLimits", "ClientsConfig", "ClientDefaults", "KnownClient",
    "SessionConfig", "SecurityConfig", "LimitsConfig", "ResponseTracking", "MetricsConfig", "DrainConfig",
]

OVERRIDE = "override"  # the "line" of a value that came from a flag or --set
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


def _f(default: Any = MISSING, doc: str = "", **meta: Any) -> Any:
    """A manifest field: `doc` explains it; meta may hold lo, hi, gt (strict lower bound), choices
    (a tuple or a callable returning names), check (a `_CHECKS` word), noun, default_doc."""
    meta["doc"] = doc
    if isinstance(default, (list, dict, set)):
        value = default
        return field(default_factory=lambda: type(value)(value), metadata=meta)
    if isinstance(default, type) and is_dataclass(default):
        return field(default_factory=default, metadata=meta)
    return field(default=default, metadata=meta)


class _Section:
    """Shared by every manifest section: back to plain data, and dict-style `get`."""

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

@dataclass(frozen=True, kw_only=True)
class ModelConfig(_Section):
    """The checkpoint this replica serves (one model per process, design 004 8.1)."""

    repo_or_path: str = _f(doc="local checkpoint directory (config.json, model.safetensors, stats.json); "
                               "a hub id is refused: download it first", check="checkpoint_dir")
    revision: str = _f(None, "revision in the keys and reported to clients", check="key_chunk",
                       default_doc="checkpoint's, else `main`")
    dtype: Literal["float32", "bfloat16", "float16"] = _f("float32", "weights dtype")
    device: str = _f("cpu", "torch device: cpu, cuda or cuda:N (cuda needs a CUDA build of torch)", check="device")

    def _resolve(self, fail: Callable[[str, str], None]) -> "ModelConfig":
        if self.revision is None:
            rev = _checkpoint_meta(self.repo_or_path).get("revision")
            return dataclasses.replace(self, revision=rev if isinstance(rev, str) and _is_chunk(rev) else "main")
        return self


@dataclass(frozen=True, kw_only=True)
class EmulatedLatency(_Section):
    """Accelerator time added to every forward pass on a CPU host; reported as emulated everywhere."""

    distribution: Literal["fixed", "normal", "lognormal", "uniform"] = _f("fixed", "shape of the samples",
                                                                         noun="distribution")
    mean_ms: float = _f(0.0, "mean (fixed: the value; uniform without max_ms: range is 0..2*mean)", lo=0.0)
    std_ms: float = _f(0.0, "standard deviation (normal, lognormal)", lo=0.0)
    min_ms: float = _f(0.0, "lower clamp (uniform: lower bound)", lo=0.0)
    max_ms: float = _f(math.inf, "upper clamp (uniform: upper bound)", lo=0.0)
    per_batch_item_ms: float = _f(0.0, "added per extra session in a micro-batch", lo=0.0)
    seed: int | None = _f(None, "RNG seed for reproducible samples; null = fresh")

    @classmethod
    def _from_scalar(cls, v: Any, fail: Callable[[str], None]) -> dict:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return {"distribution": "fixed", "mean_ms": v}
        fail(f"must be a number of ms or a mapping {{distribution, mean_ms, ...}}, got {_show(v)}")

    def _resolve(self, fail: Callable[[str, str], None]) -> "EmulatedLatency":
        if self.min_ms > self.max_ms:
            fail("min_ms", f"{self.min_ms:g} is above max_ms {self.max_ms:g}; make min_ms <= max_ms")
        return self


@dataclass(frozen=True, kw_only=True)
class TlsConfig(_Section):
    """TLS towards the router (wire.transport.make_config); setting root_ca_certificate enables it."""

    root_ca_certificate: str | None = _f(None, "CA file that signed the router's certificate (enables TLS)",
                                         check="file")
    connect_certificate: str | None = _f(None, "this server's certificate (mTLS)", check="file")
    connect_private_key: str | None = _f(None, "its private key (mTLS)", check="file")

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


@dataclass(frozen=True, kw_only=True)
class ZenohConfig(_Section):
    """How the server reaches the router (client mode; design 004 6.6)."""

    connect_endpoints: tuple[str, ...] = _f(doc="router endpoints, e.g. [tcp/127.0.0.1:7447] or [tls/host:7447]",
                                            check="endpoint")
    listen_endpoints: tuple[str, ...] = _f((), "endpoints this server also listens on (peers); usually empty",
                                           check="endpoint")
    lease_ms: int = _f(1000, "this session's lease: how fast the router notices the server died", lo=100, hi=600000)
    tls: TlsConfig = _f(TlsConfig, "TLS files")

    def _resolve(self, fail: Callable[[str, str], None]) -> "ZenohConfig":
        if not self.connect_endpoints:
            fail("connect_endpoints", "needs at least one router endpoint, e.g. [tcp/127.0.0.1:7447]")
        secure = [e for e in self.connect_endpoints + self.listen_endpoints if e.startswith(("tls/", "quic/"))]
        if secure and not self.tls.root_ca_certificate:
            fail("tls", f"endpoint {secure[0]} needs zenoh.tls.root_ca_certificate; give the CA file")
        return self


@dataclass(frozen=True, kw_only=True)
class DebugConfig(_Section):
    """Debug capture for byte-exact offline replay (`policy-server replay`)."""

    capture_dir: str | None = _f(None, "keep request/response batches here; null = off", check="not_file")
    capture_max: int = _f(256, "newest forward passes kept (a ring of files)", lo=1)


@dataclass(frozen=True, kw_only=True)
class PipelineDispatch(_Section):
    """Per-model dispatch loops (design 003 "Pipeline Dispatch")."""

    enabled: bool = _f(True, "one dispatch loop per model, `max_inflight` forward passes at a time; the "
                             "legacy single loop is not implemented, so only true is accepted")

    def _resolve(self, fail: Callable[[str, str], None]) -> "PipelineDispatch":
        if not self.enabled:
            fail("enabled", "the legacy single dispatch loop is not implemented; remove the key or set true")
        return self


@dataclass(frozen=True, kw_only=True)
class SchedulingConfig(_Section):
    """Which pending request runs next (server/scheduling.py) and how the queue overflows (003)."""

    strategy: str = _f("round_robin", "scheduler strategy (server.scheduling registry)", choices=_scheduler_names)
    scoring: str | None = _f(None, "registered scoring function for deadline_aware/model_deadline; null = built-in",
                             choices=_scoring_names)
    max_queue_size: int = _f(500, "pending requests (one per session) before the overflow policy", lo=1)
    request_ttl_ms: float = _f(5000.0, "a request waiting longer is answered EXPIRED", gt=0.0)
    overflow_policy: Literal["drop_oldest", "drop_newest", "reject"] = _f(
        "drop_oldest", "what a full queue does: evict the oldest request, refuse the new one quietly, or refuse "
                       "it with an error to the client")
    max_retries: int = _f(0, "re-queue a failed forward pass up to N times", lo=0, hi=100)
    max_batch: int = _f(1, "sessions per forward pass (1 = no micro-batching)", lo=1, hi=1024)
    batch_window_ms: float = _f(2.0, "how long a partial batch waits for more sessions", lo=0.0, hi=1000.0)
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


@dataclass(frozen=True, kw_only=True)
class ModelLimits(_Section):
    """Dispatch concurrency of one model id."""

    max_inflight: int = _f(1, "concurrent forward passes of this model", lo=1, hi=64)


@dataclass(frozen=True, kw_only=True)
class ModelsConfig(_Section):
    """Per-model dispatch concurrency (003 "Pipeline Dispatch")."""

    known: dict[str, ModelLimits] = _f({}, "per model id: {max_inflight: N}", check="key_chunk_keys")
    default_max_inflight: int = _f(1, "concurrent forward passes of a model not in `known`", lo=1, hi=64)


@dataclass(frozen=True, kw_only=True)
class ClientDefaults(_Section):
    """Settings of a client that `clients.known` does not list."""

    latency_budget_ms: float = _f(50.0, "latency budget (deadline scheduling)", gt=0.0)


@dataclass(frozen=True, kw_only=True)
class KnownClient(_Section):
    """One enumerated client."""

    id: str = _f(doc="client uuid (as in its keys)", check="key_chunk")
    model: str | None = _f(None, "model id it uses; null = any", check="key_chunk")
    latency_budget_ms: float | None = _f(None, "its latency budget; null = clients.defaults", gt=0.0)
    priority: int = _f(0, "priority tier for priority_tiered (0 = most urgent)", lo=0, hi=1000)


@dataclass(frozen=True, kw_only=True)
class ClientsConfig(_Section):
    """Who may open sessions and with which budget (003 "Configuration")."""

    defaults: ClientDefaults = _f(ClientDefaults, "settings of unlisted clients")
    known: tuple[KnownClient, ...] = _f((), "[{id, model, latency_budget_ms, priority}] per-client settings")
    accept_unknown: bool = _f(True, "accept clients not in `known`")
    allowlist: tuple[str, ...] = _f((), "client uuids or tag=value allowed to open sessions; empty = all")

    def _resolve(self, fail: Callable[[str, str], None]) -> "ClientsConfig":
        seen: set[str] = set()
        for c in self.known:
            if c.id in seen:
                fail("known", f"client {c.id!r} is listed twice; keep one entry")
            seen.add(c.id)
        if not self.accept_unknown and not self.known:
            fail("accept_unknown", "false with no clients.known refuses every client; list clients or set true")
        return self


@dataclass(frozen=True, kw_only=True)
class SessionConfig(_Section):
    """Session lifetime."""

    gc_grace_s: float = _f(2.0, "a session whose client liveliness is lost is closed after this", lo=0.0, hi=3600.0)
    max_prefix_rows: int | None = _f(None, "largest RTC prefix a client may send (rows); null = the chunk size",
                                     lo=1)


@dataclass(frozen=True, kw_only=True)
class SecurityConfig(_Section):
    """Per-session protection (server/guard.py; docs/security.md): identity proofs and limits."""

    require_session_auth: bool = _f(True, "observations and resets must carry the session's auth tag (wire.auth); "
                                          "false accepts untagged ones (old clients; no identity binding)")
    max_observation_bytes: int | None = _f(None, "largest observation body a session may send (answered TOO_LARGE); "
                                                 "null = limits.max_message_bytes", lo=1024)
    max_request_rate_hz: float = _f(100.0, "observations per second one session may send (token bucket, answered "
                                           "RATE_LIMITED); 0 = no limit", lo=0.0)
    request_burst: int | None = _f(None, "token bucket depth; null = one second of max_request_rate_hz", lo=1)
    max_sessions_per_client: int = _f(4, "sessions one client uuid may hold on this replica (answered "
                                         "TOO_MANY_SESSIONS)", lo=1, hi=1000)
    reopen_idle_s: float = _f(5.0, "a session without observations for this long (or whose client token is gone) "
                                   "may be replaced by an open without previous_auth", gt=0.0)


@dataclass(frozen=True, kw_only=True)
class LimitsConfig(_Section):
    """Decoder size limits (wire.tensors.Limits, field for field)."""

    max_message_bytes: int = _f(DEFAULT_LIMITS.max_message_bytes, "largest observation body", lo=1024)
    max_tensors: int = _f(DEFAULT_LIMITS.max_tensors, "tensors per message", lo=1)
    max_rank: int = _f(DEFAULT_LIMITS.max_rank, "dimensions per tensor", lo=1)
    max_elements: int = _f(DEFAULT_LIMITS.max_elements, "elements per tensor", lo=1)
    max_images: int = _f(DEFAULT_LIMITS.max_images, "images per message", lo=0)
    max_image_pixels: int = _f(DEFAULT_LIMITS.max_image_pixels, "pixels per image", lo=1)
    max_string_chars: int = _f(DEFAULT_LIMITS.max_string_chars, "characters per string (task)", lo=1)
    max_map_entries: int = _f(DEFAULT_LIMITS.max_map_entries, "entries per map", lo=1)
    max_list_items: int = _f(DEFAULT_LIMITS.max_list_items, "items per list", lo=1)


@dataclass(frozen=True, kw_only=True)
class ResponseTracking(_Section):
    """How the server follows each client's request cadence."""

    cadence_alpha: float = _f(0.3, "EWMA weight of a session's request cadence", gt=0.0, hi=1.0)
    disconnect_timeout_s: float = _f(10.0, "a session without observations for this long is closed; 0 = never",
                                     lo=0.0)


@dataclass(frozen=True, kw_only=True)
class MetricsConfig(_Section):
    """In-process metrics."""

    ring_buffer_size: int = _f(10000, "samples kept per series for percentiles", lo=10, hi=10_000_000)


@dataclass(frozen=True, kw_only=True)
class DrainConfig(_Section):
    """SIGTERM behaviour."""

    timeout_s: float = _f(10.0, "longest wait for the work in flight before exiting", lo=0.0, hi=3600.0)


@dataclass(frozen=True, kw_only=True)
class ServedModel(_Section):
    """What one served model is: the top level of a manifest, and each entry of `extra_models`."""

    model: ModelConfig = _f(doc="the checkpoint")
    model_id: str = _f(None, "model id in the keys (unique in the process)", check="key_chunk",
                       default_doc="checkpoint directory name")
    default_task: str = _f("", "task used when a client sends none")
    pin_task: bool = _f(False, "refuse sessions asking for another task than default_task")
    serving_mode: Literal["shared", "exclusive"] = _f(
        "shared", "shared: many sessions; exclusive: one (forced for chunk-stateful policies)")
    max_sessions: int = _f(8, "capacity; session opens beyond it get CAPACITY with the load", lo=1, hi=100000)
    warmup_inferences: int = _f(2, "dummy forward passes before the replica declares itself ready", lo=0, hi=1000)
    strict_fps: bool = _f(False, "reject clients whose fps differs from the trained fps (else warn)")
    trained_fps: float | None = _f(None, "override the checkpoint's trained fps; null = the checkpoint's", gt=0.0)
    execution_horizon: int = _f(None, "RTC prefix rows", lo=1, default_doc="checkpoint's, else 10")
    emulated_latency: EmulatedLatency | None = _f(None, "emulated accelerator time per forward pass: ms, or a mapping; "
                                                        "null = none")

    def _resolve(self, fail: Callable[[str, str], None]):
        return _resolve_model_fields(self, fail)


@dataclass(frozen=True, kw_only=True)
class ExtraModel(ServedModel):
    """Another model this process serves beside `model` (same replica_id, router, scheduling, clients,
    limits, health port and audit log). Fields left out take their defaults, not the top level's."""


@dataclass(frozen=True, kw_only=True)
class Manifest(ServedModel):
    """One policy server replica: `load_manifest(path, overrides)` or `Manifest.from_dict(d)`."""

    replica_id: str = _f("r0", "replica id in the keys (replicas of a model share a router)", check="key_chunk")
    root: str = _f("@fleet", "the verbatim root key chunk", check="key_root")
    extra_models: tuple[ExtraModel, ...] = _f((), "more models served by this process, each with its own sessions, "
                                                   "mailbox and dispatch loop (started at its first request)")
    torch_threads: int = _f(1, "torch intra-op threads (1 keeps a 2-core host responsive)", lo=1, hi=1024)
    zenoh: ZenohConfig = _f(doc="router connection")
    health_port: int | None = _f(0, "HTTP /healthz /readyz /metrics port; 0 = any free port, -1 or null = off",
                                 lo=-1, hi=65535)
    health_host: str = _f("127.0.0.1", "address the health server binds")
    audit_path: str | None = _f(None, "JSON-lines audit log (one line per request); null = off", check="not_dir")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = _f("INFO", "server log level", upper=True)
    debug: DebugConfig = _f(DebugConfig, "debug capture")
    scheduling: SchedulingConfig = _f(SchedulingConfig, "scheduling")
    models: ModelsConfig = _f(ModelsConfig, "per-model dispatch")
    clients: ClientsConfig = _f(ClientsConfig, "clients")
    session: SessionConfig = _f(SessionConfig, "sessions")
    limits: LimitsConfig = _f(LimitsConfig, "decoder limits")
    security: SecurityConfig = _f(SecurityConfig, "per-session identity binding and limits")
    response_tracking: ResponseTracking = _f(ResponseTracking, "cadence and disconnects")
    metrics: MetricsConfig = _f(MetricsConfig, "metrics")
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
    return dataclasses.replace(section, **changes) if changes else section


manifest_from_dict = Manifest.from_dict


# ---- value checks keyed by the `check` word ---------------------------------------------------------------------

_ENDPOINT_RE = re.compile(r"^(tcp|udp|tls|quic|ws|unixsock-stream|unixpipe|serial|vsock)/\S+$")
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
    if not _ENDPOINT_RE.match(v):
        example = v.split("/")[-1] or "127.0.0.1:7447"
        fail(f"{v!r} is not a Zenoh endpoint; write it as protocol/address, e.g. tcp/{example}")


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


_CHECKS: dict[str, Callable[[str, Callable[[str], None]], None]] = {
    "checkpoint_dir": _check_checkpoint_dir,
    "file": _check_file,
    "not_file": _check_not_file,
    "not_dir": _check_not_dir,
    "key_chunk": _check_key_chunk,
    "key_root": _check_key_root,
    "endpoint": _check_endpoint,
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


# ---- the walk: raw YAML data -> dataclasses ----------------------------------------------------------------------

def _show(v: Any) -> str:
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(type(v))
    if isinstance(v, Mapping):
        kind = "a mapping"
    elif isinstance(v, (list, tuple)):
        kind = "a list"
    return f"{v!r} ({kind})" if kind else repr(v)


def _loc(raw: Any, key: Any, parent: int | str | None) -> int | str | None:
    lines = getattr(raw, "lines", None)
    if isinstance(lines, dict) and key in lines:
        return lines[key]
    if isinstance(lines, list) and isinstance(key, int) and 0 <= key < len(lines):
        return lines[key]
    return parent


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _required(f: dataclasses.Field) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def _all_leaf_paths(cls: type, prefix: str = "") -> list[str]:
    out = []
    for f in fields(cls):
        tp = _unwrap(_hints(cls)[f.name])[0]
        p = f"{prefix}{f.name}"
        out.extend(_all_leaf_paths(tp, p + ".") if is_dataclass(tp) else [p])
    return out


def _unknown_key_hint(cls: type, key: str, path: str) -> str:
    here = [f.name for f in fields(cls)]
    elsewhere = [p for p in _all_leaf_paths(Manifest) if p.rsplit(".", 1)[-1] == key]
    if elsewhere:
        return f"did you mean {elsewhere[0]}?"
    close = difflib.get_close_matches(key, here, n=1)
    if close:
        return f"did you mean {path + '.' if path else ''}{close[0]}?"
    close = difflib.get_close_matches(key, _all_leaf_paths(Manifest), n=1, cutoff=0.75)
    if close:
        return f"did you mean {close[0]}?"
    return f"known keys here: {', '.join(here)}"


def _build(cls: type, raw: Any, path: str, loc: int | str | None, source: str):
    if raw is None:
        raw = {}
    names = [f.name for f in fields(cls)]
    if not isinstance(raw, Mapping):
        raise ManifestError(source, loc, path or "(top level)",
                            f"must be a mapping of {', '.join(names)}, got {_show(raw)}")
    for key in raw:
        if key not in names:
            raise ManifestError(source, _loc(raw, key, loc), f"{path}.{key}" if path else str(key),
                                f"unknown key; {_unknown_key_hint(cls, str(key), path)}")
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in fields(cls):
        p = f"{path}.{f.name}" if path else f.name
        if f.name in raw:
            values[f.name] = _convert(hints[f.name], raw[f.name], p, _loc(raw, f.name, loc), source, f.metadata)
        elif _required(f):
            tp = _unwrap(hints[f.name])[0]
            if is_dataclass(tp):  # a missing section: report the first missing key inside it
                values[f.name] = _build(tp, {}, p, loc, source)
            else:
                raise ManifestError(source, loc, p, f"is required: {f.metadata.get('doc', '')}")
    obj = cls(**values)
    resolve = getattr(obj, "_resolve", None)
    if resolve is not None:
        def fail(key: str, message: str):
            raise ManifestError(source, _loc(raw, key, loc), f"{path}.{key}" if path else key, message)
        obj = resolve(fail)
    return obj


def _unwrap(tp: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]), len(rest) < len(args)
    return tp, False


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def _range_text(lo, hi, gt) -> str:
    if gt is not None:
        return f"> {_num(gt)}" + (f" and <= {_num(hi)}" if hi is not None else "")
    if lo is not None and hi is not None:
        return f"from {_num(lo)} to {_num(hi)}"
    return f">= {_num(lo)}" if lo is not None else f"<= {_num(hi)}"


def _convert(tp: Any, v: Any, path: str, loc, source: str, meta: Mapping):
    fail = _failer(source, loc, path)
    tp, nullable = _unwrap(tp)
    if v is None:
        if nullable or meta.get("default_doc"):
            return None
        fail(f"may not be null; {meta.get('doc', 'give a value')}")
    origin = typing.get_origin(tp)
    if is_dataclass(tp):
        if not isinstance(v, Mapping) and hasattr(tp, "_from_scalar"):
            v = tp._from_scalar(v, fail)
        return _build(tp, v, path, loc, source)
    if origin is Literal:
        choices = typing.get_args(tp)
        if meta.get("upper") and isinstance(v, str):
            v = v.upper()
        if v not in choices:
            noun = f"{meta['noun']} " if meta.get("noun") else ""
            fail(f"{noun}{v!r} is not one of {', '.join(choices)}; pick one of them")
        return v
    if origin is tuple:
        item_tp = typing.get_args(tp)[0]
        if isinstance(v, str) and item_tp is str:
            v = [v]
        if not isinstance(v, (list, tuple)):
            fail(f"must be a list, got {_show(v)}")
        return tuple(_convert(item_tp, x, f"{path}[{i}]", _loc(v, i, loc), source, meta) for i, x in enumerate(v))
    if origin is dict:
        item_tp = typing.get_args(tp)[1]
        if not isinstance(v, Mapping):
            fail(f"must be a mapping, got {_show(v)}")
        out = {}
        for k, x in v.items():
            kloc = _loc(v, k, loc)
            if not isinstance(k, str):
                raise ManifestError(source, kloc, f"{path}.{k}", f"keys must be strings, got {_show(k)}; quote it")
            if meta.get("check") == "key_chunk_keys":
                _check_key_chunk(k, _failer(source, kloc, f"{path}.{k}"))
            out[k] = _convert(item_tp, x, f"{path}.{k}", kloc, source, {})
        return out
    if tp is bool:
        if not isinstance(v, bool):
            fail(f"must be true or false, got {_show(v)}")
        return v
    if tp in (int, float):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (tp is int and not isinstance(v, int)):
            fail(f"must be {'an integer' if tp is int else 'a number'}, got {_show(v)}")
        if isinstance(v, float) and math.isnan(v):
            fail("must be a number, got nan")
        lo, hi, gt = meta.get("lo"), meta.get("hi"), meta.get("gt")
        if (lo is not None and v < lo) or (hi is not None and v > hi) or (gt is not None and v <= gt):
            bounds = f"[{_num(lo if lo is not None else gt)}, {_num(hi) if hi is not None else 'inf'}]"
            fail(f"{_num(v)} is outside {bounds}; give a value {_range_text(lo, hi, gt)}")
        v = float(v) if tp is float else v
    elif tp is str:
        if not isinstance(v, str):
            hint = f"; quote it: '{v}'" if isinstance(v, (int, float, bool)) else ""
            fail(f"must be a string, got {_show(v)}{hint}")
    else:  # pragma: no cover - a schema bug
        raise AssertionError(f"{path}: unsupported manifest type {tp!r}")
    choices = meta.get("choices")
    if choices is not None:
        names = choices() if callable(choices) else choices
        if names is not None and v not in names:
            fail(f"{v!r} is not one of {', '.join(names)}; pick one of them")
    check = meta.get("check")
    if check in _CHECKS:
        _CHECKS[check](v, fail)
    return v


def _failer(source: str, loc: int | str | None, key: str) -> Callable[[str], None]:
    def fail(message: str) -> None:
        raise ManifestError(source, loc, key, message)
    return fail


# ---- YAML with line numbers --------------------------------------------------------------------------------------

# Our own small loader rather than bench.scenario.yamlines: the server never imports the bench twin (the
# twin drives the server, not the reverse), and overrides need a third kind of "line".
class _Map(dict):
    """A mapping that remembers the 1-based line of each key (`lines`); overridden keys say OVERRIDE."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lines: dict[Any, int | str] = {}


class _Seq(list):
    """A sequence that remembers the line of each item."""

    def __init__(self, *args):
        super().__init__(*args)
        self.lines: list[int | str] = []


class _Loader(yaml.SafeLoader):
    pass


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> _Map:
    loader.flatten_mapping(node)
    out = _Map()
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, (str, int, float, bool)) and key is not None:
            raise yaml.constructor.ConstructorError(None, None, "keys must be plain words", key_node.start_mark)
        if key in out:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {out.lines[key]})", key_node.start_mark)
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = key_node.start_mark.line + 1
    return out


def _construct_seq(loader: _Loader, node: yaml.SequenceNode) -> _Seq:
    out = _Seq(loader.construct_object(child, deep=True) for child in node.value)
    out.lines = [child.start_mark.line + 1 for child in node.value]
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_seq)


def _parse(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader derives from SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ManifestError(source, mark.line + 1 if mark else None, "",
                            f"not valid YAML: {problem}; fix it at that line") from None


# ---- loading and overrides ---------------------------------------------------------------------------------------

def load_manifest(path: str | os.PathLike, overrides: list[str] | Mapping[str, Any] | None = None) -> Manifest:
    """Read `path`, apply `overrides` (later wins), validate; raise ManifestError naming file, line, key, fix."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ManifestError(source, None, "", f"cannot read the manifest: {exc.strerror}; check the path") from None
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
                nxt = _Map()
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
    if isinstance(getattr(m, "lines", None), dict):
        m.lines[key] = OVERRIDE


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


# ---- reference documentation ------------------------------------------------------------------------------------

def _type_text(tp: Any, meta: Mapping) -> str:
    tp, nullable = _unwrap(tp)
    origin = typing.get_origin(tp)
    if origin is Literal:
        text = " \\| ".join(typing.get_args(tp))
    elif origin is tuple:
        text = f"list of {_type_text(typing.get_args(tp)[0], {})}"
    elif origin is dict:
        text = "mapping"
    elif is_dataclass(tp):
        text = "number (ms) or mapping" if hasattr(tp, "_from_scalar") else "mapping"
    else:
        text = {bool: "bool", int: "int", float: "float", str: "str"}[tp]
        check = meta.get("check")
        text = {"checkpoint_dir": "directory", "file": "file", "endpoint": "endpoint", "key_chunk": "key chunk",
                "key_root": "@chunk", "device": "cpu \\| cuda \\| cuda:N"}.get(check, text)
        choices = meta.get("choices")
        if choices is not None and callable(choices) and choices() is not None:
            text = " \\| ".join(choices())
        lo, hi, gt = meta.get("lo"), meta.get("hi"), meta.get("gt")
        if lo is not None or hi is not None or gt is not None:
            text += " " + _range_text(lo, hi, gt)
    return text + (" or null" if nullable else "")


def _default_text(f: dataclasses.Field) -> str:
    if f.metadata.get("default_doc"):
        return f.metadata["default_doc"]
    if _required(f):
        return "**required**"
    v = f.default_factory() if f.default is MISSING else f.default
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
        hints = _hints(cls)
        for f in fields(cls):
            key = f"{prefix}{f.name}"
            tp = _unwrap(hints[f.name])[0]
            doc = f.metadata.get("doc", "").replace("|", "\\|")
            origin = typing.get_origin(tp)
            if is_dataclass(tp) and not hasattr(tp, "_from_scalar"):
                walk(tp, key + ".")
                continue
            rows.append(f"| `{key}` | {_type_text(hints[f.name], f.metadata)} | {_default_text(f)} | {doc} |")
            if is_dataclass(tp):
                walk(tp, key + ".")
            elif origin is dict and is_dataclass(typing.get_args(tp)[1]):
                walk(typing.get_args(tp)[1], key + ".<model_id>.")
            elif origin is tuple and is_dataclass(typing.get_args(tp)[0]):
                walk(typing.get_args(tp)[0], key + "[].")

    walk(Manifest, "")
    return "\n".join(rows)


if __name__ == "__main__":
    if sys.argv[1:] == ["--doc"]:
        print(schema_doc())
    elif len(sys.argv) >= 2 and sys.argv[1] == "--check":
        try:
            print(load_manifest(sys.argv[2], sys.argv[3:]).to_yaml(), end="")
        except (ManifestError, IndexError) as exc:
            print(f"server.manifest: {exc}", file=sys.stderr)
            raise SystemExit(2)
    else:
        print("usage: python -m server.manifest --doc | --check M.YAML [KEY=VALUE ...]")
