"""Scrapes of the servers' /metrics during a run, parsed by prometheus-client's own parser.

Invariant: a malformed line is skipped, never raised (a scrape cut by a restarting replica still
yields its good lines); NaN samples are skipped; only (sample name, labels, value) come out.
"""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families


def parse_prometheus(text: str) -> list[tuple[str, dict, float]]:
    try:
        return _samples(text)
    except ValueError:  # one bad line fails the library's whole parse: parse line by line, skipping it
        out = []
        for line in text.splitlines():
            try:
                out += _samples(line + "\n")
            except ValueError:
                continue
        return out


def _samples(text: str) -> list[tuple[str, dict, float]]:
    return [
        (s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not math.isnan(s.value)
    ]
