"""`tidemq serve` options: defaults, flags, and TOML config keys named after RocketMQ's.

Kept apart from `server.py` so that building the command line imports nothing heavy."""

from __future__ import annotations

import argparse
import tomllib
from dataclasses import dataclass


@dataclass
class ServeOptions:
    store: str = "./data"
    listen: str = "127.0.0.1:8081"
    flush: str = "async"
    auto_create_topic: bool = True
    auto_create_group: bool = True
    default_queues: int = 8
    broker_name: str = "tidemq"
    advertise: str = ""
    segment_size: int = 1 << 30
    retention_hours: float = 72.0
    max_message_size: int = 4 * 1024 * 1024
    append_crc_property: bool = True
    disk_space_warning_level_ratio: int = 90
    enable_lmq: bool = True
    enable_multi_dispatch: bool = True
    light_queue_store: str = "kv"
    light_queue_idle_expiry_ms: int = 24 * 3600 * 1000
    long_polling_timeout_ms: int = 20_000
    grace_seconds: float = 5.0
    auto_renew_invisible_time_ms: int = 60_000
    renew_ahead_ms: int = 10_000
    renew_interval_ms: int = 5_000
    timer_max_delay_sec: int = 86_400
    event_loop: str = "auto"
    transaction_timeout_ms: int = 6_000
    transaction_check_max: int = 15
    transaction_check_interval_ms: int = 30_000
    priority_retry_first_percent: int = 0
    lite_subscription_quota: int = 1200
    lite_topic_quota: int = 10_000_000
    max_lite_subscription_count: int = 100_000
    max_sync_lite_subscription_rate: float = 5000.0
    # TLS (tidemq/protocol/tls.py, tidemq/certificate.py)
    tls: str = "permissive"
    tls_cert: str = ""
    tls_key: str = ""
    # HTTP/2 limits (docs/http2.md)
    max_concurrent_streams: int = 1000
    idle_timeout_ms: int = 120_000
    preface_timeout_ms: int = 10_000
    write_stall_timeout_ms: int = 30_000
    max_connections: int = 4096


# flag, config key (RocketMQ's name where one exists), option, help
OPTIONS = [
    ("--store", "storePathRootDir", "store", "store directory (default ./data)"),
    ("--listen", "grpcListenAddress", "listen", "gRPC HOST:PORT (default 127.0.0.1:8081; port 0 picks one)"),
    ("--flush", "flushDiskType", "flush", "async | sync (ASYNC_FLUSH | SYNC_FLUSH)"),
    ("--auto-create-topic", "autoCreateTopicEnable", "auto_create_topic", "create topics on first use (true|false)"),
    (
        "--auto-create-group",
        "autoCreateSubscriptionGroup",
        "auto_create_group",
        "create groups on first use (true|false)",
    ),
    ("--default-queues", "defaultTopicQueueNums", "default_queues", "queues of an auto-created topic (default 8)"),
    ("--broker-name", "brokerName", "broker_name", "broker name in routes"),
    ("--advertise", "advertisedAddress", "advertise", "HOST:PORT put in routes (default: the address the client used)"),
    ("--segment-size", "mappedFileSizeCommitLog", "segment_size", "commit-log segment bytes"),
    ("--retention-hours", "fileReservedTime", "retention_hours", "hours a commit-log segment is kept"),
    ("--max-message-size", "maxMessageSize", "max_message_size", "largest message body in bytes"),
    (
        "--disk-space-warning-level-ratio",
        "diskSpaceWarningLevelRatio",
        "disk_space_warning_level_ratio",
        "sends are refused (TOO_MANY_REQUESTS) while the store's disk is more used than this percentage (default 90)",
    ),
    (
        "--append-crc-property",
        "enabledAppendPropCRC",
        "append_crc_property",
        "append RocketMQ's whole-record CRC property (__CRC32#) to each record (true|false)",
    ),
    ("--enable-lmq", "enableLmq", "enable_lmq", "%%LMQ%% queues are light queues, read as queue 0 (true|false)"),
    (
        "--enable-multi-dispatch",
        "enableMultiDispatch",
        "enable_multi_dispatch",
        "dispatch a message to the light queues its INNER_MULTI_DISPATCH property names (true|false)",
    ),
    (
        "--light-queue-store",
        "lightQueueStore",
        "light_queue_store",
        "where light queues live: kv (key-value tables, any number) | file (RocketMQ's consumequeue/%%LMQ%%name/0/)",
    ),
    (
        "--light-queue-idle-expiry-ms",
        "lightQueueIdleExpiryMillis",
        "light_queue_idle_expiry_ms",
        "an idle, fully consumed light queue and its consumer offsets go after this long (0: never)",
    ),
    (
        "--long-polling-timeout-ms",
        "grpcClientConsumerLongPollingTimeoutMillis",
        "long_polling_timeout_ms",
        "long polling time told to push consumers",
    ),
    ("--grace-seconds", "shutdownGraceSeconds", "grace_seconds", "time in-flight calls get at shutdown"),
    (
        "--auto-renew-invisible-time-ms",
        "defaultInvisibleTimeMills",
        "auto_renew_invisible_time_ms",
        "invisible time the broker picks for push consumers (auto-renew)",
    ),
    (
        "--renew-ahead-ms",
        "renewAheadTimeMillis",
        "renew_ahead_ms",
        "renew an auto-renewed message this long before its deadline",
    ),
    ("--renew-interval-ms", "renewSchedulePeriodMillis", "renew_interval_ms", "how often auto-renewal runs"),
    (
        "--transaction-timeout-ms",
        "transactionTimeOut",
        "transaction_timeout_ms",
        "a half message is checked back no sooner than this after its birth",
    ),
    (
        "--transaction-check-max",
        "transactionCheckMax",
        "transaction_check_max",
        "check-backs of a half message before it is dropped to TRANS_CHECK_MAX_TIME_TOPIC",
    ),
    (
        "--transaction-check-interval-ms",
        "transactionCheckInterval",
        "transaction_check_interval_ms",
        "time between check-backs of an open transaction",
    ),
    (
        "--priority-retry-first-percent",
        "popFromRetryProbabilityForPriority",
        "priority_retry_first_percent",
        (
            "share of a priority topic's pops (0-100) that serve a level's redeliveries before its fresh messages "
            "(default 0: a redelivery ranks just below the fresh messages of its level, above every lower level)"
        ),
    ),
    (
        "--lite-subscription-quota",
        "liteSubClientQuota",
        "lite_subscription_quota",
        "lite topics one lite consumer may subscribe (default 1200)",
    ),
    (
        "--lite-topic-quota",
        "maxLiteTopicCount",
        "lite_topic_quota",
        "lite topics one bind topic may hold (default 10000000)",
    ),
    (
        "--max-lite-subscription-count",
        "maxLiteSubscriptionCount",
        "max_lite_subscription_count",
        "(client, lite topic) subscriptions the broker holds (default 100000)",
    ),
    (
        "--max-sync-lite-subscription-rate",
        "maxSyncLiteSubscriptionRate",
        "max_sync_lite_subscription_rate",
        "PARTIAL_ADD lite subscription requests a second, all clients together (default 5000)",
    ),
    (
        "--timer-max-delay-sec",
        "timerMaxDelaySec",
        "timer_max_delay_sec",
        "how far ahead a delay message's delivery time may be (default one day)",
    ),
    (
        "--event-loop",
        "eventLoop",
        "event_loop",
        "auto | uvloop | asyncio (auto: uvloop when installed, it takes less CPU per call)",
    ),
    # TLS
    (
        "--tls",
        "tlsServerMode",
        "tls",
        "off | permissive | required: TLS and plaintext on the one port (default permissive: both)",
    ),
    (
        "--tls-cert",
        "tlsCertPath",
        "tls_cert",
        "PEM certificate (chain) for TLS (default: a self-signed one created under STORE/config/tls/)",
    ),
    ("--tls-key", "tlsKeyPath", "tls_key", "PEM private key of --tls-cert"),
    (
        "--max-concurrent-streams",
        "grpcMaxConcurrentStreams",
        "max_concurrent_streams",
        "streams (calls) one connection may have open at once (default 1000)",
    ),
    (
        "--idle-timeout-ms",
        "grpcClientIdleTimeMills",
        "idle_timeout_ms",
        "a connection without a call this long is closed (default 120000)",
    ),
    (
        "--preface-timeout-ms",
        "grpcPrefaceTimeoutMillis",
        "preface_timeout_ms",
        "time a new connection gets to start HTTP/2 (default 10000)",
    ),
    (
        "--write-stall-timeout-ms",
        "grpcWriteStallTimeoutMillis",
        "write_stall_timeout_ms",
        "a client that reads nothing of what is written to it this long is dropped (default 30000)",
    ),
    ("--max-connections", "grpcMaxConnections", "max_connections", "connections served at once (default 4096)"),
]
_FLUSH_NAMES = {"async": "async", "sync": "sync", "ASYNC_FLUSH": "async", "SYNC_FLUSH": "sync"}
EVENT_LOOPS = ("auto", "uvloop", "asyncio")
# RocketMQ's tls.server.mode names (disabled | permissive | enforcing) are accepted too
_TLS_MODES = {
    "off": "off",
    "permissive": "permissive",
    "required": "required",
    "disabled": "off",
    "enforcing": "required",
}


def _convert(option: str, value):
    kind = type(getattr(ServeOptions(), option))
    if kind is bool and isinstance(value, str):
        if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(f"{option}: {value!r} is not true or false")
        return value.lower() in ("true", "1", "yes")
    return kind(value)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="TOML file; keys as RocketMQ names them (see `tidemq serve --help`)")
    defaults = ServeOptions()
    for flag, key, option, text in OPTIONS:
        default = getattr(defaults, option)
        shown = (
            "false" if default is False else "true" if default is True else repr(default) if default == "" else default
        )
        text = text if "default" in text else f"{text} (default {shown})"
        parser.add_argument(flag, dest=option, default=None, help=f"{text} [config key {key}]")


def resolve_options(args: argparse.Namespace) -> ServeOptions:
    """Defaults, then the TOML file, then flags."""
    options = ServeOptions()
    if getattr(args, "config", None):
        with open(args.config, "rb") as f:
            table = tomllib.load(f)
        by_key = {key: option for _, key, option, _ in OPTIONS}
        for key, value in table.items():
            if key not in by_key:
                raise ValueError(f"{args.config}: unknown config key {key!r} (known: {', '.join(sorted(by_key))})")
            setattr(options, by_key[key], _convert(by_key[key], value))
    for _, _, option, _ in OPTIONS:
        value = getattr(args, option, None)
        if value is not None:
            setattr(options, option, _convert(option, value))
    if options.flush not in _FLUSH_NAMES:
        raise ValueError(f"flush must be async or sync, not {options.flush!r}")
    options.flush = _FLUSH_NAMES[options.flush]
    if options.event_loop not in EVENT_LOOPS:
        raise ValueError(f"event loop must be one of {', '.join(EVENT_LOOPS)}, not {options.event_loop!r}")
    if options.tls not in _TLS_MODES:
        raise ValueError(f"--tls must be off, permissive or required, not {options.tls!r}")
    options.tls = _TLS_MODES[options.tls]
    if not 0 <= options.priority_retry_first_percent <= 100:
        raise ValueError(
            f"priority retry-first percentage must be within 0-100, not {options.priority_retry_first_percent}"
        )
    check_light_queue_options(options)
    if options.max_sync_lite_subscription_rate <= 0 or options.max_lite_subscription_count < 0:
        raise ValueError(
            f"lite subscription limits must be a positive rate and a count of 0 or more, not "
            f"{options.max_sync_lite_subscription_rate} and {options.max_lite_subscription_count}"
        )
    if not 1 <= options.disk_space_warning_level_ratio <= 100:
        raise ValueError(
            f"disk space warning level ratio must be within 1-100 (percent), not "
            f"{options.disk_space_warning_level_ratio}"
        )
    http2_limits(options)  # refuses a limit out of its range
    return options


def check_light_queue_options(options: ServeOptions) -> None:
    """The store's config judges the light-queue options (one list of stores, one range of
    expiry): ValueError as StoreConfig raises it."""
    from .store import StoreConfig

    StoreConfig(
        light_queue_store=options.light_queue_store,
        light_queue_idle_expiry_ms=options.light_queue_idle_expiry_ms,
    )


def http2_limits(options: ServeOptions):
    """The HTTP/2 server's limits that `options` set."""
    from .protocol.http2 import Limits

    return Limits(
        max_concurrent_streams=options.max_concurrent_streams,
        idle_timeout_s=options.idle_timeout_ms / 1000,
        preface_timeout_s=options.preface_timeout_ms / 1000,
        write_stall_timeout_s=options.write_stall_timeout_ms / 1000,
        max_connections=options.max_connections,
    )
