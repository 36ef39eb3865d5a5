"""server.metrics: percentiles, label filtering, windows, types, callbacks, concurrency, Prometheus text."""

from __future__ import annotations

import json
import math
import re
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.metrics import KNOWN_METRICS, LATENCY_MS_BUCKETS, Metrics, Stats


class FakeClock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def expected_stats(values) -> Stats:
    a = np.asarray(values, dtype=np.float64)
    p50, p95, p99 = np.percentile(a, [50, 95, 99])
    return Stats(a.size, a.mean(), p50, p95, p99, a.max())


def assert_stats_close(got: Stats, want: Stats) -> None:
    assert got.count == want.count
    scale = max(1.0, abs(want.max), abs(want.mean))
    for field in ("mean", "p50", "p95", "p99", "max"):
        assert math.isclose(getattr(got, field), getattr(want, field), rel_tol=1e-9, abs_tol=1e-9 * scale), field


# ---- a tiny parser of the Prometheus text format 0.0.4 ------------------------------------------------

_SAMPLE_RE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r"(?:\{(?P<labels>(?:[a-zA-Z_][a-zA-Z0-9_]*=\"(?:[^\"\\\n]|\\[\\\"n])*\",?)*)\})?"
    r" (?P<value>[-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|Inf|NaN))$"
)
_LABEL_PAIR_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse_prometheus(text: str) -> dict[str, dict]:
    """{family: {"type", "help", "samples": [(sample_name, labels, value)]}}; asserts the format rules on the way."""
    assert text.endswith("\n")
    families: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP "):].partition(" ")
            assert name not in families, f"family {name} declared twice"
            families[name] = {"help": help_text, "type": None, "samples": []}
            current = name
        elif line.startswith("# TYPE "):
            name, kind = line[len("# TYPE "):].split(" ")
            assert name == current, "TYPE must follow the HELP of the same family"
            assert kind in {"counter", "gauge", "histogram", "summary", "untyped"}
            families[name]["type"] = kind
        else:
            m = _SAMPLE_RE.match(line)
            assert m, f"not a valid sample line: {line!r}"
            sample = m["name"]
            fam = families[current]
            allowed = {current} if fam["type"] != "histogram" else {current + s for s in ("_bucket", "_sum", "_count")}
            assert sample in allowed, f"{sample} outside its family block {current}"
            labels = {k: re.sub(r"\\[\\\"n]", lambda e: _UNESCAPE[e[0]], v) for k, v in _LABEL_PAIR_RE.findall(m["labels"] or "")}
            value = float(m["value"].replace("Inf", "inf"))
            fam["samples"].append((sample, labels, value))
    return families


# ---- percentiles -------------------------------------------------------------------------------------

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(values=st.lists(finite, min_size=1, max_size=300), ring=st.integers(min_value=1, max_value=64))
def test_stats_equal_numpy_over_the_last_ring_buffer_size_values(values, ring):
    m = Metrics(ring_buffer_size=ring)
    for v in values:
        m.observe("inference_latency_ms", v)
    assert_stats_close(m.get_stats("inference_latency_ms"), expected_stats(values[-ring:]))


@settings(max_examples=30, deadline=None)
@given(a=st.lists(finite, min_size=1, max_size=100), b=st.lists(finite, min_size=1, max_size=100))
def test_stats_aggregate_every_series_that_matches(a, b):
    m = Metrics()
    for v in a:
        m.observe("e2e_latency_ms", v, client="a", model="pi0")
    for v in b:
        m.observe("e2e_latency_ms", v, client="b", model="pi0")
    assert_stats_close(m.get_stats("e2e_latency_ms", model="pi0"), expected_stats(a + b))
    assert_stats_close(m.get_stats("e2e_latency_ms"), expected_stats(a + b))
    assert_stats_close(m.get_stats("e2e_latency_ms", client="b"), expected_stats(b))


def test_stats_on_random_latencies_match_numpy_percentiles():
    rng = np.random.default_rng(7)
    values = rng.lognormal(mean=3.5, sigma=0.6, size=5000)
    m = Metrics()
    for v in values:
        m.observe("inference_latency_ms", v, client="robot-1")
    assert_stats_close(m.get_stats("inference_latency_ms", client="robot-1"), expected_stats(values))


def test_stats_of_nothing_are_zero_with_count_zero():
    m = Metrics()
    assert m.get_stats("inference_latency_ms") == Stats(0, 0.0, 0.0, 0.0, 0.0, 0.0)
    m.observe("inference_latency_ms", 5.0, client="a")
    assert m.get_stats("inference_latency_ms", client="zzz").count == 0


def test_window_seconds_keeps_only_recent_values():
    clock = FakeClock()
    m = Metrics(clock=clock)
    m.observe("scheduling_wait_ms", 100.0)
    clock.t += 30
    m.observe("scheduling_wait_ms", 1.0)
    m.observe("scheduling_wait_ms", 3.0)
    clock.t += 5
    assert_stats_close(m.get_stats("scheduling_wait_ms", window_seconds=10), expected_stats([1.0, 3.0]))
    assert m.get_stats("scheduling_wait_ms", window_seconds=60).count == 3
    assert m.get_stats("scheduling_wait_ms").count == 3


def test_ring_buffer_keeps_growing_after_a_query():
    m = Metrics(ring_buffer_size=4)
    m.observe("batch_size", 1)
    m.get_stats("batch_size")
    for v in (2, 3, 4, 5, 6):
        m.observe("batch_size", v)
    assert m.get_stats("batch_size").count == 4
    assert m.get_stats("batch_size").max == 6.0


# ---- labels, latest, types -----------------------------------------------------------------------------


def test_label_filter_matches_series_whose_labels_include_the_given_ones():
    m = Metrics()
    m.observe("inference_latency_ms", 10, client="a", model="pi0")
    m.observe("inference_latency_ms", 20, model="pi0", client="b")  # keyword order does not make a new series
    m.observe("inference_latency_ms", 30, client="a", model="act")
    m.observe("inference_latency_ms", 40, client="a", model="pi0")
    assert m.get_stats("inference_latency_ms", model="pi0").count == 3
    assert m.get_stats("inference_latency_ms", client="a").count == 3
    assert m.get_stats("inference_latency_ms", client="a", model="pi0").mean == 25.0
    assert m.get_stats("inference_latency_ms", client="a", model="pi0", error="x").count == 0
    assert len(m.snapshot()["inference_latency_ms"]["series"]) == 3


def test_labels_mapping_spelling_of_design_003_is_accepted():
    m = Metrics()
    m.set("queue_depth", 4, model="manipulation-policy")
    m.set("queue_depth", 1, labels={"model": "telemetry"})
    assert m.get_latest("queue_depth", labels={"model": "manipulation-policy"}) == 4.0
    assert m.get_latest("queue_depth", model="telemetry") == 1.0
    assert m.get_stats("queue_depth", labels={"model": "telemetry"}).count == 1


def test_label_values_are_strings_so_int_and_str_codes_are_one_series():
    m = Metrics()
    m.inc("observation_errors", code=413)
    m.inc("observation_errors", code="413")
    assert m.get_latest("observation_errors", code="413") == 2.0
    assert m.snapshot()["observation_errors"]["series"] == [{"labels": {"code": "413"}, "value": 2.0}]


def test_get_latest_sums_counters_and_takes_the_newest_value_otherwise():
    clock = FakeClock()
    m = Metrics(clock=clock)
    assert m.get_latest("requests") is None
    m.inc("requests", client="a")
    m.inc("requests", 2, client="b")
    assert m.get_latest("requests") == 3.0
    assert m.get_latest("requests", client="b") == 2.0
    m.set("load", 0.5, model="x")
    clock.t += 1
    m.set("load", 0.25, model="y")
    assert m.get_latest("load") == 0.25
    m.observe("inference_latency_ms", 12.0)
    assert m.get_latest("inference_latency_ms") == 12.0


def test_known_metric_called_with_the_wrong_method_names_the_right_one():
    m = Metrics()
    with pytest.raises(TypeError, match=r"'queue_depth' is a gauge: use Metrics.set\(\)"):
        m.observe("queue_depth", 3)
    with pytest.raises(TypeError, match=r"is a counter: use Metrics.inc\(\)"):
        m.set("requests", 3)


def test_unknown_metric_is_typed_by_first_use():
    m = Metrics()
    m.inc("warmup_runs")
    with pytest.raises(TypeError, match="is a counter"):
        m.observe("warmup_runs", 1.0)
    m.observe("decode_ms", 3.0)
    families = parse_prometheus(m.render_prometheus())
    assert families["policy_server_warmup_runs_total"]["type"] == "counter"
    assert families["policy_server_decode_ms"]["type"] == "histogram"


def test_invalid_inputs_are_rejected_loudly():
    m = Metrics()
    with pytest.raises(ValueError, match="counters never go down"):
        m.inc("requests", -1)
    with pytest.raises(ValueError, match="NaN"):
        m.observe("inference_latency_ms", float("nan"))
    with pytest.raises(ValueError, match="metric name"):
        m.observe("bad.name", 1.0)
    with pytest.raises(ValueError, match="'le'"):
        m.observe("inference_latency_ms", 1.0, le="5")


def test_forget_drops_a_departed_clients_series_everywhere():
    m = Metrics()
    m.observe("inference_latency_ms", 1.0, client="gone")
    m.inc("requests", client="gone")
    m.inc("requests", client="stays")
    assert m.forget(client="gone") == 2
    assert m.get_latest("requests") == 1.0
    assert m.get_stats("inference_latency_ms").count == 0
    m.inc("requests", client="gone")  # a returning client starts a fresh series
    assert m.get_latest("requests", client="gone") == 1.0


# ---- callbacks ----------------------------------------------------------------------------------------


def test_on_metric_callbacks_see_every_call_and_their_exceptions_are_counted():
    m = Metrics()
    seen = []

    @m.on_metric
    def record(name, value, labels):
        seen.append((name, value, labels))

    def broken(name, value, labels):
        raise RuntimeError("callback bug")

    m.on_metric(broken)
    m.observe("inference_latency_ms", 12.5, client="a", model="pi0")
    m.inc("chunks_sent", client="a")
    m.set("active_sessions", 3)
    assert seen == [
        ("inference_latency_ms", 12.5, {"client": "a", "model": "pi0"}),
        ("chunks_sent", 1.0, {"client": "a"}),
        ("active_sessions", 3.0, {}),
    ]
    assert m.get_latest("metric_callback_errors") == 3.0
    seen[0][2]["client"] = "mutated"  # callbacks get copies
    assert m.get_stats("inference_latency_ms", client="a").count == 1


# ---- concurrency ------------------------------------------------------------------------------------


def test_concurrent_recording_loses_nothing():
    m = Metrics(ring_buffer_size=100)
    threads, per_thread = 8, 5000
    barrier = threading.Barrier(threads)

    def work(i: int) -> None:
        barrier.wait()
        for k in range(per_thread):
            m.inc("requests", client=f"c{i % 2}")
            m.observe("e2e_latency_ms", float(k % 300), model="pi0")
            if k % 1000 == 0:
                m.render_prometheus()
                m.get_stats("e2e_latency_ms")

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    total = threads * per_thread
    assert m.get_latest("requests") == total
    assert m.get_latest("requests", client="c0") == total / 2
    hist = parse_prometheus(m.render_prometheus())["policy_server_e2e_latency_ms"]["samples"]
    count = [v for n, _, v in hist if n.endswith("_count")]
    inf_bucket = [v for n, lbl, v in hist if n.endswith("_bucket") and lbl["le"] == "+Inf"]
    assert count == inf_bucket == [total]
    assert m.get_stats("e2e_latency_ms").count == 100


# ---- Prometheus text ----------------------------------------------------------------------------------


def test_prometheus_text_parses_with_help_type_prefix_and_total_suffix():
    m = Metrics()
    m.observe("inference_latency_ms", 12.0, client="a", model="pi0")
    m.inc("requests", client="a")
    m.inc("dispatch_errors", error="CUDA OOM", client="a")
    m.set("active_sessions", 2)
    families = parse_prometheus(m.render_prometheus())
    for name, spec in KNOWN_METRICS.items():
        full = "policy_server_" + name + ("_total" if spec.kind == "counter" else "")
        assert families[full]["type"] == spec.kind
        assert families[full]["help"] == spec.help
    assert families["policy_server_requests_total"]["samples"] == [("policy_server_requests_total", {"client": "a"}, 1.0)]
    assert families["policy_server_active_sessions"]["samples"] == [("policy_server_active_sessions", {}, 2.0)]
    assert families["policy_server_sessions_rejected_total"]["samples"] == []  # declared, no sample yet
    assert all(name.startswith("policy_server_") for name in families)


def test_histogram_buckets_are_cumulative_and_end_at_inf_equal_to_count():
    m = Metrics()
    values = [0.5, 1.0, 3.0, 10.0, 99.0, 20000.0]
    for v in values:
        m.observe("inference_latency_ms", v, client="a")
    samples = parse_prometheus(m.render_prometheus())["policy_server_inference_latency_ms"]["samples"]
    buckets = [(lbl["le"], v) for n, lbl, v in samples if n.endswith("_bucket")]
    assert [le for le, _ in buckets] == [repr(b) for b in LATENCY_MS_BUCKETS] + ["+Inf"]
    for le, cumulative in buckets:
        bound = float(le.replace("Inf", "inf"))
        assert cumulative == sum(v <= bound for v in values), le  # `le` means less than or equal
    assert ("policy_server_inference_latency_ms_sum", {"client": "a"}, sum(values)) in samples
    assert ("policy_server_inference_latency_ms_count", {"client": "a"}, 6.0) in samples
    assert all(lbl["client"] == "a" for _, lbl, _ in samples)


def test_label_values_are_escaped_and_round_trip():
    m = Metrics()
    nasty = 'say "hi"\\ now\nplease'
    m.inc("dispatch_errors", error=nasty)
    samples = parse_prometheus(m.render_prometheus())["policy_server_dispatch_errors_total"]["samples"]
    assert samples == [("policy_server_dispatch_errors_total", {"error": nasty}, 1.0)]


def test_non_finite_gauges_render_as_prometheus_words_and_snapshot_as_null():
    m = Metrics()
    m.set("load", math.inf)
    assert "policy_server_load +Inf\n" in m.render_prometheus()
    assert m.snapshot()["load"]["series"][0]["value"] is None


def test_snapshot_is_json_serialisable():
    m = Metrics()
    m.observe("payload_size_bytes", 50_000, client="a")
    m.inc("superseded_requests", client="a")
    m.set("queue_depth", 1)
    snap = json.loads(json.dumps(snap_raw := m.snapshot(), allow_nan=False))
    assert snap == snap_raw
    series = snap["payload_size_bytes"]["series"][0]
    assert series["labels"] == {"client": "a"} and series["count"] == 1 and series["stats"]["p99"] == 50_000.0
    assert snap["superseded_requests"]["type"] == "counter"


def test_a_filtered_render_holds_only_the_named_families():
    from server.metrics import Metrics

    m = Metrics()
    m.set("load", 0.5)
    m.observe("inference_latency_ms", 3.0, client="a", model="m")
    m.inc("chunks_sent", client="a")
    text = m.render_prometheus({"policy_server_load", "chunks_sent_total"})
    assert "policy_server_load 0.5" in text and "policy_server_chunks_sent_total" in text
    assert "inference_latency_ms" not in text
    assert "inference_latency_ms" in m.render_prometheus()
