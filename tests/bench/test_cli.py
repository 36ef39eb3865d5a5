"""`bench` refuses bad input with one line on stderr and exit 2, never a traceback, and before slow work starts: one
test per finding of the CLI fuzzing pass (non-UTF-8 and non-regular scenario files, `bench train`'s arguments,
`bench init-weights`' files, `bench sweep`'s flags)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench import cli
from bench.evidence.exitcode import Exit
from bench.scenario.load import SCENARIOS_DIR

SMOKE = SCENARIOS_DIR / "smoke.yaml"


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    rc = cli.main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


# ---- bench validate / bench list ---------------------------------------------------------------------------------


def test_validate_names_a_file_that_is_not_utf8(tmp_path, capsys):
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe\xfa")
    rc, err = run_cli(capsys, "validate", str(path))
    assert rc == Exit.INVALID
    assert err == f"INVALID {path}: not UTF-8 text (byte 0xff at offset 0); a scenario is a YAML file saved as UTF-8\n"


def test_list_shows_unreadable_files_as_invalid_rows_and_never_opens_a_fifo(tmp_path, capsys):
    (tmp_path / "good.yaml").write_text(SMOKE.read_text())
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\xfa")
    os.mkfifo(tmp_path / "fifo.yaml")  # opening it for reading would wait for a writer forever
    (tmp_path / "dir.yaml").mkdir()
    (tmp_path / "dangling.yaml").symlink_to(tmp_path / "nowhere")
    rc = cli.main(["list", "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == Exit.PASS
    rows = {line.split()[0]: line for line in out.splitlines()}
    assert sorted(rows) == ["bin.yaml", "dangling.yaml", "dir.yaml", "fifo.yaml", "good.yaml"]
    assert "INVALID" not in rows["good.yaml"]
    assert "not UTF-8 text" in rows["bin.yaml"]
    assert "not a regular file" in rows["fifo.yaml"]
    assert all("INVALID: " in rows[n] for n in ("dangling.yaml", "dir.yaml"))


@pytest.mark.parametrize("which", ["missing", "a file"])
def test_list_refuses_a_dir_that_is_not_a_directory(tmp_path, capsys, which):
    target = tmp_path / "nope" if which == "missing" else SMOKE
    rc, err = run_cli(capsys, "list", "--dir", str(target))
    assert rc == Exit.INVALID
    assert err.startswith(f"bench list: --dir {str(target)!r} ")
    assert ("does not exist" if which == "missing" else "is not a directory") in err


# ---- bench train: every argument checked before the demos -------------------------------------------------------


@pytest.fixture
def no_demos(monkeypatch):
    """Collecting demos takes seconds to minutes: a refused argument must never get there."""
    from bench.training import demos

    def collected(*args, **kwargs):
        raise AssertionError("demos collected before the arguments were checked")

    for name in ("collect_demos", "collect_prefix_demos"):
        monkeypatch.setattr(demos, name, collected)


TRAIN_CASES = [
    # (extra arguments, words); `--out` is added unless given
    (["--fps", "-1"], "--fps -1: must be a finite number of Hz > 0"),
    (["--fps", "inf"], "--fps inf: must be a finite number of Hz > 0"),
    (["--fps", "nan"], "--fps nan: must be a finite number of Hz > 0"),
    (["--fps", "0"], "--fps 0: must be a finite number of Hz > 0"),  # was the recipe's fps, silently
    (["--episodes", "-1"], "--episodes -1: must be at least 1"),
    (["--episodes", "0"], "--episodes 0: must be at least 1"),  # was the recipe's count, silently
    (["--steps", "0"], "--steps 0: must be at least 1"),
    (["--seed", "-1"], "--seed -1: must be >= 0"),
    (["--policy-type", "nosuch"], "--policy-type: unknown policy type 'nosuch'"),
    (
        ["--policy-type", "no_chunk"],
        "--policy-type: policy type 'no_chunk' (NoChunkPolicy) has no predict_action_chunk",
    ),
    (["--out", "{file}"], "--out '{file}' is not a directory"),
    (["--out", "{file}/ckpt"], "--out '{file}/ckpt': cannot write there (Not a directory)"),
]


@pytest.mark.parametrize("extra,words", TRAIN_CASES, ids=[" ".join(c[0]) for c in TRAIN_CASES])
def test_train_refuses_a_bad_argument_before_collecting_demos(tmp_path, capsys, no_demos, extra, words):
    pytest.importorskip("torch")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    extra = [e.replace("{file}", str(a_file)) for e in extra]
    out = [] if "--out" in extra else ["--out", str(tmp_path / "ckpt")]
    rc, err = run_cli(capsys, "train", "--robot", "reacher", "--episodes", "1", "--steps", "1", *out, *extra)
    assert rc == Exit.INVALID
    assert err.startswith("bench train: ") and err.count("\n") == 1, err
    assert words.replace("{file}", str(a_file)) in err, err


# ---- bench init-weights: the file at fault, named ---------------------------------------------------------------

CONFIG = {"type": "mlp_chunk", "state_dim": 2, "action_dim": 1, "chunk_size": 4, "fps": 30.0, "execution_horizon": 2}
STATS = {"observation.state": {"mean": [0.0, 0.0], "std": [1.0, 1.0]}, "action": {"mean": [0.0], "std": [1.0]}}

INIT_CASES = [
    # (id, config.json bytes, stats.json bytes, file at fault, words)
    ("config not JSON", b"garbage{", None, "config.json", "not valid JSON"),
    ("config a list", b"[1, 2]", None, "config.json", "must hold a JSON object"),
    ("config empty object", b"{}", None, "config.json", "PolicyConfig is incomplete"),
    (
        "config state_dim text",
        json.dumps(CONFIG | {"state_dim": "x"}).encode(),
        None,
        "config.json",
        "state_dim must be a positive int, got 'x'",
    ),
    (
        "config chunk_size negative",
        json.dumps(CONFIG | {"chunk_size": -5}).encode(),
        None,
        "config.json",
        "chunk_size must be a positive int, got -5",
    ),
    (
        "config odd d_model",
        json.dumps(CONFIG | {"type": "flow_transformer", "hyper_params": {"d_model": 9}}).encode(),
        None,
        "config.json",
        "d_model=9 must be even",
    ),
    (
        "config unknown type",
        json.dumps(CONFIG | {"type": "nosuch"}).encode(),
        None,
        "config.json",
        "unknown policy type 'nosuch'",
    ),
    ("config not UTF-8", b"\xff\xfe\xfa", None, "config.json", "not UTF-8 text (byte 0xff at offset 0)"),
    ("stats not JSON", None, b"garbage{", "stats.json", "not valid JSON"),
    ("stats not UTF-8", None, b"\xff\xfe\xfa", "stats.json", "not UTF-8 text (byte 0xff at offset 0)"),
    ("stats a list", None, b"[1]", "stats.json", "must hold a JSON object, got list"),
    ("stats wrong entry", None, json.dumps({"x": 1}).encode(), "stats.json", "has an entry 'x'"),
]


@pytest.mark.parametrize("case", [c[0] for c in INIT_CASES])
def test_init_weights_names_the_file_it_cannot_use(tmp_path, capsys, case):
    pytest.importorskip("torch")
    _, config, stats, at_fault, words = next(c for c in INIT_CASES if c[0] == case)
    (tmp_path / "config.json").write_bytes(config if config is not None else json.dumps(CONFIG).encode())
    (tmp_path / "stats.json").write_bytes(stats if stats is not None else json.dumps(STATS).encode())
    rc, err = run_cli(capsys, "init-weights", str(tmp_path))
    assert rc == Exit.INVALID
    assert err.startswith(f"bench init-weights: {tmp_path / at_fault}: ") and err.count("\n") == 1, err
    assert words in err, err
    assert not (tmp_path / "model.safetensors").exists()


def test_init_weights_still_writes_weights_for_good_files(tmp_path, capsys):
    pytest.importorskip("torch")
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    (tmp_path / "stats.json").write_text(json.dumps(STATS))
    assert cli.main(["init-weights", str(tmp_path)]) == Exit.PASS
    assert (tmp_path / "model.safetensors").is_file()


# ---- bench sweep ---------------------------------------------------------------------------------------------------


@pytest.fixture
def runs(monkeypatch) -> list:
    """The scenarios `bench sweep` would run (never runs one)."""
    from bench.run import runner

    started = []
    monkeypatch.setattr(runner, "run_scenario", lambda s, **kw: started.append(s) or Exit.PASS)
    return started


def test_sweep_refuses_assert_without_capacity(tmp_path, capsys, runs):
    rc, err = run_cli(
        capsys,
        "sweep",
        str(SMOKE),
        "--key",
        "fleet.groups.0.count",
        "--values",
        "1,2",
        "--assert",
        "knee >= 2",
        "--reports",
        str(tmp_path),
    )
    assert rc == Exit.INVALID and not runs
    assert err.startswith("bench sweep: --assert needs --capacity"), err


@pytest.mark.parametrize("values", [",", "1,", ",2", ""])
def test_sweep_refuses_an_empty_value(tmp_path, capsys, runs, values):
    rc, err = run_cli(
        capsys, "sweep", str(SMOKE), "--key", "fleet.groups.0.count", "--values", values, "--reports", str(tmp_path)
    )
    assert rc == Exit.INVALID and not runs
    assert (
        err == f"bench sweep: --values {values!r}: a value may not be empty; give comma-separated values, "
        "e.g. --values 4,8,16\n"
    )


def test_sweep_takes_negative_values_after_values(tmp_path, capsys, runs):
    rc = cli.main(["sweep", str(SMOKE), "--key", "seed", "--values", "-1,0", "--reports", str(tmp_path)])
    assert rc == Exit.PASS, capsys.readouterr().err
    assert [s.sweep["values"] for s in runs] == [[-1, 0]]
