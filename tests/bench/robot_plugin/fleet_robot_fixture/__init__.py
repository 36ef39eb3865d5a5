"""A user's package outside bench/: a Gymnasium env and a RobotType subclass, found without editing bench/.

Its env registers as `fleet_robot_fixture/PointReach-v0` when the package is imported (what a scenario's
`gym.env` names); its robot type is the entry point `two_link` of group `fleet_inference.robots` (declared by
the `fleet_robot_fixture-0.1.dist-info` beside it, as `pip install` would write it) and `module:Class`
`fleet_robot_fixture.robots:TwoLink`. tests/bench/test_robot_plugins.py puts this folder on PYTHONPATH.
"""

import gymnasium as gym

if "fleet_robot_fixture/PointReach-v0" not in gym.registry:
    gym.register(
        id="fleet_robot_fixture/PointReach-v0",
        entry_point="fleet_robot_fixture.envs:PointReachEnv",
        max_episode_steps=60,
    )
