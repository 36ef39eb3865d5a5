"""The scenario language: what a scenario file may say and what it means.

model.py holds each key (pydantic: type, bounds, default, meaning; the JSON Schema and the docs tables
come from it); load.py loads a file against it and checks what spans keys, into a `Scenario` (every
error names file:line, the key, and what to do); docs.py generates the key tables of docs/scenarios.md;
assertions.py is the assertion expression language; catalog.py names every figure an assertion may
use; sweeps.py the sweep-level figures and checks. Invariant: nothing here starts a process.
"""
