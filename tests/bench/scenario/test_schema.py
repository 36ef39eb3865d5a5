"""The scenario schema: valid files load, and every error names the file, the line and the key."""

from __future__ import annotations

import textwrap

import pytest

from bench.scenario.load import SCENARIOS_DIR, ScenarioError, load_scenario, parse_scenario, sweep_variants

BASE = """\
name: t
description: a test
duration_s: 10
fleet:
  shards: 1
  groups:
    - name: g
      robot: reacher
      count: 2
      site: lab
sites:
  lab: {profile: lan}
servers:
  replicas:
    - {id: r0, checkpoint: reacher}
assertions:
  - dead_robots == 0
"""


def parse(text: str):
    return parse_scenario(textwrap.dedent(text), source="t.yaml")


def error_of(text: str) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        parse(text)
    return info.value


def test_minimal_scenario_loads_with_defaults():
    s = parse(BASE)
    assert s.name == "t" and s.robots == 2 and s.groups[0].fps == 30 and s.warmup_s == 5.0
    assert s.groups[0].model_id == "reacher" and s.replicas[0].model_id == "reacher"
    assert s.assertions[0].expression == "dead_robots == 0" and s.assertions[0].line == 17


def test_unknown_top_level_key_names_key_line_and_suggestion():
    err = error_of(BASE + "duraton_s: 5\n")
    assert err.line == 18 and err.path == "duraton_s"
    assert "unknown key" in str(err) and "did you mean 'duration_s'" in str(err)
    assert str(err).startswith("t.yaml:18: duraton_s:")


def test_unknown_group_key_names_nested_path_and_line():
    err = error_of(BASE.replace("      count: 2\n", "      count: 2\n      cuont: 3\n"))
    assert err.path == "fleet.groups[0].cuont" and err.line == 10


def test_wrong_type_names_key_and_line():
    err = error_of(BASE.replace("count: 2", "count: two"))
    assert err.path == "fleet.groups[0].count" and err.line == 9 and "positive integer" in str(err)


def test_missing_required_key_is_named():
    err = error_of(BASE.replace("duration_s: 10\n", ""))
    assert err.path == "duration_s" and "required" in str(err)


def test_unknown_site_reference_lists_sites():
    err = error_of(BASE.replace("site: lab", "site: moon"))
    assert err.path == "fleet.groups[0].site" and "lab" in err.message


def test_unknown_robot_type_and_profile_are_rejected():
    assert "unknown robot type" in str(error_of(BASE.replace("robot: reacher", "robot: toaster")))
    err = error_of(BASE.replace("profile: lan", "profile: dialup"))
    assert err.path == "sites.lab.profile" and err.line == 12


def test_bad_assertion_names_figure_and_line():
    err = error_of(BASE.replace("dead_robots == 0", "p99(rtt) < 250"))
    assert err.path == "assertions[0]" and err.line == 17
    assert "unknown figure 'rtt'" in err.message and "rtt_ms" in err.message


def test_unsafe_assertion_is_rejected_at_load():
    err = error_of(BASE.replace("dead_robots == 0", "__import__('os').system('true') == 0"))
    assert "only these functions may be called" in err.message


def test_group_scoped_assertion_needs_a_known_group():
    assert "unknown group 'nope'" in error_of(BASE.replace("dead_robots == 0", "group[nope].ticks > 0")).message
    parse(BASE.replace("dead_robots == 0", "group[g].fallback_ticks >= 0"))


def test_group_model_must_be_served():
    err = error_of(BASE.replace("      site: lab\n", "      site: lab\n      model_id: other\n"))
    assert "no server replica serves model 'other'" in err.message


def test_group_rate_must_match_the_served_checkpoint_unless_resampling_is_allowed():
    # the shipped reacher is trained at 30 Hz; at 15 Hz every session would be refused with FPS_MISMATCH
    slow = BASE.replace("      site: lab\n", "      site: lab\n      fps: 15\n")
    err = error_of(slow)
    assert err.path == "fleet.groups[g].fps" and err.line == 11
    assert "15 Hz" in err.message and "trained at 30 Hz" in err.message and "allow_resampling" in err.message
    allowed = slow.replace("servers:\n", "servers:\n  manifest: {allow_resampling: true}\n")
    assert parse(allowed).groups[0].fps == 15
    per_replica = slow.replace(
        "{id: r0, checkpoint: reacher}", "{id: r0, checkpoint: reacher, manifest: {allow_resampling: true}}"
    )
    assert parse(per_replica).groups[0].fps == 15
    # a manifest's trained_fps overrides the checkpoint's, for the server and for this check alike
    retimed = slow.replace("servers:\n", "servers:\n  manifest: {trained_fps: 15}\n")
    assert parse(retimed).groups[0].fps == 15
    assert "trained at 15 Hz" in error_of(retimed.replace("      fps: 15\n", "      fps: 30\n")).message


def test_fault_target_must_exist():
    err = error_of(BASE + "faults:\n  - {at: 2, target: site:mars, action: partition, duration: 1}\n")
    assert err.path == "faults[0].target" and err.line == 19 and "site:lab" in err.message
    # the driver's router alone is a target of its own; a near miss is named
    assert (
        parse(BASE + "faults:\n  - {at: 2, target: 'router:hub', action: kill, duration: 1}\n").faults[0]["target"]
        == "router:hub"
    )
    err = error_of(BASE + "faults:\n  - {at: 2, target: 'router:hubs', action: kill, duration: 1}\n")
    assert err.path.startswith("faults") and err.line == 19 and "router:hub" in err.message


def test_duplicate_keys_and_bad_yaml_report_a_line():
    assert error_of(BASE + "name: again\n").line == 18
    assert error_of("name: [unclosed\n").line >= 1


def test_engine_keys_owned_by_the_bench_are_rejected():
    err = error_of(BASE.replace("      site: lab\n", "      site: lab\n      engine: {fps: 10}\n"))
    assert err.path == "fleet.groups[0].engine.fps"


def test_sweep_makes_one_variant_per_value():
    s = parse(BASE + "sweep: {key: fleet.groups.g.count, values: [1, 3]}\n")
    variants = sweep_variants(s)
    assert [v.robots for _, v in variants] == [1, 3]
    assert variants[0][0] == "fleet.groups.g.count-1"


def test_sweep_key_must_exist():
    assert error_of(BASE + "sweep: {key: fleet.nothing, values: [1]}\n").path == "sweep.key"


@pytest.mark.parametrize(
    "path", sorted(SCENARIOS_DIR.glob("**/*.yaml")), ids=lambda p: str(p.relative_to(SCENARIOS_DIR))
)
def test_shipped_scenarios_validate(path):
    s = load_scenario(path)
    assert s.description and s.assertions


def test_shards_default_auto_and_sized_from_ticks_and_cores():
    from bench.run.sizing import shard_count

    s = parse(BASE.replace("  shards: 1\n", ""))
    assert s.shards == "auto" and shard_count(s, cores=2) == 1
    s.groups[0].count = 300
    # the engine's derived buffer (half the 30-row chunk) asks every 14 ticks, more often than the headline's
    # robots (buffer_time_s 0.3: every 20) the budget was measured on: its requests need a fourth shard
    assert shard_count(s, cores=2) == 4
    s.groups[0].engine = {"buffer_time_s": 0.3}
    assert shard_count(s, cores=2) == 3  # 9000 robot-ticks/s at 3000 a shard
    assert shard_count(s, cores=16) == 12  # spare cores: 25 robots a shard, within 16 - 2 - 1 replica
    s.shards = 5
    assert shard_count(s, cores=16) == 5  # an explicit count always wins


def test_shards_rejects_words_other_than_auto():
    err = error_of(BASE.replace("shards: 1", "shards: many"))
    assert err.path == "fleet.shards" and "positive integer or auto" in str(err)


def test_fidelity_defaults_and_overrides():
    s = parse(BASE)
    assert s.fidelity["host_late_ratio"] == 0.01 and s.fidelity["leg_error_ms"] == 5.0
    s = parse(BASE + "fidelity: {host_late_ratio: 0.05}\n")
    assert s.fidelity["host_late_ratio"] == 0.05 and s.fidelity["forward_ratio"] == 2.0
    err = error_of(BASE + "fidelity: {host_late: 0.05}\n")
    assert err.path == "fidelity.host_late" and "did you mean 'host_late_ratio'" in str(err)
