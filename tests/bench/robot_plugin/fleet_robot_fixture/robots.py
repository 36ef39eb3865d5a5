"""TwoLink: a user's own MJCF (two_link.xml beside this file) as a bench robot type, by subclassing the
bench's RobotType: here the reacher's task, reset and observation on a longer-armed model."""

from __future__ import annotations

from pathlib import Path

import mujoco

from bench.robots.reacher import Reacher

MJCF = Path(__file__).parent / "two_link.xml"


class TwoLink(Reacher):
    """Not decorated with @register_robot: the bench registers it under the word the scenario uses (not the
    `reacher` name it inherits, which keys the shipped reacher's compiled model)."""

    episode_s = 3.0

    @classmethod
    def load_spec(cls) -> mujoco.MjSpec:
        return mujoco.MjSpec.from_file(str(MJCF))
