"""The wire demo really crosses a Zenoh router process and every request is answered in order."""

import json

from wire.demo import main


def test_wire_demo_round_trips_through_a_real_router(tmp_path):
    out = tmp_path / "demo.json"
    assert main(["--requests", "20", "--cameras", "1", "--height", "32", "--width", "32", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["answered"] == 20 and result["lost"] == 0
    assert 0 < result["rtt_ms_p50"] <= result["rtt_ms_p99"]
