"""What makes a run impossible, found before any process starts: a reports root that cannot be written, a
scenario that needs a CUDA device on a host without one, a missing checkpoint or package, an environment knob
that does not parse. Each is a line for a person; a run with any exits 2 (invalid) without starting anything.
"""

from __future__ import annotations

from pathlib import Path

from bench.run.manifests import overrides as manifest_overrides
from bench.run.manifests import replica_priority
from bench.scenario.load import Scenario, missing_checkpoints


class EnvironmentInvalid(RuntimeError):
    """The machine or the checkout cannot run this scenario (missing package, checkpoint...)."""


def cuda_problems(scenario: Scenario) -> list[str]:
    """A replica whose manifest puts the model on CUDA cannot run on a host without a CUDA device."""
    wants = []
    for replica in scenario.replicas:
        model = manifest_overrides(scenario, replica).get("model") or {}
        if str(model.get("device", "cpu")).startswith("cuda"):
            wants.append(f"{replica.id} (model.device: {model['device']})")
    if not wants:
        return []
    try:
        import torch

        if torch.cuda.is_available():
            return []
        why = f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is false)"
    except ImportError:
        why = "torch is not installed"
    return [
        f"scenario {scenario.name!r} needs a CUDA GPU: replicas {', '.join(wants)} serve on CUDA, but on this "
        f"host {why}. It measures real GPU inference, which a CPU cannot stand in for: run it on a GPU host"
    ]


def reports_problems(reports_dir: Path) -> list[str]:
    """Whether the reports root can be written, found before any process starts (a run that makes its directory
    there at its start would fail with a traceback, exit 1, as if the system had failed): a file made and removed
    in it, or in its nearest existing parent where it is still to be made (nothing is left behind)."""
    import tempfile

    where = Path(reports_dir).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        if not where.is_dir():
            raise NotADirectoryError(f"{where} is a file")
        with tempfile.NamedTemporaryFile(dir=where, prefix=".bench-write-check-"):
            pass
    except OSError as exc:
        return [f"reports: cannot write under {str(reports_dir)!r} ({exc}); give --reports a directory you can write"]
    return []


def preflight(scenario: Scenario) -> list[str]:
    """Everything that makes a run impossible, found before any process starts."""
    cuda = cuda_problems(scenario)
    if cuda:  # nothing else matters on a host that cannot run the scenario at all
        return cuda
    out = list(missing_checkpoints(scenario))
    for mod, why in (
        ("zenoh", "eclipse-zenoh"),
        ("edge", "the edge engine (edge/)"),
        ("server", "the policy server"),
        ("chaos", "the chaos proxy (chaos/)"),
        ("pyarrow", "pyarrow (pip install -e .[sim])"),
    ):
        try:
            __import__(mod)
        except Exception as exc:
            out.append(f"environment: cannot import {mod} ({why}): {exc}")
    try:
        from edge import make_engine  # noqa: F401
    except Exception as exc:
        out.append(f"environment: edge.make_engine is not available: {exc}")
    from bench.run.sizing import forced_proxy_processes

    for check in (replica_priority, forced_proxy_processes):  # the environment's knobs, read as the run will
        try:
            check()
        except ValueError as exc:
            out.append(f"environment: {exc}")
    return out
