"""What a run proves: figures from records, assertions' verdicts, report.html with its charts,
seam smoothness, capacity tables of sweeps, and incident replay.

Invariant: evidence is computed from what processes recorded, never from what a scenario asked.
"""
