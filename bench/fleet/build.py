"""Building a shard: a slot for each robot of its spec, the tick schedule that deals them into slots, a robot
batch for each slot (seeded, staggered, with cameras), and every robot's engine started, a few at a time."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from bench.fleet.robot import RobotSlot
from bench.fleet.ticks import TickSchedule

# Robots of a shard tick in this many slots per period, each slot one wake-up of the loop. Few and large:
# after its sleep a slot starts on cold caches (the VM's other processes ran in between), and that costs
# every slot ~0.5-1 ms of CPU however few robots it steps (the loop body alone, with 5 ms sleeps between
# slots: 53-73 us per robot-tick at 17 robots a slot, 39-45 at 34, 33 at 100; 20-25 without the sleeps).
# In the headline (100 robots a shard) 2 slots instead of 6 took the loop from 62-68 to 43-48 us per
# robot-tick. Not 1: a slot's last robots wait for the first ones (host_delay), and a longer slot
# holds the shard's GIL longer against its engine threads.
SLOTS_PER_PERIOD = 2


def build(shard) -> None:
    """The shard's robots (`shard.robots`), their tick schedule and robot batches, then every engine started."""
    from bench.robots import core as robots_core

    specs = shard.spec["robots"]
    shard.robots = [
        RobotSlot(spec=s, rid=s["robot"], max_age=float(s["engine"].get("max_action_age_s", math.inf))) for s in specs
    ]
    keys = [(s["robot_type"], s["episode_s"]) for s in specs]
    shard.schedule = TickSchedule(0.0, [1.0 / s["fps"] for s in specs], SLOTS_PER_PERIOD, keys=keys)
    for sid, members in enumerate(shard.schedule.members):
        if not members:
            continue
        s0 = specs[members[0]]
        if s0.get("gym"):  # a gym group's type is its config, registered here as in the runner
            from bench.robots.gymenv import gym_robot_type

            gym_robot_type(s0["gym"], s0["robot_type"], measure=False)
        cls = robots_core.robot_type(s0["robot_type"])
        batch = cls.fleet(len(members), seed=0, fps=s0["fps"], episode_s=s0["episode_s"])
        from gymnasium.utils import seeding

        for j, r in enumerate(members):
            batch.rngs[j] = seeding.np_random(specs[r]["seed"])[0]
        batch.reset()
        # A fleet whose episodes all start on the same tick sends its episodes' first requests as one burst
        # (the headline's servers saw 27x more arrivals in the busiest 100 ms of each 2 s than in the
        # quietest): a staggered group lengthens each robot's first episode by a seeded part of one.
        batch.extend_episode(
            np.array(
                [
                    np.random.default_rng(specs[r]["seed"]).integers(0, batch.episode_ticks)
                    if specs[r].get("stagger_episodes")
                    else 0
                    for r in members
                ]
            )
        )
        shard.batches[sid] = batch
        for j, r in enumerate(members):
            cams = specs[r].get("cameras")
            if cams:
                from bench.robots.cameras import make_camera

                view = batch.robot(j)
                shard.robots[r].cameras = [
                    (
                        name,
                        make_camera(
                            cams["kind"], view, cams["height"], cams["width"], seed=specs[r]["seed"] + k, name=name
                        ),
                    )
                    for k, name in enumerate(cams["names"])
                ]
    # engines: building them opens a Zenoh session each; do it on a few threads
    make_engine = shard.make_engine

    def start_engine(r: RobotSlot):
        if r.spec.get("shadow"):  # golden parity: the remote engine in lockstep with a local one
            from bench.fleet.parity import make_parity_engine

            r.engine = make_parity_engine(r.spec["engine"], r.spec["shadow"], seed=r.spec["seed"])
        elif r.spec.get("engine_kind") == "local":  # the in-run baseline: the checkpoint here, no network
            from bench.fleet.local import make_local_engine

            r.engine = make_local_engine(r.spec["engine"], r.spec["checkpoint"])
        else:
            r.engine = make_engine(r.spec["engine"])
        r.engine.start()

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(start_engine, shard.robots))
