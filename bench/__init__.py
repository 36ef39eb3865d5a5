"""The digital twin: fleets of simulated robots run the real edge engine against real servers.

Its rooms, bottom to top (a room imports only rooms below it):

    scenario/   the scenario language: schema (YAML keys, file:line errors), assertions, catalog of
                figures, sweeps
    robots/     simulated robots (MuJoCo + Gymnasium), their cameras; one file per robot type
    security/   test PKI and the attacker process of the security scenarios
    fleet/      a shard process: robots, their engines, the tick schedule, records, control channel
    evidence/   what a run proves: figures, report.html, charts, seam metrics, capacity, incidents
    training/   expert controllers, demonstrations, behaviour-cloned checkpoints (`bench train`)
    run/        one run end to end: processes, faults, CPU sampling, progress (`bench run`)
    cli.py      the `bench` command
"""
