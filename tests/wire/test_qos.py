"""QoS per topic matches design 6.3: actions never BLOCK, observations are droppable."""

import zenoh

from wire import qos


def test_action_publisher_is_reliable_drop_express_interactive_high():
    kw = qos.publisher_kwargs(qos.ACTION)
    assert kw["congestion_control"] == zenoh.CongestionControl.DROP
    assert kw["priority"] == zenoh.Priority.INTERACTIVE_HIGH
    assert kw["express"] is True
    assert kw["reliability"] == zenoh.Reliability.RELIABLE


def test_obs_publisher_is_drop_data_not_express():
    kw = qos.publisher_kwargs(qos.OBS)
    assert kw["congestion_control"] == zenoh.CongestionControl.DROP
    assert kw["priority"] == zenoh.Priority.DATA
    assert kw["express"] is False
    assert "reliability" not in kw


def test_no_topic_uses_block():
    assert all(q.congestion_control == "drop" for q in qos.BY_TOPIC.values())
