"""Microbenchmarks of the project's hot paths, one module per subject (`python -m benchmarks.NAME`).

Every module exposes `run(quick) -> benchmarks.common.Result` (figures, units, targets); the suite
(`python -m benchmarks [NAME ...] [--quick]`) writes reports/bench/NAME.json and summary.md. Speed targets live here, never in timed unit tests.
The runtime packages (wire, server, edge, chaos, bench) ship no benchmark code.
"""
