"""Microbenchmarks of the project's hot paths, one module per subject (`python -m benchmarks.NAME`).

Each writes its figures under reports/bench/. Speed targets live here, never in timed unit tests.
The runtime packages (wire, server, edge, chaos, bench) ship no benchmark code.
"""
