"""`tidemq serve` options: defaults, TOML keys named after RocketMQ's, flags over the file."""

from __future__ import annotations

import argparse

import pytest

from tidemq.serve_options import OPTIONS, ServeOptions, add_serve_arguments, resolve_options
from tidemq.store.light.queues import LIGHT_QUEUE_STORES

from .server import ServerProcess, tidemq


def parse(*argv: str) -> ServeOptions:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return resolve_options(parser.parse_args(argv))


def test_defaults():
    options = parse()
    assert (options.store, options.listen, options.flush) == ("./data", "127.0.0.1:8081", "async")
    assert options.auto_create_topic and options.auto_create_group and options.default_queues == 8


def test_every_option_has_a_flag_and_a_config_key(tmp_path):
    assert len({key for _, key, _, _ in OPTIONS}) == len(OPTIONS) == len({flag for flag, _, _, _ in OPTIONS})
    config = tmp_path / "tidemq.toml"
    config.write_text('storePathRootDir = "/srv/tidemq"\nflushDiskType = "SYNC_FLUSH"\n'
                      'autoCreateTopicEnable = false\ndefaultTopicQueueNums = 4\ngrpcListenAddress = "127.0.0.1:9000"\n')
    options = parse("--config", str(config))
    assert (options.store, options.flush, options.auto_create_topic, options.default_queues, options.listen) == \
        ("/srv/tidemq", "sync", False, 4, "127.0.0.1:9000")
    assert parse("--config", str(config), "--flush", "async", "--default-queues", "2").flush == "async"
    assert parse("--config", str(config), "--default-queues", "2").default_queues == 2


def test_the_crc_property_and_the_disk_space_level_have_rocketmqs_keys(tmp_path):
    config = tmp_path / "tidemq.toml"
    config.write_text("enabledAppendPropCRC = false\ndiskSpaceWarningLevelRatio = 75\n")
    options = parse("--config", str(config))
    assert (options.append_crc_property, options.disk_space_warning_level_ratio) == (False, 75)
    assert (parse().append_crc_property, parse().disk_space_warning_level_ratio) == (True, 90)
    with pytest.raises(ValueError, match="within 1-100"):
        parse("--disk-space-warning-level-ratio", "101")


def test_light_queue_options_have_rocketmqs_keys_and_reach_the_store(tmp_path):
    from tidemq.server import Server

    config = tmp_path / "tidemq.toml"
    config.write_text('enableLmq = false\nenableMultiDispatch = false\nlightQueueStore = "file"\n')
    options = parse("--config", str(config), "--light-queue-idle-expiry-ms", "60000")
    store_config = Server(options).store_config
    assert (store_config.enable_lmq, store_config.enable_multi_dispatch) == (False, False)
    assert (store_config.light_queue_store, store_config.light_queue_idle_expiry_ms) == ("file", 60_000)
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert "%LMQ% queues are light queues" in parser.format_help()
    defaults = Server(parse()).store_config
    assert (defaults.enable_lmq, defaults.enable_multi_dispatch, defaults.light_queue_store) == (True, True, "kv")
    with pytest.raises(ValueError, match=r"light_queue_store must be one of \('kv', 'file'\), not 'rocks'"):
        parse("--light-queue-store", "rocks")
    with pytest.raises(ValueError, match="light_queue_idle_expiry_ms must be 0"):
        parse("--light-queue-idle-expiry-ms", "-1")
    for store in LIGHT_QUEUE_STORES:  # the store's list is the one the options take
        assert parse("--light-queue-store", store).light_queue_store == store


def test_bad_options_are_refused_with_a_message(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("noSuchKey = 1\n")
    with pytest.raises(ValueError, match="unknown config key 'noSuchKey'"):
        parse("--config", str(config))
    with pytest.raises(ValueError, match="flush must be"):
        parse("--flush", "sometimes")
    with pytest.raises(ValueError, match="event loop must be one of auto, uvloop, asyncio"):
        parse("--event-loop", "trio")
    result = tidemq("serve", "--config", str(config), "--store", str(tmp_path / "s"))
    assert result.returncode == 2 and "unknown config key" in result.stderr


@pytest.mark.parametrize("event_loop", ["asyncio", "auto"])
def test_the_sdk_is_served_on_either_event_loop(tmp_path, event_loop):
    from rocketmq import FilterExpression, Message, Producer, SimpleConsumer

    server = ServerProcess(tmp_path / "store", "--event-loop", event_loop).start()
    try:
        producer = Producer(server.config(), ("Loops",))
        producer.startup()
        consumer = SimpleConsumer(server.config(), "LoopsGroup", {"Loops": FilterExpression()}, await_duration=2)
        consumer.startup()
        try:
            m = Message()
            m.topic, m.body = "Loops", b"hello"
            producer.send(m)
            (got,) = consumer.receive(1, 20)
            consumer.ack(got)
            assert got.body == b"hello"
        finally:
            producer.shutdown()
            consumer.shutdown()
    finally:
        assert server.stop() == 0, server.log_text()
    expected = "asyncio event loop" if event_loop == "asyncio" else "event loop"
    assert expected in server.log_text()
