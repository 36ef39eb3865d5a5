"""`policy-server`: serve a checkpoint over Zenoh, or replay a debug capture offline.

    policy-server --manifest m.yaml [--set scheduling.max_batch=8] [--max-sessions 16] ...
    policy-server replay CAPTURE_DIR --checkpoint DIR
    policy-server check DIR [--device cuda] [--json]   would this checkpoint be served? (server.check.check_policy)
    policy-server schema manifest                      the manifest's JSON Schema (editors: docs/manifest.md)

Exit codes: 0 clean stop or drain (SIGTERM, Ctrl-C; also while it still waits for its router), 2 a user
error (bad manifest, missing checkpoint, an output path it cannot create, unreachable router, health port
taken, a capture directory or file replay cannot read, a checkpoint `check` refuses) reported in one line without a
traceback, 1 replay mismatch or an internal failure.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading


def _serve_parser() -> argparse.ArgumentParser:
    from server.manifest import add_cli_arguments

    ap = argparse.ArgumentParser(
        prog="policy-server",
        description="Serve one torch policy checkpoint to many robots over Zenoh (see docs/manifest.md). "
        "`policy-server replay --help` replays a debug capture offline.",
    )
    ap.add_argument("--manifest", required=True, help="YAML manifest (examples/manifests/minimal.yaml)")
    add_cli_arguments(ap)
    ap.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING, ERROR (default: the manifest's log_level)")
    ap.add_argument("--check", action="store_true", help="validate the manifest and load the checkpoint, then exit")
    return ap


def _replay_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="policy-server replay",
        description="Replay a debug capture through the same pipeline and compare outputs byte for byte.",
    )
    ap.add_argument("capture_dir")
    ap.add_argument("--checkpoint", required=True, help="local checkpoint directory the capture was served from")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "replay":
        return _replay(_replay_parser().parse_args(argv[1:]))
    if argv and argv[0] == "check":
        from server.check import main as check_main

        return check_main(argv[1:])
    if argv and argv[0] == "schema":
        ap = argparse.ArgumentParser(
            prog="policy-server schema",
            description="Print a JSON Schema for editors (docs/manifest.md, Editor support).",
        )
        ap.add_argument("what", choices=["manifest"])
        ap.parse_args(argv[1:])
        from server.manifest import json_schema

        print(json.dumps(json_schema(), indent=2))
        return 0
    args = _serve_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level or "INFO").upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return _serve(args)


def _serve(args) -> int:
    from server.manifest import ManifestError, load_manifest, overrides_from_args

    try:
        manifest = load_manifest(args.manifest, overrides_from_args(args))
    except ManifestError as exc:
        print(f"policy-server: {exc}", file=sys.stderr)
        return 2
    if args.log_level is None:  # the flag overrides the manifest, as every CLI flag does
        logging.getLogger().setLevel(getattr(logging, str(manifest.log_level).upper(), logging.INFO))
    threads = max(1, int(getattr(manifest, "torch_threads", 1) or 1))
    # Before torch loads OpenMP: the default team size of every thread the process will start (each dispatch
    # loop sets its own again, server.runtime.set_torch_threads, for a torch that was already imported).
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    from server.runtime import set_torch_threads

    set_torch_threads(threads)
    from server.policies.base import PolicyError
    from server.process import ServerProcess
    from server.service import OutputPathError, StartCancelled

    try:
        server = ServerProcess(manifest)  # creates audit_path and debug.capture_dir, before any model loads
    except OutputPathError as exc:
        print(f"policy-server: {exc}", file=sys.stderr)
        return 2
    for model_id, served in server.models.items():
        try:
            served.load()
        except (PolicyError, FileNotFoundError, ValueError) as exc:
            print(f"policy-server: cannot load model {model_id!r}: {exc}", file=sys.stderr)
            return 2
    if args.check:
        for served in server.models.values():
            print(
                f"policy-server: manifest and checkpoint OK ({served.info.model_id}, {served.info.policy_type}, "
                f"hash {served.info.checkpoint_hash[:16]})"
            )
        return 0
    done = threading.Event()

    def on_term(signum, frame):
        threading.Thread(target=lambda: (server.drain("SIGTERM"), done.set()), daemon=True).start()

    def on_int(signum, frame):
        threading.Thread(target=lambda: (server.stop(), done.set()), daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_int)
    from server.health import HealthBindError
    from wire.transport import TlsError

    try:
        server.start()
    except StartCancelled:
        pass  # SIGTERM or Ctrl-C while it waited for a router: the handler's stop sets `done`
    except (ConnectionError, TlsError) as exc:
        print(exc, file=sys.stderr)  # open_session's message starts with the role, "policy-server: "
        server.stop()
        return 2
    except HealthBindError as exc:
        print(f"policy-server: health_port: {exc}; pick another health_port", file=sys.stderr)
        server.stop()
        return 2
    except BaseException:
        server.stop()  # an internal failure: exit 1 with its traceback, the Zenoh session closed
        raise
    while not done.wait(1.0):
        pass
    print("policy-server stopped", flush=True)
    return 0


def _replay(args) -> int:
    from server.capture import CaptureError, replay
    from server.manifest import device_problem
    from server.policies.base import PolicyError

    problem = device_problem(args.device)
    if problem:
        print(f"policy-server replay: --device {problem}", file=sys.stderr)
        return 2
    try:
        report = replay(args.capture_dir, args.checkpoint, device=args.device)
    except (CaptureError, PolicyError) as exc:
        print(f"policy-server replay: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(
            f"replayed {report['requests']} requests: {report['matched']} byte-identical, {report['mismatched']} "
            f"differ (max |diff| {report['max_abs_diff']:.3g}), {report['errors']} errors; "
            f"same checkpoint: {report['same_checkpoint']}"
        )
        if report["first_mismatch"]:
            print(f"first mismatch: {report['first_mismatch']}")
    return 0 if report["mismatched"] == 0 and report["errors"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
