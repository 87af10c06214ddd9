"""Process wiring for `tidemq serve`: options (flags and TOML), the store, the broker, the gRPC
server, signals.

Shutdown on SIGINT/SIGTERM: stop accepting calls, answer waiting long polls, let in-flight calls
finish (grace period), make the pop journal durable, then close the store (flush, checkpoint,
abort marker removed)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import tomllib
from dataclasses import dataclass

import grpc
from rocketmq.grpc_protocol import service_pb2_grpc

from .broker import Broker, BrokerConfig
from .protocol.grpc import MessagingService, admin_handler
from .store import MessageStore, StoreConfig

log = logging.getLogger("tidemq.server")


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
    long_polling_timeout_ms: int = 20_000
    grace_seconds: float = 5.0
    auto_renew_invisible_time_ms: int = 60_000
    renew_ahead_ms: int = 10_000
    renew_interval_ms: int = 5_000


# flag, config key (RocketMQ's name where one exists), option, help
OPTIONS = [
    ("--store", "storePathRootDir", "store", "store directory (default ./data)"),
    ("--listen", "grpcListenAddress", "listen", "gRPC HOST:PORT (default 127.0.0.1:8081; port 0 picks one)"),
    ("--flush", "flushDiskType", "flush", "async | sync (ASYNC_FLUSH | SYNC_FLUSH)"),
    ("--auto-create-topic", "autoCreateTopicEnable", "auto_create_topic", "create topics on first use (true|false)"),
    ("--auto-create-group", "autoCreateSubscriptionGroup", "auto_create_group", "create groups on first use (true|false)"),
    ("--default-queues", "defaultTopicQueueNums", "default_queues", "queues of an auto-created topic (default 8)"),
    ("--broker-name", "brokerName", "broker_name", "broker name in routes"),
    ("--advertise", "advertisedAddress", "advertise", "HOST:PORT put in routes (default: the address the client used)"),
    ("--segment-size", "mappedFileSizeCommitLog", "segment_size", "commit-log segment bytes"),
    ("--retention-hours", "fileReservedTime", "retention_hours", "hours a commit-log segment is kept"),
    ("--max-message-size", "maxMessageSize", "max_message_size", "largest message body in bytes"),
    ("--long-polling-timeout-ms", "grpcClientConsumerLongPollingTimeoutMillis", "long_polling_timeout_ms",
     "long polling time told to push consumers"),
    ("--grace-seconds", "shutdownGraceSeconds", "grace_seconds", "time in-flight calls get at shutdown"),
    ("--auto-renew-invisible-time-ms", "defaultInvisibleTimeMills", "auto_renew_invisible_time_ms",
     "invisible time the broker picks for push consumers (auto-renew)"),
    ("--renew-ahead-ms", "renewAheadTimeMillis", "renew_ahead_ms", "renew an auto-renewed message this long before its deadline"),
    ("--renew-interval-ms", "renewSchedulePeriodMillis", "renew_interval_ms", "how often auto-renewal runs"),
]
_FLUSH_NAMES = {"async": "async", "sync": "sync", "ASYNC_FLUSH": "async", "SYNC_FLUSH": "sync"}


def _convert(option: str, value):
    kind = type(getattr(ServeOptions(), option))
    if kind is bool and isinstance(value, str):
        if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(f"{option}: {value!r} is not true or false")
        return value.lower() in ("true", "1", "yes")
    return kind(value)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="TOML file; keys as RocketMQ names them (see `tidemq serve --help`)")
    for flag, key, option, text in OPTIONS:
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
    return options


class Server:
    """One broker process: store + broker + gRPC server on one port."""

    def __init__(self, options: ServeOptions, broker_config: BrokerConfig | None = None,
                 store_config: StoreConfig | None = None) -> None:
        self.options = options
        host = options.listen.rpartition(":")[0] or "127.0.0.1"
        self.store_config = store_config or StoreConfig(
            flush=options.flush, segment_size=options.segment_size, retention_hours=options.retention_hours,
            max_message_size=options.max_message_size, store_host=(host if host[0].isdigit() else "127.0.0.1", 10911),
        )
        self.broker_config = broker_config or BrokerConfig(
            auto_create_topic_enable=options.auto_create_topic, auto_create_subscription_group=options.auto_create_group,
            default_topic_queue_nums=options.default_queues, broker_name=options.broker_name,
            advertised_address=options.advertise, max_message_size=options.max_message_size,
            long_polling_timeout_ms=options.long_polling_timeout_ms,
            auto_renew_invisible_time_ms=options.auto_renew_invisible_time_ms,
            renew_ahead_ms=options.renew_ahead_ms, renew_interval_ms=options.renew_interval_ms,
        )
        self.store: MessageStore | None = None
        self.broker: Broker | None = None
        self.grpc_server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        self.store = await loop.run_in_executor(None, MessageStore, self.options.store, self.store_config)
        self.broker = Broker(self.store, self.broker_config)
        self.broker.start(loop)
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)])
        service = self.service = MessagingService(self.broker)
        service_pb2_grpc.add_MessagingServiceServicer_to_server(service, server)
        server.add_generic_rpc_handlers((admin_handler(self.broker),))
        self.port = server.add_insecure_port(self.options.listen)
        if self.port == 0:
            raise OSError(f"cannot listen on {self.options.listen}")
        host = self.options.listen.rpartition(":")[0]
        service.listen_address = f"{host}:{self.port}"
        await server.start()
        self.grpc_server = server
        return self.port

    async def stop(self) -> None:
        if self.grpc_server is not None:
            self.broker.stop_polling()
            self.service.closing.set()
            await self.grpc_server.stop(self.options.grace_seconds)
        if self.broker is not None:
            await self.broker.close()
        if self.store is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.store.close)


async def serve(options: ServeOptions) -> None:
    server = Server(options)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    port = await server.start()
    host = options.listen.rpartition(":")[0]
    log.info("tidemq ready: gRPC on %s:%d, store %s, %s flush", host, port, options.store, options.flush)
    await stop.wait()
    log.info("shutting down: no new calls, finishing in-flight ones")
    await server.stop()
    log.info("stopped cleanly")


def run(args: argparse.Namespace) -> int:
    asyncio.run(serve(resolve_options(args)))
    return 0
