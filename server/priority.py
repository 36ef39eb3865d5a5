"""The OS priority a replica's dispatch loops ask for, and the words their log line about it starts with.

Owns the two constants; the bench reads the log words back (bench.run.verdict). The module imports nothing, so
judging a run reads them without importing torch.
"""

DISPATCH_FIFO_PRIORITY = 4  # below the bench's chaos proxy (5) and its control loops (10): see docs/bench.md
DISPATCH_PRIORITY_LOG_TEXT = "dispatch priority: "
