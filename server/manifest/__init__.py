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

Modules: fields.py (ManifestError, the field types, the section base), checks.py (value checks by
word), sections.py (the schema and its error translation), loading.py (YAML, overrides, CLI flags),
doc.py (reference table and JSON Schema); `python -m server.manifest` is __main__.py.
"""

from server.manifest.checks import _CHECKS, _check_device, _cuda_device_count, device_problem  # noqa: F401
from server.manifest.doc import json_schema, schema_doc  # noqa: F401
from server.manifest.fields import (  # noqa: F401
    DEFAULT_EXECUTION_HORIZON,
    FALLBACK_SCHEDULERS,
    OVERRIDE,
    ManifestError,
    _scheduler_names,
    _scoring_names,
)
from server.manifest.loading import (  # noqa: F401
    add_cli_arguments,
    apply_overrides,
    load_manifest,
    overrides_from_args,
    validate_manifest,
)
from server.manifest.sections import (  # noqa: F401
    ClientDefaults,
    ClientsConfig,
    DebugConfig,
    DispatchConfig,
    DrainConfig,
    EmulatedLatency,
    ExtraModel,
    KnownClient,
    LimitsConfig,
    Manifest,
    ModelConfig,
    ModelLimits,
    ModelsConfig,
    PipelineDispatch,
    ResponseTracking,
    SchedulingConfig,
    SecurityConfig,
    ServedModel,
    SessionConfig,
    TlsConfig,
    ZenohConfig,
    _adapter,
    _build,
    manifest_from_dict,
)

__all__ = [
    "Manifest",
    "ManifestError",
    "load_manifest",
    "manifest_from_dict",
    "apply_overrides",
    "validate_manifest",
    "add_cli_arguments",
    "overrides_from_args",
    "schema_doc",
    "json_schema",
    "device_problem",
    "ModelConfig",
    "EmulatedLatency",
    "ZenohConfig",
    "TlsConfig",
    "DebugConfig",
    "SchedulingConfig",
    "PipelineDispatch",
    "ModelsConfig",
    "ModelLimits",
    "ClientsConfig",
    "ClientDefaults",
    "KnownClient",
    "SessionConfig",
    "SecurityConfig",
    "LimitsConfig",
    "ResponseTracking",
    "DrainConfig",
    "DispatchConfig",
    "ServedModel",
    "ExtraModel",
]
