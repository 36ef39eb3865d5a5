"""A fleet shard: one process stepping N robots in real time, each with its own edge engine.

shard.py runs the loop (slots, SCHED_FIFO, engines before records before physics); ticks.py owns the
tick schedule and classifies each tick; records.py writes the per-tick and per-request Parquet;
control.py is the JSON-lines channel to the runner; parity.py the lockstep parity engines.
Invariant: a shard never blocks its control loop on I/O; records are flushed off the loop.
"""
