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


def test_wait_matched_waits_for_a_subscriber_seen_through_a_real_router(tmp_path):
    from wire.procs import start_router
    from wire.transport import open_session

    router, endpoint = start_router(None, tmp_path / "router.log")
    try:
        pub_side, sub_side = open_session(connect=[endpoint], what="pub"), open_session(connect=[endpoint], what="sub")
        try:
            pub = qos.declare_publisher(pub_side, "qos-test/obs", "obs")
            assert qos.wait_matched(pub, 0.2) is False  # no subscriber anywhere
            sub_side.declare_subscriber("qos-test/obs", lambda s: None)
            assert qos.wait_matched(pub, 10.0) is True
        finally:
            pub_side.close()
            sub_side.close()
    finally:
        router.stop()
