"""`engine: {kind: local}` groups (the in-run baseline): the schema reads them, refuses what cannot run,
and the summary pairs each local group with the remote group it is the baseline of."""

from __future__ import annotations

import textwrap

import pytest

from bench.evidence.figures import baselines
from bench.scenario.load import ScenarioError, parse_scenario

TWO_GROUPS = """\
name: t
duration_s: 10
fleet:
  groups:
    - name: lan
      robot: reacher
      count: 2
      site: lab
    - name: local
      robot: reacher
      count: 2
      site: lab
      seeds_of: lan
      engine: {kind: local, trim: consumed, buffer_time_s: 0.4}
sites:
  lab: {profile: lan}
servers:
  replicas:
    - {id: r0, checkpoint: reacher}
assertions:
  - group[lan].task_success_rate >= group[local].task_success_rate - 0.10
"""


def parse(text: str):
    return parse_scenario(textwrap.dedent(text), source="t.yaml")


def test_local_group_is_read_with_its_kind_and_seed_group():
    s = parse(TWO_GROUPS)
    lan, local = s.groups
    assert (lan.engine_kind, local.engine_kind) == ("remote", "local")
    assert local.seeds_of == "lan" and "kind" not in local.engine  # the RemoteEngineConfig fields only
    assert local.engine["buffer_time_s"] == 0.4


def test_local_group_needs_no_replica_serving_its_model():
    s = parse(TWO_GROUPS.replace("      seeds_of: lan\n", "      policy: reacher_finetune_b\n"))
    assert s.groups[1].model_id == "reacher_finetune_b"  # no replica serves it: the shard loads it


@pytest.mark.parametrize(
    "change, path, words",
    [
        (("      seeds_of: lan\n", "      seeds_of: lann\n"), "fleet.groups[1].seeds_of", "did you mean 'lan'"),
        (("      seeds_of: lan\n", "      seeds_of: local\n"), "fleet.groups[1].seeds_of", "names no other group"),
        (("      seeds_of: lan\n", "      shadow: {engine: rtc}\n"), "fleet.groups[1].shadow", "no remote engine"),
        (("kind: local,", "kind: locale,"), "fleet.groups[1].engine.kind", "remote"),
        (("trim: consumed", "latency_window: 0"), "fleet.groups[1].engine.latency_window", "positive integer"),
    ],
)
def test_local_group_errors_name_the_key(change, path, words):
    with pytest.raises(ScenarioError) as info:
        parse(TWO_GROUPS.replace(*change))
    assert info.value.path == path and words in str(info.value)


def test_baselines_pair_a_local_group_with_its_remote_twin():
    s = parse(TWO_GROUPS)
    figs = {"lan": {"task_success_rate": 0.5, "episodes": 40}, "local": {"task_success_rate": 0.625, "episodes": 40}}
    (b,) = baselines(s.groups, figs, s.sites)
    assert (b["local"], b["remote"], b["profile"], b["paired_seeds"]) == ("local", "lan", "lan", True)
    assert b["gap"] == pytest.approx(0.125)
    # without seeds_of: every remote group of the same robot type and policy; other policies are not twins
    s = parse(
        TWO_GROUPS.replace("      seeds_of: lan\n", "").replace(
            "      site: lab\n    - name: local",
            "      site: lab\n    - name: other\n      robot: reacher\n      count: 1\n"
            "      site: lab\n      policy: reacher_finetune_b\n      model_id: reacher\n    - name: local",
        )
    )
    assert [(b["remote"], b["paired_seeds"]) for b in baselines(s.groups, figs, s.sites)] == [("lan", False)]
    assert baselines(s.groups, {}, s.sites)[0]["gap"] is None  # no figures: no gap, not a crash
