"""The scenario language: what a scenario file may say and what it means.

model.py holds each key (pydantic: type, bounds, default, meaning; the JSON Schema and the docs tables
come from it); load.py loads a file against it and runs the checks that span keys, into a `Scenario`
(spec.py: the typed result; every error names file:line, the key, and what to do): groups.py checks
the fleet, sites and servers, engines.py the engine configs, checkpoints.py what is on disk,
events.py the faults, attackers and assertions, variants.py the sweep; docs.py generates the key
tables of docs/scenarios.md; assertions.py is the assertion expression language; catalog.py names
every figure an assertion may use; sweeps.py the sweep-level figures and checks. Invariant: nothing
here starts a process.
"""
