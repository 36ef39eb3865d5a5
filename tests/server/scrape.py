"""Read a replica's metrics the way Prometheus does: its /metrics text, parsed by prometheus-client's parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> list[tuple[str, dict, float]]:
    return [(s.name, dict(s.labels), s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def scraped(metrics, sample: str, **labels) -> float:
    """Sum of the samples named `sample` (e.g. `policy_server_requests_total`) whose labels include `labels`,
    in the text `GET /metrics` serves; 0.0 when none."""
    want = {k: str(v) for k, v in labels.items()}
    return sum(v for n, lbl, v in samples(metrics.text()) if n == sample and want.items() <= lbl.items())
