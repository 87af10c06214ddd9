"""`tidemq serve` options: defaults, TOML keys named after RocketMQ's, flags over the file."""

from __future__ import annotations

import argparse

import pytest

from tidemq.serve_options import OPTIONS, ServeOptions, add_serve_arguments, resolve_options

from .server import tidemq


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


def test_bad_options_are_refused_with_a_message(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("noSuchKey = 1\n")
    with pytest.raises(ValueError, match="unknown config key 'noSuchKey'"):
        parse("--config", str(config))
    with pytest.raises(ValueError, match="flush must be"):
        parse("--flush", "sometimes")
    result = tidemq("serve", "--config", str(config), "--store", str(tmp_path / "s"))
    assert result.returncode == 2 and "unknown config key" in result.stderr
