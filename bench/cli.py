"""`bench`: run, validate and list scenarios; train the robots' checkpoints.

    bench run FILE [--set KEY=VALUE ...] [--reports DIR] [--cluster ray]   run a scenario; exit 0 pass, 1 fail,
                                                           2 invalid/error, 3 inconclusive (failed while the host was
                                                           out of its fidelity tolerances)
    bench run FILE --record-dataset [DIR]                  ... and record its episodes as LeRobotDatasets
    bench run --check FILE                                 the preflight: shards, CPU estimate, real time or not
    bench validate FILE [FILE ...]                         check scenario files without running (exit 0/2)
    bench list                                             the shipped scenarios with their descriptions
    bench figures                                          the figures assertions may use
    bench robots [FILE ...] [--gym MAPPING] [--no-measure] robot types here (built in, plugins, the files' gym envs)
    bench schema scenario                                  the scenario language's JSON Schema (editors)
    bench sweep FILE --key K --values a,b [--capacity]    one run per value; --capacity: load steps, knee, P10
    bench dataset RUN_DIR [OUT]                            a run recorded with record.dataset as LeRobotDatasets
    bench incident --edge LOG|RUN|DATASET --audit A --from T0 --to T1 --out F.yaml   replay one robot's incident
    bench train --robot TYPE [--out DIR] [--seed N] [--policy-type T] [--fps HZ] [--rtc-mode M]   build bench/checkpoints/<TYPE>/
    bench init-weights NAME                                random weights for a config-only checkpoint (reacher_vla)
    bench pki --dir DIR [--robot UUID ...] [--replica ID ...] [--router] [--acl FILE]
                                                           a test CA and certificates (docs/security.md)

Owns argument parsing only (the exit codes are bench.evidence.exitcode.Exit); the work is in bench.scenario.load, bench.run.runner, bench.training.train.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from bench.evidence import exitcode
from bench.evidence.exitcode import Exit


def _invalid(message: str) -> int:
    """A user-input error (a bad scenario, file or argument): the message on stderr, exit Exit.INVALID."""
    print(message, file=sys.stderr)
    return Exit.INVALID


def _parse_value(text: str):
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def load_with_overrides(path: str, sets: list[str], *, check_checkpoints: bool = True):
    """Load a scenario, apply `--set key=value` overrides (dotted keys, YAML values) and check that its
    checkpoints are on disk: everything `bench run` needs before a process starts (validate calls this too)."""
    from bench.run.manifests import check_on_disk
    from bench.scenario import load as sc
    from bench.scenario.groups import check_gym_envs

    s = sc.load_scenario(path)
    if not sets:
        check_gym_envs(s)
        if check_checkpoints:
            check_on_disk(s)
        return s
    import copy

    data = copy.deepcopy(s.raw)
    for item in sets:
        key, eq, value = item.partition("=")
        if not eq:
            raise sc.ScenarioError(path, 0, key, "--set needs KEY=VALUE")
        try:
            sc.set_dotted(data, key, _parse_value(value))
        except (KeyError, TypeError, IndexError):
            parent, _, _ = key.rpartition(".")
            raise sc.ScenarioError(path, 0, key, f"--set: {parent or key!r} does not exist in the scenario") from None
    s = sc.build_scenario(data, f"{path} (with --set)")
    check_gym_envs(s)
    if check_checkpoints:
        check_on_disk(s)
    return s


def load_runnable(path: str, sets: list[str]):
    """`load_with_overrides` for `bench run`/`sweep`, or None after printing why this host cannot run it
    (a CUDA scenario without CUDA: said before the checkpoint check, whose weights it would build there)."""
    from bench.run.manifests import check_on_disk
    from bench.run.runner import cuda_problems

    s = load_with_overrides(path, sets, check_checkpoints=False)
    problems = cuda_problems(s)
    for problem in problems:
        print(f"bench: {problem}", file=sys.stderr)
    if problems:
        return None
    check_on_disk(s)
    return s


def cmd_validate(args) -> int:
    from bench.scenario.load import ScenarioError

    rc = Exit.PASS
    for path in args.files:
        try:
            s = load_with_overrides(path, args.set)
        except ScenarioError as exc:
            print(f"INVALID {exc}", file=sys.stderr)
            rc = Exit.INVALID
            continue
        groups = ", ".join(f"{g.name}={g.count}x{g.robot}@{g.fps:g}Hz/{g.site}" for g in s.groups)
        from bench.run.sizing import shard_count

        shards = f"{shard_count(s)} shard(s) (auto)" if s.shards == "auto" else f"{s.shards} shard(s)"
        print(
            f"ok {path}: {s.name}: {s.robots} robots in {shards} [{groups}]; sites "
            f"{', '.join(f'{n}:{x.profile}' for n, x in s.sites.items())}; {len(s.replicas)} replica(s); "
            f"{len(s.faults)} fault(s); {len(s.assertions)} assertion(s); {s.duration_s:g} s"
            + (f"; sweep {s.sweep['key']} over {len(s.sweep['values'])} values" if s.sweep else "")
        )
    return rc


def cmd_schema(args) -> int:
    import json

    from bench.scenario.model import json_schema

    print(json.dumps(json_schema(), indent=2))
    return Exit.PASS


def cmd_list(args) -> int:
    from bench.scenario.load import SCENARIOS_DIR, list_scenarios

    if args.dir and not Path(args.dir).is_dir():
        return _invalid(
            f"bench list: --dir {args.dir!r} "
            f"{'is not a directory' if Path(args.dir).exists() else 'does not exist'}; "
            "give the directory holding the scenario files"
        )
    items = list_scenarios(Path(args.dir) if args.dir else SCENARIOS_DIR)
    if not items:
        print(f"no scenarios in {args.dir or SCENARIOS_DIR}")
        return Exit.PASS
    base = Path(args.dir) if args.dir else SCENARIOS_DIR
    names = [str(p.relative_to(base)) for p, _, _ in items]
    width = max(len(n) for n in names)
    for name, (_p, _name, desc) in zip(names, items):
        print(f"{name:<{width}}  {desc.splitlines()[0] if desc else ''}")
    return Exit.PASS


def cmd_figures(args) -> int:
    from bench.scenario.assertions import FUNCTIONS
    from bench.scenario.catalog import FIGURES, STATES

    for name, (kind, unit, doc) in FIGURES.items():
        print(f"{name:<24} {kind:<7} {unit:<6} {doc}")
    print(f"\nfunctions: {', '.join(sorted(FUNCTIONS))}\nstates: {', '.join(STATES)}")
    return Exit.PASS


def cmd_robots(args) -> int:
    from bench.robots import listing
    from bench.scenario.load import ScenarioError, load_scenario

    gym_types = []
    for path in args.files:
        try:
            s = load_scenario(path)
        except ScenarioError as exc:
            return _invalid(f"bench robots: invalid scenario: {exc}")
        from bench.robots import robot_type

        gym_types += [robot_type(g.robot) for g in s.groups if g.gym is not None]
    taken = {t.name: t.config for t in gym_types}
    for text in args.gym:
        from pydantic import ValidationError

        from bench.robots.gymenv import GymMappingError, gym_robot_type, type_name
        from bench.scenario.model import Gym

        try:
            config = Gym.model_validate(_parse_value(text)).model_dump(exclude_none=True)
            gym_types.append(gym_robot_type(config, type_name(config, taken), measure=False))
            taken[gym_types[-1].name] = config
        except ValidationError as exc:
            return _invalid(f"bench robots: --gym {text!r}: {exc.errors()[0]['msg']} (the keys of a group's gym:)")
        except GymMappingError as exc:
            return _invalid(f"bench robots: --gym {text!r}: {exc}")
    print(listing.format_rows(listing.available(gym_types, measure=not args.no_measure)))
    return Exit.PASS


def cmd_run(args) -> int:
    from bench.scenario.load import ScenarioError, build_scenario

    try:
        s = load_runnable(args.file, args.set)
        if s is not None and args.record_dataset is not None:  # the file's `record`, with dataset on (and DIR)
            record = {**(s.raw.get("record") or {}), "dataset": True}
            if args.record_dataset:
                record["dir"] = args.record_dataset
            s = build_scenario({**s.raw, "record": record}, f"{args.file} (--record-dataset)")
    except ScenarioError as exc:
        return _invalid(f"bench: invalid scenario: {exc}")
    if s is None:
        return Exit.INVALID
    if args.check:
        from bench.run.runner import reports_problems
        from bench.run.sizing import estimate, report_memory

        for problem in reports_problems(Path(args.reports)):
            return _invalid(f"bench: {problem}")
        est = estimate(s)
        print("\n".join(est.lines()))
        memory = report_memory(s)
        print(memory.line(s) if memory.fits else f"preflight: {memory.line(s)}")
        return Exit.PASS
    from bench.run import runner

    return runner.run_scenario(s, reports_dir=Path(args.reports), progress=not args.quiet, cluster=args.cluster)


def cmd_dataset(args) -> int:
    from bench.run.dataset import DatasetError, write_datasets

    run_dir = Path(args.run_dir)
    out = Path(args.out) if args.out else run_dir / "dataset"
    try:
        written = write_datasets(run_dir, out)
    except DatasetError as exc:
        return _invalid(f"bench dataset: {exc}")
    for line in written:
        print(f"bench dataset: {line}")
    return Exit.PASS


def cmd_incident(args) -> int:
    from bench.evidence import incident
    from bench.run import runner
    from bench.scenario.load import ScenarioError, load_scenario

    out = Path(args.out)
    try:
        scenario, window = incident.make_incident(
            args.edge,
            args.audit,
            args.t_from,
            args.t_to,
            out,
            name=args.name,
            robot=args.robot,
            export_dir=Path(args.export) if args.export else None,
            say=lambda line: print(f"bench incident: {line}", file=sys.stderr),
        )
    except (OSError, ValueError, KeyError) as exc:
        return _invalid(f"bench incident: {exc}")
    print(
        f"bench incident: wrote {out} ({len(scenario['faults'])} fault(s)) from {len(window.requests)} request(s) and "
        f"{len(window.transitions)} transition(s) in the window",
        file=sys.stderr,
    )
    for f in scenario["faults"]:
        print(f"  {f}", file=sys.stderr)
    if args.no_run:
        return Exit.PASS
    try:
        s = load_scenario(out)
    except ScenarioError as exc:
        return _invalid(f"bench incident: the written scenario is invalid: {exc}")
    stamp = runner.utc_stamp()
    rc = runner.run_scenario(s, reports_dir=Path(args.reports), progress=not args.quiet, stamp=stamp)
    run_dir = Path(args.reports) / s.name / stamp
    if rc == Exit.INVALID or not (run_dir / "transitions.parquet").is_file():
        return Exit.INVALID
    replay = incident.replay_log_of(run_dir, window.stutter)
    score = incident.compare_stutter(window, replay, window.span[1] - window.span[0])
    ok = incident.reproduced(score)
    (run_dir / "incident.json").write_text(__import__("json").dumps({**score, "reproduced": ok}, indent=2))
    print(
        f"bench incident: stutter {'REPRODUCED' if ok else 'NOT reproduced'}: original {score['original_stutter_s']:.1f} s, "
        f"replay {score['replay_stutter_s']:.1f} s, recall {score['recall']:.2f}, precision {score['precision']:.2f} "
        f"-> {run_dir}/incident.json",
        file=sys.stderr,
    )
    return max(rc, Exit.PASS if ok else Exit.FAIL)


def cmd_sweep(args) -> int:
    """`bench sweep FILE --key K --values a,b,c [--capacity]`: the scenario's sweep section from the command line."""
    from bench.scenario.load import ScenarioError, build_scenario

    if args.assert_ and not args.capacity:
        return _invalid(
            "bench sweep: --assert needs --capacity: sweep assertions judge a capacity sweep's knee; "
            "add --capacity, or put each run's checks in the scenario's assertions"
        )
    texts = args.values.split(",")
    if not all(t.strip() for t in texts):
        return _invalid(
            f"bench sweep: --values {args.values!r}: a value may not be empty; give comma-separated "
            "values, e.g. --values 4,8,16"
        )
    try:
        s = load_runnable(args.file, args.set)
        if s is None:
            return Exit.INVALID
        data = dict(s.raw)
        data["sweep"] = {
            "key": args.key,
            "values": [_parse_value(v) for v in texts],
            "mode": "capacity" if args.capacity else "runs",
            "assertions": list(args.assert_ or []),
        }
        s = build_scenario(data, f"{args.file} (bench sweep)")
    except ScenarioError as exc:
        return _invalid(f"bench: invalid scenario: {exc}")
    from bench.run import runner

    return runner.run_scenario(s, reports_dir=Path(args.reports), progress=not args.quiet)


def cmd_train(args) -> int:
    from bench.training import train

    out = Path(args.out) if args.out else None
    try:
        path = train.train_robot_policy(
            args.robot,
            out,
            seed=args.seed,
            policy_type=args.policy_type,
            episodes=args.episodes,
            steps=args.steps,
            fps=args.fps,
            rtc_mode=args.rtc_mode,
        )
    except train.TrainError as exc:
        return _invalid(f"bench train: {exc}")
    print(f"checkpoint written to {path}")
    return Exit.PASS


def cmd_init_weights(args) -> int:
    from bench.scenario.load import checkpoint_dir
    from server.policies.checkpoint import CheckpointError, init_weights

    try:
        path = init_weights(checkpoint_dir(args.checkpoint), seed=args.seed)
    except CheckpointError as exc:
        return _invalid(f"bench init-weights: {exc}")
    except OSError as exc:  # the directory cannot be read or written
        return _invalid(f"bench init-weights: {exc.filename or args.checkpoint}: {exc.strerror or exc}")
    print(f"random weights (seed {args.seed}) written to {path}/model.safetensors")
    return Exit.PASS


def cmd_pki(args) -> int:
    import json

    from bench.security.pki import Pki, PkiError
    from wire.acl import FleetIdentities, router_access_control
    from wire.errors import WireError
    from wire.keys import sanitize

    try:  # every name, and where the rules go, before anything is written
        for flag, names in (("--robot", args.robot), ("--replica", args.replica)):
            for name in names:
                sanitize(name, flag)  # a certificate's CN is a key chunk in the router's rules
        if args.acl:
            fleet = FleetIdentities(tuple(args.robot), tuple(args.replica))
            acl_path = Path(args.acl)
            if acl_path.is_dir() or not acl_path.parent.is_dir():
                return _invalid(
                    f"bench pki: --acl {args.acl!r}: "
                    f"{'is a directory' if acl_path.is_dir() else 'its directory does not exist'}; "
                    "give a file in an existing directory"
                )
    except (WireError, ValueError) as exc:
        return _invalid(f"bench pki: {str(exc).split('] ', 1)[-1]}")
    try:
        pki = Pki(args.dir, days=args.days)
    except (RuntimeError, PkiError) as exc:
        return _invalid(f"bench pki: {exc}")
    issued = []
    if args.router:
        issued.append(("router", pki.router()))
    for rid in args.replica:
        issued.append((f"server-{rid}", pki.server(rid)))
    for uuid in args.robot:
        issued.append((uuid, pki.robot(uuid)))
    print(f"CA {pki.ca_cert_path} (key {pki.ca_key_path}, mode 0600)")
    for cn, f in issued:
        print(f"  CN {cn}: cert {f.cert} key {f.key}")
    if args.acl:
        acl = router_access_control(fleet)
        Path(args.acl).write_text(json.dumps({"access_control": acl}, indent=1))
        print(f"router access rules for {len(args.robot)} robot(s) and {len(args.replica)} replica(s): {args.acl}")
    return Exit.PASS


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="bench", description="The digital twin: run robot fleets against real servers.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    run = sub.add_parser(
        "run",
        help="run a scenario (exit 0 pass, 1 fail, 2 invalid or error, 3 inconclusive)",
        epilog=exitcode.HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("file")
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a scenario key, e.g. --set duration_s=10 --set fleet.groups.0.count=4",
    )
    run.add_argument("--reports", default="reports", help="reports root (default ./reports)")
    run.add_argument("--quiet", action="store_true", help="no progress line")
    run.add_argument(
        "--cluster",
        default=None,
        metavar="ray|ray://HOST:PORT",
        help="place shards and replicas on a Ray cluster (`ray`: the address in RAY_ADDRESS); "
        "default: every process on this host (docs/cluster.md)",
    )
    run.add_argument(
        "--check",
        action="store_true",
        help="print the preflight (shards, the host's speed, estimated cores, real time or not) and exit "
        "without running",
    )
    run.add_argument(
        "--record-dataset",
        nargs="?",
        const="",
        default=None,
        metavar="DIR",
        help="record every robot's episodes as LeRobotDatasets, one per group, in DIR/<group>/ (default: the run "
        "directory's dataset/); the scenario's `record` key, with dataset: true",
    )
    run.set_defaults(func=cmd_run)

    ds = sub.add_parser(
        "dataset", help="write a recorded run's episodes as LeRobotDatasets (a run made with record.dataset)"
    )
    ds.add_argument("run_dir", help="the run directory (reports/<scenario>/<stamp>)")
    ds.add_argument(
        "out", nargs="?", default=None, help="output directory, one dataset per group (default RUN_DIR/dataset)"
    )
    ds.set_defaults(func=cmd_dataset)

    sw = sub.add_parser("sweep", help="run a scenario once per value of one key (a load test with --capacity)")
    sw.add_argument("file")
    sw.add_argument("--key", required=True, help="dotted key, e.g. fleet.groups.0.count")
    sw.add_argument("--values", required=True, help="comma-separated YAML values, e.g. 4,8,16 (or -1,0)")
    sw.add_argument(
        "--capacity",
        action="store_true",
        help="load steps: stop at the first failing value, report the knee and the P10 formula",
    )
    sw.add_argument(
        "--assert",
        dest="assert_",
        action="append",
        metavar="EXPR",
        help="a sweep assertion over knee, n_max, knee_ratio, ... (needs --capacity)",
    )
    sw.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    sw.add_argument("--reports", default="reports")
    sw.add_argument("--quiet", action="store_true")
    sw.set_defaults(func=cmd_sweep)

    inc = sub.add_parser("incident", help="write a scenario replaying one robot's incident from its logs, then run it")
    inc.add_argument(
        "--edge",
        required=True,
        help="edge-log JSONL of the robot, a bench run directory (with --robot), or a LeRobotDataset recorded with "
        "the bench's provenance (--robot when it holds several robots)",
    )
    inc.add_argument("--robot", type=int, default=None, help="robot number in a bench run directory or dataset")
    inc.add_argument("--audit", action="append", default=[], help="server audit log (JSON lines); repeatable")
    inc.add_argument(
        "--from",
        dest="t_from",
        type=float,
        required=True,
        help="window start (edge-log seconds; clipped to the records)",
    )
    inc.add_argument(
        "--to", dest="t_to", type=float, required=True, help="window end (edge-log seconds; clipped to the records)"
    )
    inc.add_argument("--out", required=True, help="scenario file to write")
    inc.add_argument("--name", default=None, help="scenario name (default: the file's stem)")
    inc.add_argument("--export", default=None, help="also write the window's edge-log.jsonl and audit.jsonl here")
    inc.add_argument("--no-run", action="store_true", help="only write the scenario")
    inc.add_argument("--reports", default="reports")
    inc.add_argument("--quiet", action="store_true")
    inc.set_defaults(func=cmd_incident)

    val = sub.add_parser("validate", help="check scenario files without running them (exit 0 or 2)")
    val.add_argument("files", nargs="+")
    val.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    val.set_defaults(func=cmd_validate)

    ls = sub.add_parser("list", help="the shipped scenarios")
    ls.add_argument("--dir", default=None)
    ls.set_defaults(func=cmd_list)

    fig = sub.add_parser("figures", help="figures and functions usable in assertions")
    fig.set_defaults(func=cmd_figures)

    rb = sub.add_parser(
        "robots",
        help="robot types available here: state/action names, cameras, fps, fallback, measured cost per tick",
    )
    rb.add_argument("files", nargs="*", help="scenario files whose gym groups to list too")
    rb.add_argument(
        "--gym",
        action="append",
        default=[],
        metavar="MAPPING",
        help="a gym env to list too, as a group's gym: key in YAML, e.g. "
        "--gym '{env: gym_pusht/PushT-v0, kwargs: {obs_type: state}}' (repeatable)",
    )
    rb.add_argument("--no-measure", action="store_true", help="skip the short stepping measurement of each type")
    rb.set_defaults(func=cmd_robots)

    sch = sub.add_parser("schema", help="print a JSON Schema for editors (docs/scenarios.md, Editor support)")
    sch.add_argument("what", choices=["scenario"])
    sch.set_defaults(func=cmd_schema)

    tr = sub.add_parser("train", help="train a behaviour-cloned checkpoint into bench/checkpoints/<robot>/")
    tr.add_argument("--robot", required=True, help="robot type (arm, reacher, base, so101)")
    tr.add_argument("--out", default=None, help="output directory (default bench/checkpoints/<robot>)")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument(
        "--policy-type",
        default=None,
        help="flow_matching (supports RTC), flow_transformer (RTC; its own recipe), mlp_chunk, or lerobot_act "
        "(LeRobot's ACT trained by LeRobot's code on a LeRobotDataset of the demos; bench/checkpoints/<robot>_lerobot_act)",
    )
    tr.add_argument("--fps", type=float, default=None, help="control rate of the demos = the checkpoint's trained fps")
    tr.add_argument("--episodes", type=int, default=None, help="expert demonstrations to collect")
    tr.add_argument("--steps", type=int, default=None, help="training steps")
    tr.add_argument(
        "--rtc-mode",
        default=None,
        choices=("guidance", "training_time"),
        help="training_time: train for training-time RTC (prefix-conditioned demos and policy; "
        "its own recipe per --policy-type: flow_matching, flow_transformer); default guidance "
        "(inference-time RTC)",
    )
    tr.set_defaults(func=cmd_train)

    iw = sub.add_parser(
        "init-weights",
        help="seeded random weights for a checkpoint shipped as config.json + "
        "stats.json only (bench/checkpoints/reacher_vla: timing, not skill)",
    )
    iw.add_argument("checkpoint", help="checkpoint name under bench/checkpoints/ or a path")
    iw.add_argument("--seed", type=int, default=0)
    iw.set_defaults(func=cmd_init_weights)

    pk = sub.add_parser("pki", help="a test CA and certificates: robots (CN = client uuid), replicas, the router")
    pk.add_argument(
        "--dir",
        required=True,
        help="directory for ca.pem/ca.key and the leaves (created 0700 if missing; an existing CA in it is reused)",
    )
    pk.add_argument("--robot", action="append", default=[], metavar="UUID", help="a robot certificate (repeatable)")
    pk.add_argument("--replica", action="append", default=[], metavar="ID", help="a server replica certificate")
    pk.add_argument("--router", action="store_true", help="the router certificate (names localhost, 127.0.0.1)")
    pk.add_argument("--acl", default=None, metavar="FILE", help="also write the router access rules for these")
    pk.add_argument("--days", type=int, default=30, help="validity of new certificates, 1 to 3650 days (default 30)")
    pk.set_defaults(func=cmd_pki)
    return ap


def _glue_negative_values(argv: list[str]) -> list[str]:
    """`--values -1,0` as `--values=-1,0`: argparse takes an argument that starts with '-' (and is not a plain
    number) for an option, so a sweep over negative values would be refused as a missing argument."""
    out = list(argv)
    for i in range(len(out) - 1):
        if out[i] == "--values" and re.match(r"-[\d.]", out[i + 1]):
            out[i : i + 2] = [f"--values={out[i + 1]}"]
            break
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(_glue_negative_values(sys.argv[1:] if argv is None else argv))
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
