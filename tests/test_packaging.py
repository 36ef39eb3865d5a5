"""The plain install is the robot side: no torch, no MuJoCo; console scripts are declared."""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_plain_dependencies_pull_no_torch_or_mujoco():
    deps = " ".join(PYPROJECT["project"]["dependencies"]).lower()
    for heavy in ("torch", "mujoco", "gymnasium", "prometheus", "psutil"):
        assert heavy not in deps


def test_install_script_pins_the_local_torch_wheels_and_lerobot():
    # any other torch spec downloads gigabytes here; lerobot 0.4.4 goes in --no-deps beside its pinned runtime set
    script = (ROOT / "scripts" / "install.sh").read_text()
    assert '"torch==2.14.1" "torchvision==0.29.1"' in script
    assert '--no-deps "lerobot==0.4.4"' in script
    assert (ROOT / "requirements" / "lerobot-0.4.4-runtime.txt").is_file()
    assert PYPROJECT["project"]["optional-dependencies"]["lerobot"] == ["lerobot==0.4.4"]


def test_console_scripts_are_declared():
    scripts = PYPROJECT["project"]["scripts"]
    assert scripts["bench"] == "bench.cli:main"
    assert scripts["policy-server"] == "server.cli:main"


def test_importing_the_wire_imports_no_torch():
    code = "import sys, wire, wire.transport, wire.procs; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_robot_side_imports_no_server_or_bench_library():
    code = (
        "import sys, wire, wire.transport, edge; "
        "bad = {'prometheus_client', 'psutil', 'torch'} & set(sys.modules); assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
