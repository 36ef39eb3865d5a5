"""The one table of exit codes: each verdict's code, the order of `worse`, and the help text that names them."""

from __future__ import annotations

from bench.evidence import exitcode
from bench.evidence.exitcode import Exit, worse


def test_each_verdict_has_its_documented_code():
    assert [Exit.of(v) for v in ("pass", "fail", "error", "inconclusive")] == [0, 1, 2, 3]


def test_worse_ranks_invalid_over_fail_over_inconclusive_over_pass():
    order = [Exit.PASS, Exit.INCONCLUSIVE, Exit.FAIL, Exit.INVALID]
    for i, lower in enumerate(order):
        for higher in order[i:]:
            assert worse(lower, higher) == higher and worse(higher, lower) == higher
    assert worse(Exit.PASS, 7) == 7  # an unknown code counts as the worst


def test_the_run_help_lists_every_code():
    codes = [line.split()[0] for line in exitcode.HELP.splitlines()[1:] if line[2:3].isdigit()]
    assert codes == [str(int(e)) for e in Exit]
