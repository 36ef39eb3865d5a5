"""bench.robots: the gym contract, shared models, fleet equivalence and what "no command" means."""

from __future__ import annotations

import sys
import types
import warnings

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from bench.robots import ROBOT_TYPES, RobotBatch, make_robot, register_robot, robot_type
from bench.robots.models import cached_models

TYPES = sorted(ROBOT_TYPES)


def test_the_three_robot_types_are_registered_by_name():
    assert {"arm", "reacher", "base"} <= set(ROBOT_TYPES)
    for name in TYPES:
        cls = robot_type(name)
        assert cls.name == name
        assert len(cls.action_low) == len(cls.action_high) == len(cls.action_names)
        assert cls.safe_fallback in ("hold", "zero")


def test_unknown_robot_type_names_the_known_ones():
    with pytest.raises(ValueError, match="arm"):
        make_robot("hexapod", seed=0)


def test_registering_a_name_twice_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        register_robot("arm")(type("Arm2", (robot_type("arm"),), {}))


@pytest.mark.parametrize("name", TYPES)
def test_each_robot_passes_gymnasium_check_env(name):
    env = make_robot(name, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unbounded obs / unnormalised physical action units
        check_env(env, skip_render_check=True)


@pytest.mark.parametrize("name", TYPES)
def test_each_robot_exposes_its_metadata(name):
    env = make_robot(name, seed=0)
    state, info = env.reset()
    assert env.fps == 30
    assert env.physics_dt * env.n_substeps == pytest.approx(1 / 30)
    assert len(env.action_names) == env.action_space.shape[0]
    assert len(env.state_names) == state.shape[0] == env.observation_space.shape[0]
    assert state.dtype == np.float32
    assert env.hold_action().shape == env.zero_action().shape == env.action_space.shape
    assert "tracking_error" in info


def test_envs_and_batches_of_one_type_share_one_model_object():
    a, b = make_robot("arm", seed=0), make_robot("arm", seed=1)
    batch = RobotBatch("arm", 4, seed=0)
    assert a.model is b.model is batch.model
    assert a.data is not b.data
    assert len({id(d) for d in batch.datas}) == 4
    assert make_robot("reacher", seed=0).model is not a.model
    arm_models = [k for k in cached_models() if k[0] == "arm" and abs(k[1] - a.physics_dt) < 1e-12]
    assert len(arm_models) == 1


def test_a_robot_costs_well_under_a_megabyte_with_the_model_shared():
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    make_robot("arm", seed=0)  # the model exists before we count
    before = rss()
    envs = [make_robot("arm", seed=i) for i in range(40)]
    per_robot = (rss() - before) / len(envs)
    assert per_robot < 1.5 * 2**20, f"{per_robot / 1024:.0f} KB per robot"


@pytest.mark.parametrize("name", TYPES)
def test_robot_i_of_a_batch_behaves_exactly_like_a_lone_env_with_seed_plus_i(name):
    n, seed, ticks = 3, 11, 40
    batch = RobotBatch(name, n, seed=seed)
    envs = [make_robot(name, seed=seed + i) for i in range(n)]
    lone = np.stack([env.reset()[0] for env in envs])
    np.testing.assert_array_equal(batch.states, lone)
    rng = np.random.default_rng(0)
    space = envs[0].action_space
    for t in range(ticks):
        actions = [
            None if rng.random() < 0.3 else rng.uniform(space.low, space.high).astype(np.float32) for _ in range(n)
        ]
        batch.step(actions)
        lone = np.stack([env.step(a)[0] for env, a in zip(envs, actions)])
        np.testing.assert_array_equal(batch.states, lone, err_msg=f"tick {t}")


def _gymnasium_reacher_v5(monkeypatch):
    try:
        import imageio  # noqa: F401
    except ImportError:
        # gymnasium's MuJoCo package imports imageio for its video recorder only; without the
        # gymnasium[mujoco] extra a stub lets us compare against the real Reacher-v5 code.
        monkeypatch.setitem(sys.modules, "imageio", types.ModuleType("imageio"))
    from gymnasium.envs.mujoco.reacher_v5 import ReacherEnv

    return ReacherEnv()


def test_reacher_reproduces_gymnasium_reacher_v5_at_its_own_rate(monkeypatch):
    ours = make_robot("reacher", seed=5, fps=50)  # Reacher-v5: dt 0.01 x frame_skip 2
    theirs = _gymnasium_reacher_v5(monkeypatch)
    a, _ = ours.reset(seed=5)
    b, _ = theirs.reset(seed=5)
    np.testing.assert_allclose(a, b, atol=1e-6)
    rng = np.random.default_rng(1)
    for _ in range(50):
        action = rng.uniform(-1, 1, 2).astype(np.float32)
        a = ours.step(action)[0]
        b = theirs.step(action)[0]
        np.testing.assert_allclose(a, b, atol=2e-6)
    theirs.close()


def test_base_keeps_its_last_velocity_on_hold_and_stops_on_zero():
    env = make_robot("base", seed=0)
    env.reset()
    for _ in range(20):
        state = env.step(np.array([0.4, 0.0], dtype=np.float32))[0]
    vx = env.state_names.index("vx")
    assert state[vx] == pytest.approx(0.4, abs=0.02)
    np.testing.assert_allclose(env.hold_action(), [0.4, 0.0])
    for _ in range(10):
        state = env.step(None)[0]
    assert state[vx] == pytest.approx(0.4, abs=0.02)  # nobody told it to stop
    for _ in range(30):
        state = env.step(env.zero_action())[0]
    assert abs(state[vx]) < 0.01


def test_a_stalled_base_drives_into_a_wall_and_fails_its_episode():
    env = make_robot("base", seed=0)
    env.reset()
    env.step(np.array([0.6, 0.0], dtype=np.float32))
    for _ in range(20 * 30):
        _, _, terminated, truncated, info = env.step_hold()
        if terminated or truncated:
            break
    assert terminated and info["collided"] and not info["is_success"]


def test_arm_holds_its_last_position_target_when_no_command_arrives():
    env = make_robot("arm", seed=0)
    state, _ = env.reset()
    np.testing.assert_allclose(env.hold_action(), state[:6], atol=1e-6)  # before any command: stay
    target = np.array([0.3, -0.2, 0.4, 0.1, -0.3, 0.2], dtype=np.float32)
    env.step(target)
    for _ in range(45):
        state = env.step(None)[0]
        np.testing.assert_allclose(env.data.ctrl, target, atol=1e-6)
    np.testing.assert_allclose(state[:6], target, atol=0.02)


def test_reacher_applies_zero_torque_when_no_command_arrives():
    env = make_robot("reacher", seed=0)
    env.reset()
    env.step(np.array([0.8, -0.8], dtype=np.float32))
    assert np.any(env.data.ctrl != 0)
    env.step(None)
    np.testing.assert_array_equal(env.data.ctrl, 0.0)
    np.testing.assert_array_equal(env.hold_action(), env.zero_action())


def test_a_non_finite_command_is_treated_as_no_command_and_counted():
    batch = RobotBatch("base", 2, seed=0)
    batch.step(np.array([[0.3, 0.0], [0.3, 0.0]]))
    batch.step(np.array([[np.nan, 0.0], [0.1, 0.0]]))
    np.testing.assert_allclose(batch.last_command, [[0.3, 0.0], [0.1, 0.0]])
    assert batch.bad_commands.tolist() == [1, 0]


def test_commands_outside_the_action_space_are_clipped():
    env = make_robot("base", seed=0)
    env.reset()
    info = env.step(np.array([5.0, -9.0], dtype=np.float32))[4]
    np.testing.assert_allclose(info["command"], [0.6, -1.5])


@pytest.mark.parametrize("name", TYPES)
def test_the_final_step_reports_task_success(name):
    env = make_robot(name, seed=0, episode_s=0.5)
    env.reset()
    infos = []
    while True:
        _, _, terminated, truncated, info = env.step(env.hold_action())
        infos.append(info)
        if terminated or truncated:
            break
    assert len(infos) == 15
    assert "is_success" in infos[-1] and 0.0 <= infos[-1]["success_score"] <= 1.0
    assert all("is_success" not in i for i in infos[:-1])
    assert all(i["tracking_error"] >= 0 for i in infos)


def test_batch_reset_restarts_only_the_named_robots():
    batch = RobotBatch("arm", 3, seed=0)
    for _ in range(5):
        batch.step(None)
    batch.reset([1])
    assert batch.tick.tolist() == [5, 0, 5]
    fresh = RobotBatch("arm", 3, seed=0)
    assert not np.array_equal(batch.states[1], fresh.states[1])  # robot 1's rng moved on: a new episode
    batch.reset([1], seed=0)
    np.testing.assert_array_equal(batch.states[1], fresh.states[1])


def test_reacher_at_30_hz_takes_one_rk4_step_that_tracks_like_the_mjcf_step(monkeypatch):
    """The fleet's reacher steps 33.3 ms (1 RK4 step per 30 Hz tick) instead of the MJCF's ~10 ms (3):
    under the expert's plans the states agree to 2e-4 and the tracking error to 1e-4 m over two seconds
    (the task tolerance is 0.02 m)."""
    from bench.training.experts import plan_chunks

    def run():
        batch = RobotBatch("reacher", 4, seed=3, fps=30)
        states, errors = [batch.reset()], []
        for _ in range(4):
            plan = plan_chunks("reacher", states[-1], 15)
            for k in range(15):
                states.append(batch.step(plan[:, k]))
                errors.append(batch.tracking_error.copy())
        return batch.n_substeps, np.array(states), np.array(errors)

    coarse_n, coarse, coarse_err = run()
    monkeypatch.setattr(robot_type("reacher"), "max_physics_dt", None)
    fine_n, fine, fine_err = run()
    assert (coarse_n, fine_n) == (1, 3)
    np.testing.assert_allclose(coarse, fine, atol=2e-4)
    np.testing.assert_allclose(coarse_err, fine_err, atol=1e-4)


def test_a_model_whose_geoms_cannot_collide_skips_collision_with_identical_states():
    """Reacher-v5's MJCF gives every geom contype 0: no contact can ever arise, so the shared model
    disables the collision pass (a third of its step). The states must not change by one bit. The arm's
    MJCF has no colliding geoms either; the base's chassis meets the walls and keeps the pass."""
    import mujoco

    from bench.robots.models import can_collide

    batch = RobotBatch("reacher", 3, seed=11, fps=30)
    assert not can_collide(batch.model)
    assert batch.model.opt.disableflags & mujoco.mjtDisableBit.mjDSBL_CONTACT
    rng = np.random.default_rng(2)
    actions = rng.uniform(-1, 1, (60, 3, 2))
    skipped = [batch.step(a).copy() for a in actions]
    batch.model.opt.disableflags &= ~int(mujoco.mjtDisableBit.mjDSBL_CONTACT)
    try:
        batch.reset(seed=11)
        full = [batch.step(a).copy() for a in actions]
    finally:
        batch.model.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONTACT
    np.testing.assert_array_equal(np.array(skipped), np.array(full))
    arm, base = RobotBatch("arm", 1, seed=0).model, RobotBatch("base", 1, seed=0).model
    assert not can_collide(arm) and arm.opt.disableflags & mujoco.mjtDisableBit.mjDSBL_CONTACT
    assert can_collide(base) and not base.opt.disableflags & mujoco.mjtDisableBit.mjDSBL_CONTACT


def test_extend_episode_lengthens_only_the_current_episode():
    from bench.robots import RobotBatch

    b = RobotBatch("reacher", 3, seed=0, fps=30, episode_s=0.2)  # 6 ticks
    b.extend_episode(np.array([0, 2, 5]))
    ends = {}
    for k in range(1, 20):
        b.step(None)
        for i in np.nonzero(b.done)[0]:
            ends.setdefault(int(i), []).append(k)
        if b.done.any():
            b.reset(np.nonzero(b.done)[0])
    assert [ends[i][0] for i in range(3)] == [6, 8, 11]  # first episodes: 6 + extra ticks
    assert [ends[i][1] - ends[i][0] for i in range(3)] == [6, 6, 6]  # later ones: episode_s again
