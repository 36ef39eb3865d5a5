"""scripts/device/: the accelerator-machine run stays runnable from here (syntax, the files and options it
names, the dry fleet overrides against today's scenario) and its Python half packs, checks and pins right."""

from __future__ import annotations

import importlib.util
import io
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEVICE = ROOT / "scripts" / "device"
RUN_SH = (DEVICE / "run.sh").read_text()

spec = importlib.util.spec_from_file_location("device_helper", DEVICE / "device.py")
device = importlib.util.module_from_spec(spec)
spec.loader.exec_module(device)


@pytest.mark.parametrize("script", ["run.sh", "wheels.sh"])
def test_the_scripts_parse_and_are_executable(script):
    path = DEVICE / script
    subprocess.run(["bash", "-n", str(path)], check=True)
    assert path.stat().st_mode & 0o111, f"{script} is not executable"


def test_every_file_and_module_run_sh_names_exists():
    files = set(re.findall(r"\b(scenarios/[\w./-]+\.yaml)", RUN_SH))
    files |= {"bench/checkpoints/reacher_vla/config.json", "bench/checkpoints/reacher_vla/stats.json"}
    assert {"scenarios/capacity_gpu.yaml", "scenarios/1000_robots_wan.yaml"} <= files
    modules = set(re.findall(r'"\$PY" -m ([\w.]+)', RUN_SH))
    assert {"benchmarks.gpu_forward", "bench.cli"} <= modules
    for f in files:
        assert (ROOT / f).is_file(), f"run.sh names {f}, which is gone"
    # ours only: find_spec("pip") switches setuptools' distutils shim (_distutils_hack) to pip's mode for the whole
    # process, and a torch.compile on a CPU in a later test then fails (AssertionError: .../distutils/core.py)
    ours = {m for m in modules if m.split(".")[0] in ("bench", "benchmarks", "server", "edge", "wire", "chaos")}
    assert ours
    for m in ours:
        assert importlib.util.find_spec(m) is not None, f"run.sh runs python -m {m}, which is gone"


def test_gpu_forward_still_takes_every_option_run_sh_passes():
    used = set(
        re.findall(r"(--[a-z][a-z-]+)", RUN_SH[RUN_SH.index("step_forward() {") : RUN_SH.index("step_capacity() {")])
    )
    helptext = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_forward", "--help"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    missing = {u for u in used if u not in helptext}
    assert used and not missing, f"benchmarks.gpu_forward no longer takes {missing}"


def test_the_forward_compile_steps_arguments_run_at_tiny_size(tmp_path):
    """forward-compile's own arguments (values too, not only the option names) taken by benchmarks.gpu_forward, at a
    tiny size on the CPU (argparse keeps the last of each): the passes capacity_gpu serves, micro-batching first."""
    import shlex

    step = RUN_SH[RUN_SH.index("step_forward() {") : RUN_SH.index("step_capacity() {")]
    branch = step[step.index('elif [ "$2" = forward-compile ]') :]
    words = shlex.split(re.search(r"args\+=\((.*?)\)", branch, re.S).group(1), comments=True)
    import benchmarks.gpu_forward as gf

    out = tmp_path / "gpu_forward_compile.json"
    assert (
        gf.main(
            words
            + [
                "--device",
                "cpu",
                "--preset",
                "tiny",
                "--cameras",
                "1",
                "--image-size",
                "32",
                "--batches",
                "1",
                "2",
                "--repeat",
                "1",
                "--warmup",
                "0",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert report["stages"] == ["micro_batching", "forward", "runtime"] and report["passes"] == [
        "plain",
        "training_time",
    ]
    assert list(report).index("micro_batching") < list(report).index("forward")  # written first: timed first
    assert set(report["forward"]["2"]) == {"plain", "training_time"}
    assert set(report["micro_batching"]) == {"sessions", "plain", "training_time"}
    assert report["micro_batching"]["training_time"]["gain"] > 0
    assert "median_ms" not in report["runtime"]["2"] and report["runtime"]["2"]["training_time_ms"] > 0
    text = "\n".join(device.forward_lines(report, "forward-compile"))
    assert "passes plain/training_time" in text and "guided ms -/-;" in text
    assert re.search(
        r"micro-batching at 2 sessions, requests/s one at a time -> micro-batched: plain [\d.]+ -> [\d.]+ "
        r"\(gain [\d.]+x\); training-time",
        text,
    )


def test_the_dry_fleet_overrides_still_fit_1000_robots_wan():
    args = subprocess.run(
        [
            "bash",
            "-c",
            'eval "$(sed -n "/^DRY_FLEET=(/,/)$/p" "$0")"; printf "%s\\n" "${DRY_FLEET[@]}"',
            str(DEVICE / "run.sh"),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    sets = [a for a in args if a != "--set"]
    assert len(sets) == len(args) // 2 >= 5
    from bench.cli import load_with_overrides

    s = load_with_overrides(str(ROOT / "scenarios/1000_robots_wan.yaml"), sets)
    assert s.robots == 20 and s.duration_s == 20 and len(s.replicas) == 2
    assert all(f["at"] < s.duration_s for f in s.faults), "a dry fault falls after the dry run's end"
    assert {g.cameras.kind for g in s.groups} == {"synthetic"}, "the device has no libEGL: no rendered camera"


def test_out_gets_at_most_eight_files():
    code = "\n".join(line for line in RUN_SH.splitlines() if not line.lstrip().startswith("#"))
    names = set(re.findall(r'\$OUT/([\w.-]+)', code)) | set(re.findall(r'out="\$WORK/(gpu_forward\w*\.json)"', code))
    assert {
        "summary.txt",
        "steps.json",
        "env.txt",
        "console.log",
        "capacity.tar.gz",
        "fleet.tar.gz",
        "gpu_forward.json",
        "gpu_forward_compile.json",
    } == names  # the device tool brings back 8 files at most


def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> None:
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
        meta = "Metadata-Version: 2.1\nName: {name}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
        z.writestr(f"{name}-{version}.dist-info/METADATA", meta)


def test_check_wheels_finds_a_missing_need_a_duplicate_and_honours_markers_and_left_out(tmp_path):
    _wheel(tmp_path, "alpha", "1.0", ["beta>=1", "numpy", "tomli; python_version < '3.11'", "pytest; extra == 'test'"])
    _wheel(tmp_path, "beta", "1.0", ["gamma"])
    assert device.check_wheels(tmp_path, ["alpha", "beta"], ["numpy"], 60, left_out=["gamma"]) == []
    problems = device.check_wheels(tmp_path, ["alpha", "beta"], ["numpy"], 60)
    assert problems == [
        "beta-1.0-py3-none-any.whl needs gamma, neither carried nor on the machine (device-has.txt) "
        "nor left out on purpose (`-gamma` in packages.txt)"
    ]
    _wheel(tmp_path, "beta", "2.0", [])
    assert any("2 wheels" in p for p in device.check_wheels(tmp_path, ["alpha", "beta"], ["numpy"], 60, ["gamma"]))
    assert any("over the" in p for p in device.check_wheels(tmp_path, ["alpha", "beta"], ["numpy"], 1e-6, ["gamma"]))
    assert "total" in (tmp_path / "MANIFEST.txt").read_text()


def test_the_package_list_pins_what_is_installed_here_and_leaves_the_viewer_out():
    names = device.read_names(DEVICE / "packages.txt")
    assert "mujoco" in names and "websockets" not in names and "ray" not in names
    assert device.read_names(DEVICE / "packages.txt", left_out=True) == ["websockets"]
    assert device.cmd_pins(str(DEVICE / "packages.txt")) == 0


def test_pack_keeps_small_files_whole_tails_logs_and_names_what_it_left_out(tmp_path):
    run = tmp_path / "reports" / "1000_robots_wan" / "20261126T000000Z"
    (run / "logs").mkdir(parents=True)
    (run / "summary.json").write_text('{"verdict": "pass"}')
    (run / "ticks.parquet").write_bytes(b"\0" * (3 * 2**20))
    (run / "logs" / "shard-0.log").write_text("".join(f"line {i}\n" for i in range(100_000)))
    out = tmp_path / "fleet.tar.gz"
    listing = device.pack(tmp_path / "reports", out, cap_mb=1.0)
    with tarfile.open(out) as tar:
        names = set(tar.getnames())
        log = tar.extractfile("1000_robots_wan/20261126T000000Z/logs/shard-0.log").read().decode().splitlines()
        packed = tar.extractfile("PACKED.txt").read().decode()
    assert "1000_robots_wan/20261126T000000Z/summary.json" in names
    assert "1000_robots_wan/20261126T000000Z/ticks.parquet" not in names
    assert log[-1] == "line 99999" and len(log) == device.LOG_TAIL_LINES[".log"]
    assert "LEFT OUT" in packed and "ticks.parquet" in packed
    assert any(line.startswith("LEFT OUT") for line in listing)


def test_record_rewrites_one_entry_per_step(tmp_path):
    steps = tmp_path / "steps.json"
    device.cmd_record(str(steps), "fleet", "124", "330.4", "330", "stopped at its limit")
    device.cmd_record(str(steps), "fleet", "0", "200", "330")
    device.cmd_record(str(steps), "capacity", "2", "3", "180", "refused without CUDA (expected: exit 2)")
    import json

    data = json.loads(steps.read_text())["steps"]
    assert [(s["name"], s["rc"], s["timed_out"]) for s in data] == [("fleet", 0, False), ("capacity", 2, False)]
    out = io.StringIO()
    sys.stdout, old = out, sys.stdout
    try:
        device.cmd_summary(str(tmp_path), str(steps))
    finally:
        sys.stdout = old
    assert "capacity rc=2 3s/180s [refused without CUDA (expected: exit 2)]" in out.getvalue()
    assert "fleet: no summary.json" in out.getvalue()


def test_run_logged_ends_what_a_command_left_running(tmp_path):
    """The bench's children run in their own sessions: a step's leftovers must not run into the next step."""
    harness = f"""
CONSOLE={tmp_path}/console.log; NICE=""
eval "$(sed -n '/^run_logged() {{/,/^}}/p; /^reap() {{/,/^}}/p' {DEVICE / 'run.sh'})"
run_logged 20 {tmp_path}/step.log bash -c 'setsid sleep 97 >/dev/null 2>&1 & echo $! > {tmp_path}/pid; exit 3'
echo "rc $?"
"""
    out = subprocess.run(["bash", "-c", harness], check=True, capture_output=True, text=True).stdout
    pid = int((tmp_path / "pid").read_text())
    assert "rc 3" in out
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    assert f"leftover processes, ended: {pid} sleep 97" in (tmp_path / "console.log").read_text()


@pytest.mark.parametrize(
    "carried, have, install",
    [
        ("4.16.0", None, True),  # missing on the machine
        ("4.16.0", "4.12.2", True),  # older there: pydantic needs >= 4.14.1
        ("4.16.0", "4.16.0", False),
        ("2.13.4", "2.14.0", False),  # newer there: kept
    ],
)
def test_a_carried_wheel_goes_in_only_where_the_machine_lacks_it_or_has_it_older(carried, have, install):
    assert device.needs_install(carried, have) is install


def test_gpu_forward_keeps_the_sizes_it_timed_when_stopped_at_its_limit(tmp_path, monkeypatch):
    """The device run stops a step at its time limit: the forward times already measured must be on disk."""
    import json

    import benchmarks.gpu_forward as gf

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt  # what run.sh's Ctrl-C at the step's limit does mid-stage

    monkeypatch.setattr(gf, "gain_figures", stopped)
    out = tmp_path / "gpu_forward.json"
    try:
        gf.main(
            [
                "--device",
                "cpu",
                "--preset",
                "tiny",
                "--cameras",
                "1",
                "--image-size",
                "32",
                "--batches",
                "1",
                "2",
                "--repeat",
                "1",
                "--warmup",
                "0",
                "--out",
                str(out),
            ]
        )
    except KeyboardInterrupt:
        pass
    report = json.loads(out.read_text())
    assert list(report["forward"]) == ["1", "2"] and report["complete"] is False
    assert report["forward"]["2"]["guided"]["median_ms"] > 0 and "micro_batching" not in report


def test_the_fleet_summary_names_where_the_cpu_went_and_why_robots_died(tmp_path):
    """What issue 17 asks of the 1,000-robot run, in the summary the device call prints last."""
    run = tmp_path / "1000_robots_wan" / "20261126T000000Z"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(
        json.dumps(
            {
                "verdict": "fail",
                "exit_code": 1,
                "robots": 1000,
                "wall_s": 200.0,
                "figures": {},
                "assertions": [],
                "cpu": {
                    "host_percent": 51.0,
                    "cores": 16,
                    "split": {"shard:0": 90.0},
                    "estimate": {"split": {"shards": 3.46, "replicas": 1.65}},
                    "by_kind": {"shards": 3.1, "replicas": 2.2},
                    "estimate_ratio": 1.1,
                    "estimate_ratio_at_reference": 0.9,
                },
                "state_changes": [
                    {
                        "from": "STALLED",
                        "to": "DEAD",
                        "reason": "offline",
                        "example": "offline for more than 60 s",
                        "changes": 400,
                        "robots": 400,
                        "t_first": 81.0,
                        "t_last": 95.5,
                    }
                ],
                "latency_budget": [
                    {"figure": "uplink_to_router_ms", "p50_ms": 27.1, "p99_ms": 63.5},
                    {
                        "figure": "uplink_from_router_ms",
                        "p50_ms": 1.5,
                        "p99_ms": 54.5,
                        "bench_p50_ms": 1.3,
                        "bench_p99_ms": 54.2,
                    },
                ],
            }
        )
    )
    text = "\n".join(device.fleet_lines(tmp_path))
    assert "shards 3.10 / 3.46, replicas 2.20 / 1.65 (ratio 1.10; 0.90 unscaled)" in text
    # each hop at the router, and the bench's part of it where that is measured
    assert "up to router 27.1/63.5; router to server 1.5/54.5 (the bench's part 1.3/54.2)" in text
    assert "STALLED -> DEAD: 400 changes, 400 robots, t 81..95.5 s: offline for more than 60 s" in text


def test_the_forward_summary_gives_a_compiled_runs_eager_baseline_and_gain():
    row = {
        "guided": {"median_ms": 378.0},
        "plain": {"median_ms": 25.0, "compile_gain": 5.0},
        "training_time": {"median_ms": 23.5, "compile_gain": 7.0},
        "plain_eager": {"median_ms": 125.0},
        "training_time_eager": {"median_ms": 164.5},
    }
    report = {
        "preset": "vla_300m",
        "parameters": 353.8e6,
        "device": "NVIDIA H200",
        "torch": "2.11",
        "autocast": "bf16",
        "cameras": 2,
        "image_size": 224,
        "compile": True,
        "forward": {"1": row},
        "runtime": {
            "1": {
                "median_ms": 374.0,
                "training_time_ms": 40.0,
                "training_time_cpu_jpeg_ms": 50.0,
                "gpu_jpeg_gain": 1.25,
            }
        },
    }
    text = "\n".join(device.forward_lines(report, "forward-compile"))
    assert "runtime training-time ms 40.00" in text
    assert "CPU decoder -> nvjpeg, ms: 50.00 -> 40.00; gain 1.25x" in text
    assert (
        "eager in the same process, ms: plain 125.00; training-time 164.50; compile's gain: plain 5.00x, "
        "training-time 7.00x" in text
    )
    # since the guided VJP compiles too: its eager row and gain first, and a path whose compile failed, named
    row.update(guided_eager={"median_ms": 500.0})
    row["guided"]["compile_gain"] = 500.0 / 378.0
    report["compile_fallbacks"] = ["compiling the network failed, it runs eager: BackendCompilerFailed: x"]
    text = "\n".join(device.forward_lines(report, "forward-compile"))
    assert (
        "eager in the same process, ms: guided 500.00; plain 125.00; training-time 164.50; compile's gain: "
        "guided 1.32x, plain 5.00x, training-time 7.00x" in text
    )
    assert "compile fell back: compiling the network failed, it runs eager: BackendCompilerFailed" in text


def test_the_forward_summary_of_a_run_without_the_forward_stage_gives_the_runtimes_figures():
    """FORWARD_ARGS="--stages runtime": no forward sizes in the report; the JPEG path's figures and the GPU
    decoder's gain are still summarised, at the runtime's sizes."""
    report = {
        "preset": "vla_300m",
        "parameters": 353.8e6,
        "device": "NVIDIA H100",
        "torch": "2.11",
        "autocast": "bf16",
        "cameras": 2,
        "image_size": 224,
        "compile": True,
        "stages": ["runtime"],
        "runtime": {
            "gpu_jpeg_decode": True,
            "1": {
                "median_ms": 300.0,
                "training_time_ms": 30.0,
                "training_time_cpu_jpeg_ms": 36.0,
                "gpu_jpeg_gain": 1.2,
            },
            "64": {
                "median_ms": 310.0,
                "training_time_ms": 80.0,
                "training_time_cpu_jpeg_ms": 160.0,
                "gpu_jpeg_gain": 2.0,
            },
        },
    }
    text = "\n".join(device.forward_lines(report, "forward-compile"))
    assert "batch 1/64: guided ms -/-; plain ms -/-; runtime (JPEG, whole batched path) ms 300.00/310.00" in text
    assert "CPU decoder -> nvjpeg, ms: 36.00 -> 30.00/160.00 -> 80.00; gain 1.20x/2.00x" in text
    assert "micro-batching: not timed" in text and "eager in the same process" not in text
