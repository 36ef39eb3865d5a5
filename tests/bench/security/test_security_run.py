"""scenarios/security_acl.yaml, shortened: with mTLS and router rules every attack is denied; with
protection off (plain TCP, no session proofs) the same attacks breach and the verdict fails. This is
the negative check that shows the scenario's assertions can fail."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SHORT = [
    "duration_s=12",
    "warmup_s=3",
    "fleet.groups.honest.count=2",
    "attackers=[{name: rogue, credentials: own_cert, target: honest/0, at: 1, attacks: [subscribe_other_obs, "
    "publish_other_obs, open_other_session, token_other_robot]}, {name: intruder, credentials: none, at: 1}]",
    "assertions=[attacks == 5, attacks_breached == 0, attack_errors == 0, server_crashes == 0, dead_robots == 0]",
]


def _run(tmp_path: Path, extra: list[str]) -> tuple[int, dict, list[dict]]:
    args = [a for s in SHORT + extra for a in ("--set", s)]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.cli",
            "run",
            str(REPO / "scenarios" / "security_acl.yaml"),
            "--reports",
            str(tmp_path),
            "--quiet",
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=170,
    )
    runs = list((tmp_path / "security_acl").iterdir())
    assert len(runs) == 1, proc.stderr
    summary = json.loads((runs[0] / "summary.json").read_text())
    attacks = json.loads((runs[0] / "attacks.json").read_text()) if (runs[0] / "attacks.json").is_file() else []
    return proc.returncode, summary, attacks


def test_with_mtls_and_router_rules_every_attack_is_denied(tmp_path):
    rc, summary, attacks = _run(tmp_path, [])
    assert rc == 0, json.dumps(summary["assertions"], indent=1)
    assert {a["attack"]: a["outcome"] for a in attacks} == {
        "subscribe_other_obs": "denied",
        "publish_other_obs": "denied",
        "open_other_session": "denied",
        "token_other_robot": "denied",
        "connect": "denied",
    }
    assert oct((tmp_path / "security_acl").iterdir().__next__().joinpath("pki", "ca.key").stat().st_mode)[-3:] == "600"


def test_with_protection_off_the_same_attacks_breach_and_the_verdict_fails(tmp_path):
    rc, summary, attacks = _run(tmp_path, ["security=tcp", "servers.manifest.security.require_session_auth=false"])
    assert rc == 1
    outcome = {a["attack"]: a["outcome"] for a in attacks}
    assert outcome["subscribe_other_obs"] == "breached"  # no router rules: anyone reads the victim's observations
    assert outcome["publish_other_obs"] == "breached"  # no session proof: the sniffed session id steers it
    assert outcome["token_other_robot"] == "breached"
    assert outcome["connect"] == "breached"
    failed = {a["expression"] for a in summary["assertions"] if a["result"] != "pass"}
    assert "attacks_breached == 0" in failed
