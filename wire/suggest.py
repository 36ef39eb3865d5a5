""""Did you mean ...?": the one close-match rule every config error in the tree uses (manifest,
scenario, engine fields, fault timeline, profiles, assertions), so suggestions read alike."""

from __future__ import annotations

import difflib
from typing import Iterable


def closest(word: object, options: Iterable[object], cutoff: float = 0.6) -> str | None:
    """The option nearest to `word` by difflib's ratio, or None when none is at least `cutoff` alike."""
    names = [str(o) for o in options]
    hit = difflib.get_close_matches(str(word), names, n=1, cutoff=cutoff)
    return hit[0] if hit else None


def did_you_mean(word: object, options: Iterable[object], cutoff: float = 0.6, quote: bool = True) -> str:
    """`` (did you mean 'x'?)`` for the closest option, or "" when none is close."""
    hit = closest(word, options, cutoff)
    if hit is None:
        return ""
    return f" (did you mean {hit!r}?)" if quote else f" (did you mean {hit}?)"
