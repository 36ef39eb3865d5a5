"""The scenario language: what a scenario file may say and what it means.

schema.py parses YAML into a `Scenario` (every error names file:line, the key, and what to do);
assertions.py is the assertion expression language; catalog.py names every figure an assertion may
use; sweeps.py the sweep-level figures and checks. Invariant: nothing here starts a process.
"""
