"""server.metrics: families and bounded labels, the exposition (text 0.0.4 and OpenMetrics), the sketches."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from server.metrics import (
    BOUNDED_LABELS,
    KNOWN_METRICS,
    LATENCY_MS_BUCKETS,
    Metrics,
    Sketch,
    WindowedSketch,
    exposed_names,
)
from tests.server.scrape import samples, scraped


def families(m: Metrics) -> dict:
    return {f.name: f for f in text_string_to_metric_families(m.text())}


# ---- families and labels -------------------------------------------------------------------------------


def test_every_known_family_is_exposed_with_its_type_and_help_before_its_first_sample():
    fams = families(Metrics())
    for name, spec in KNOWN_METRICS.items():
        fam = fams["policy_server_" + name]  # the parser strips a counter's _total from the family name
        assert fam.type == spec.kind and fam.documentation == spec.help


def test_labels_are_bounded_and_a_per_robot_label_is_refused_with_the_reason():
    for name, spec in KNOWN_METRICS.items():
        assert set(spec.labels) <= BOUNDED_LABELS, name
    m = Metrics()
    with pytest.raises(
        ValueError,
        match=r"takes labels \['model'\], got \['client', 'model'\]; client would make a "
        r"series per value \(per-robot detail belongs in the audit log",
    ):
        m.inc("requests", model="pi0", client="robot-1")
    with pytest.raises(ValueError, match=r"takes labels \['model'\], got \[\]"):
        m.observe("inference_ms", 3.0)


def test_the_wrong_method_or_an_unknown_name_is_a_loud_programming_error():
    m = Metrics()
    with pytest.raises(TypeError, match=r"'queue_depth' is a gauge: use Metrics.set\(\)"):
        m.observe("queue_depth", 3, model="m")
    with pytest.raises(TypeError, match=r"is a counter: use Metrics.inc\(\)"):
        m.set("requests", 3, model="m")
    with pytest.raises(ValueError, match="not in server.metrics.KNOWN_METRICS"):
        m.inc("warmup_runs")
    with pytest.raises(ValueError, match="NaN"):
        m.observe("inference_ms", float("nan"), model="m")
    with pytest.raises(ValueError):
        m.inc("requests", -1, model="m")  # counters never go down


def test_counters_gauges_and_histograms_read_back_through_the_scrape():
    m = Metrics()
    values = [0.5, 1.0, 3.0, 10.0, 99.0, 20000.0]
    for v in values:
        m.observe("inference_ms", v, model="pi0")
    m.inc("requests", model="pi0")
    m.inc("requests", 2, model="pi0")
    m.inc("requests", model="act")
    m.set("load", 0.25, model="pi0")
    m.inc("security_denials", reason="bad_auth")
    assert scraped(m, "policy_server_requests_total") == 4.0
    assert scraped(m, "policy_server_requests_total", model="act") == 1.0
    assert scraped(m, "policy_server_load", model="pi0") == 0.25
    assert scraped(m, "policy_server_security_denials_total", reason="bad_auth") == 1.0
    got = samples(m.text())
    buckets = [(lbl["le"], v) for n, lbl, v in got if n == "policy_server_inference_ms_bucket"]
    assert [float(le) for le, _ in buckets] == [*LATENCY_MS_BUCKETS, math.inf]
    for le, cumulative in buckets:
        assert cumulative == sum(v <= float(le) for v in values), le  # `le` means less than or equal
    assert scraped(m, "policy_server_inference_ms_sum") == sum(values)
    assert scraped(m, "policy_server_inference_ms_count") == len(values)


def test_label_values_are_escaped_and_round_trip():
    m = Metrics()
    nasty = 'say "hi"\\ now\nplease}'
    m.inc("dispatch_errors", model="m", error=nasty)
    assert [lbl["error"] for n, lbl, _ in samples(m.text()) if n == "policy_server_dispatch_errors_total"] == [nasty]


def test_the_process_families_and_openmetrics_are_served():
    m = Metrics()
    m.set("load", math.inf, model="m")
    text = m.text()
    for name in ("process_resident_memory_bytes", "process_open_fds", "process_cpu_seconds_total", "python_info"):
        assert name in text, name
    assert "policy_server_load{model=\"m\"} +Inf\n" in text
    body, ctype = m.render("application/openmetrics-text; version=1.0.0")
    assert ctype.startswith("application/openmetrics-text")
    om = {f.name: f for f in parse_openmetrics(body.decode())}
    assert om["policy_server_requests"].type == "counter" and body.endswith(b"# EOF\n")
    assert m.render("text/plain")[1].startswith("text/plain; version=0.0.4")


def test_a_filtered_render_holds_only_the_named_families():
    m = Metrics()
    m.set("load", 0.5, model="m")
    m.observe("inference_ms", 3.0, model="m")
    m.inc("chunks_sent", model="m")
    text = m.text({"policy_server_load", "chunks_sent_total", "queue_wait_ms"})
    assert 'policy_server_load{model="m"} 0.5' in text and "policy_server_chunks_sent_total" in text
    assert "policy_server_queue_wait_ms_bucket" not in text  # declared, no sample yet
    assert "inference_ms" not in text and "process_" not in text
    assert "inference_ms" in m.text()


def test_exposed_names_are_what_a_scrape_shows():
    m = Metrics()
    for name, spec in KNOWN_METRICS.items():
        m.__getattribute__({"counter": "inc", "gauge": "set", "histogram": "observe"}[spec.kind])(
            name, 1.0, **{k: "x" for k in spec.labels}
        )
    shown = {n for n, _, _ in samples(m.text())}
    for name in KNOWN_METRICS:
        assert set(exposed_names(name)) <= shown, name


def test_concurrent_writers_and_scrapes_keep_counts_exact():
    m = Metrics()
    n_threads, per = 4, 2000
    stop = threading.Event()

    def scrape():
        while not stop.is_set():
            m.text()

    scraper = threading.Thread(target=scrape)
    scraper.start()

    def work(i):
        for _ in range(per):
            m.inc("requests", model=f"m{i % 2}")
            m.observe("e2e_latency_ms", 5.0, model="m")

    workers = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    stop.set()
    scraper.join()
    assert scraped(m, "policy_server_requests_total") == n_threads * per
    assert scraped(m, "policy_server_e2e_latency_ms_count") == n_threads * per


def test_the_scrape_does_not_grow_with_the_robots_served():
    """1,000 robots through the service's calls: the scrape is the size of one robot's (no per-robot series)."""

    def drive(robots):
        m = Metrics(process=False)
        for i in range(robots):
            m.inc("requests", model="pi0")
            m.observe("payload_size_bytes", 40_000 + i, model="pi0")
            m.observe("queue_wait_ms", i % 50, model="pi0")
            m.observe("inference_ms", 20.0, model="pi0")
            m.inc("chunks_sent", model="pi0")
        return len(samples(m.text())), len(m.text())

    (series_1, bytes_1), (series_1000, bytes_1000) = drive(1), drive(1000)
    assert series_1000 == series_1 and bytes_1000 < bytes_1 + 1024  # only the digits of the values differ


# ---- sketches ------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=60_000.0, allow_nan=False), min_size=1, max_size=400))
def test_sketch_percentiles_are_within_their_relative_error_of_an_observed_value(values):
    s = Sketch()
    for v in values:
        s.add(v)
    a = np.sort(np.asarray(values))
    assert s.count == len(values) and s.max == a[-1]
    for q in (0.5, 0.95, 0.99):
        got = s.quantile(q)
        exact = a[int(q * (len(a) - 1))]  # the nearest-rank value the sketch's rank points at
        tol = Sketch.RELATIVE_ERROR * exact + Sketch.LO * Sketch.GAMMA
        assert abs(got - exact) <= tol + 1e-9, (q, got, exact)


def test_a_sketch_is_fixed_size_whatever_it_has_seen():
    s = Sketch()
    before = s.bins.buffer_info()[1]
    for v in np.random.default_rng(0).exponential(30.0, 100_000):
        s.add(float(v))
    s.add(1e9)  # beyond the last bin: clamped there, max still exact
    assert s.bins.buffer_info()[1] == before == Sketch.BINS and Sketch.BINS * 4 < 1024
    assert s.quantile(1.0) == 1e9 and Sketch().summary()["p99"] is None


def test_windowed_sketch_forgets_values_older_than_two_windows():
    t = [0.0]
    w = WindowedSketch(window_s=10.0, clock=lambda: t[0])
    w.add(100.0)
    t[0] = 12.0
    w.tick()  # the replica's housekeeping ticks every 0.2 s
    w.add(1.0)
    assert w.recent().count == 2  # the previous window is still in
    t[0] = 25.0
    assert w.recent().count == 1 and w.recent().max == 1.0
    t[0] = 60.0
    assert w.recent().count == 0


def test_every_metric_name_the_docs_mention_is_exposed():
    """A renamed or dropped family fails here until README and docs/ follow (one name per quantity)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    documented: dict[str, str] = {}
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        # process_* is also chaos' word for a process fault: only docs/server.md's count as metric names
        prefixes = "policy_server|process" if doc.name == "server.md" else "policy_server"
        for name in re.findall(rf"\b((?:{prefixes})_[a-z0-9_]*[a-z0-9])\b", doc.read_text()):
            documented.setdefault(name, doc.name)
    assert "policy_server_queue_wait_ms" in documented, "docs/server.md lists the families"
    m = Metrics()
    for name, spec in KNOWN_METRICS.items():
        getattr(m, {"counter": "inc", "gauge": "set", "histogram": "observe"}[spec.kind])(
            name, 1.0, **{k: "x" for k in spec.labels}
        )
    fams = list(text_string_to_metric_families(m.text()))
    shown = {f.name for f in fams} | {s.name for f in fams for s in f.samples}
    missing = {n: doc for n, doc in documented.items() if n not in shown}
    assert not missing, f"documented but not exposed: {missing}"
