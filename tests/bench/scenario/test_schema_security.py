"""Scenario keys of the security layer: `security` and `attackers`, checked with file:line errors."""

from __future__ import annotations

import pytest

from bench.scenario.load import ScenarioError, parse_scenario

BASE = """\
name: s
duration_s: 20
security: {security}
fleet:
  groups:
    - {{name: honest, robot: reacher, count: 2, site: lab}}
sites:
  lab: {{profile: lan}}
servers:
  replicas:
    - {{id: r0, checkpoint: reacher}}
attackers:
  - {attacker}
"""


def scenario(attacker: str, security: str = "mtls"):
    return parse_scenario(BASE.format(security=security, attacker=attacker), "s.yaml")


def test_all_expands_to_the_attacks_of_the_credentials_and_the_target_defaults_to_the_first_robot():
    s = scenario("{name: rogue}")
    (a,) = s.attackers
    assert (
        s.security == "mtls" and a["target"] == "honest/0" and "flood" in a["attacks"] and "connect" not in a["attacks"]
    )
    (b,) = scenario("{name: x, credentials: foreign_ca}").attackers
    assert b["attacks"] == ["connect"]


@pytest.mark.parametrize(
    "attacker,words",
    [
        ("{name: r, target: honest/5}", "attackers[0].target: 'honest/5' is not GROUP/INDEX"),
        ("{name: r, attacks: [teleport]}", "attackers[0].attacks: ['teleport']"),
        ("{name: r, credentials: stolen}", "attackers[0].credentials"),
        ("{name: r, at: 30}", "attackers[0].at: 30 s is after the end of the run"),
        ("{name: r, bogus: 1}", "attackers[0]"),
    ],
)
def test_bad_attackers_are_refused_with_file_and_line(attacker, words):
    with pytest.raises(ScenarioError) as e:
        scenario(attacker)
    assert str(e.value).startswith("s.yaml:13") and words in str(e.value), str(e.value)


def test_security_is_tcp_or_mtls():
    with pytest.raises(ScenarioError, match=r"s.yaml:3: security: 'ssl' is not one of tcp, mtls"):
        scenario("{name: r}", security="ssl")
