"""One run, end to end (`bench run`): start router, proxies, replicas and shards; apply the fault
timeline; sample CPU, memory and descriptors; collect records; hand them to bench.evidence for the verdict.

runner.py owns the run's lifecycle (the `Run` sequencer) over state.py's declared run state; its phases are
preflight.py, starters.py (the process starters, fed by specs.py), drive.py (with observe.py and legs.py),
stop.py, collect.py (with hops.py and benchshare.py) and verdict.py; procset.py the child processes; faults.py wires the scenario's faults to
live processes and proxies; usage.py the process accounting (psutil: CPU, RSS, fds, what is left at the end); progress.py the live line;
prom.py parses /metrics scrapes (prometheus-client's parser). Invariant: every process started here is reaped, pass or fail.
"""
