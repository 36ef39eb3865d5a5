"""The bench's exit codes: `Exit`, the one definition `bench run`, `bench validate`, the runner and summary.json use.

    0 PASS          every assertion held (a run out of its fidelity tolerances says so as a warning)
    1 FAIL          an assertion failed and the run's fidelity was within tolerance: the system failed it
    2 INVALID       the scenario or the environment is invalid, or the run itself errored (verdict `error`)
    3 INCONCLUSIVE  an assertion failed while the bench host was out of its fidelity tolerances

Invariant: a verdict maps to exactly one code (`Exit.of`), and of several runs the worst code wins in the order
INVALID > FAIL > INCONCLUSIVE > PASS (`worse`). Imports nothing heavy, so `bench --help` stays quick.
"""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    PASS = 0
    FAIL = 1
    INVALID = 2
    INCONCLUSIVE = 3

    @classmethod
    def of(cls, verdict: str) -> Exit:
        """The exit code of a run's verdict (`pass`, `fail`, `error`, `inconclusive`)."""
        return _OF_VERDICT[verdict]


_OF_VERDICT = {"pass": Exit.PASS, "fail": Exit.FAIL, "error": Exit.INVALID, "inconclusive": Exit.INCONCLUSIVE}
_RANK = {Exit.PASS: 0, Exit.INCONCLUSIVE: 1, Exit.FAIL: 2, Exit.INVALID: 3}


def worse(a: int, b: int) -> int:
    """The worse of two exit codes: invalid/error (2) > fail (1) > inconclusive (3) > pass (0); an unknown code
    counts as invalid."""
    return a if _RANK.get(a, 3) >= _RANK.get(b, 3) else b


HELP = """exit codes:
  0  pass: every assertion held (a run out of its fidelity tolerances says so as a warning)
  1  fail: an assertion failed and the run's fidelity was within tolerance: the system failed it
  2  the scenario or the environment is invalid, or the run itself errored (a process died, Ctrl-C)
  3  inconclusive: an assertion failed while the bench host was out of its fidelity tolerances
     (summary.json fidelity.reasons names the shard, network leg or replica); rerun on a quieter
     or bigger host, or see `bench run --check FILE`"""
