""" "Did you mean ...?": the one close-match rule every config error in the tree uses (manifest,
scenario, engine fields, fault timeline, profiles, assertions), so suggestions read alike."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: object, options: Iterable[object], cutoff: float = 0.6) -> str | None:
    """The option nearest to `word` by difflib's ratio, or None when none is at least `cutoff` alike;
    failing that, the one snake_case option that has `word` as a whole part."""
    names = [str(o) for o in options]
    hit = difflib.get_close_matches(str(word), names, n=1, cutoff=cutoff)
    if hit:
        return hit[0]
    # a short word that is one part of exactly one snake_case name: `rtc` -> `rtc_enabled`
    parts = [n for n in names if str(word) and str(word) in n.split("_")]
    return parts[0] if len(parts) == 1 else None


def did_you_mean(word: object, options: Iterable[object], cutoff: float = 0.6, quote: bool = True) -> str:
    """`` (did you mean 'x'?)`` for the closest option, or "" when none is close."""
    hit = closest(word, options, cutoff)
    if hit is None:
        return ""
    return f" (did you mean {hit!r}?)" if quote else f" (did you mean {hit}?)"
