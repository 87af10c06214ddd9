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
import ssl
import sys

from .broker import Broker, BrokerConfig
from .certificate import certificate_files, certificate_hosts
from .protocol.grpc import GrpcServer, MessagingService, admin_methods
from .protocol.tls import OFF, SniffingListener, server_context
from .serve_options import ServeOptions, http2_limits, resolve_options
from .store import MessageStore, StoreConfig, raise_open_file_limit

log = logging.getLogger("tidemq.server")
INFLATED_ENVELOPE = 64 << 10  # a request's octets besides the body: properties, names, the protobuf framing


class Server:
    """One broker process: store + broker + gRPC server on one port."""

    def __init__(
        self, options: ServeOptions, broker_config: BrokerConfig | None = None, store_config: StoreConfig | None = None
    ) -> None:
        self.options = options
        host = options.listen.rpartition(":")[0] or "127.0.0.1"
        self.store_config = store_config or StoreConfig(
            flush=options.flush,
            segment_size=options.segment_size,
            retention_hours=options.retention_hours,
            max_message_size=options.max_message_size,
            store_host=(host if host[0].isdigit() else "127.0.0.1", 10911),
            append_crc_property=options.append_crc_property,
            disk_space_warning_level_ratio=options.disk_space_warning_level_ratio,
            enable_lmq=options.enable_lmq,
            enable_multi_dispatch=options.enable_multi_dispatch,
            light_queue_store=options.light_queue_store,
            light_queue_idle_expiry_ms=options.light_queue_idle_expiry_ms,
        )
        self.broker_config = broker_config or BrokerConfig(
            auto_create_topic_enable=options.auto_create_topic,
            auto_create_subscription_group=options.auto_create_group,
            default_topic_queue_nums=options.default_queues,
            broker_name=options.broker_name,
            advertised_address=options.advertise,
            max_message_size=options.max_message_size,
            long_polling_timeout_ms=options.long_polling_timeout_ms,
            auto_renew_invisible_time_ms=options.auto_renew_invisible_time_ms,
            renew_ahead_ms=options.renew_ahead_ms,
            renew_interval_ms=options.renew_interval_ms,
            transaction_timeout_ms=options.transaction_timeout_ms,
            transaction_check_max=options.transaction_check_max,
            transaction_check_interval_ms=options.transaction_check_interval_ms,
            priority_retry_first_percent=options.priority_retry_first_percent,
            lite_subscription_quota=options.lite_subscription_quota,
            lite_topic_quota=options.lite_topic_quota,
            max_lite_subscription_count=options.max_lite_subscription_count,
            max_sync_lite_subscription_rate=options.max_sync_lite_subscription_rate,
            timer_max_delay_sec=options.timer_max_delay_sec,
        )
        self.store: MessageStore | None = None
        self.broker: Broker | None = None
        self.grpc_server: GrpcServer | None = None
        self.port = 0

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        # first: a bad certificate stops the start before the store is opened
        listener = await loop.run_in_executor(None, tls_listener, self.options)
        self.store = await loop.run_in_executor(None, MessageStore, self.options.store, self.store_config)
        self.broker = Broker(self.store, self.broker_config)
        self.broker.start(loop)
        service = self.service = MessagingService(self.broker)
        # the broker judges a body's size (and answers MESSAGE_BODY_TOO_LARGE): the transport's own
        # limit is well above it; a compressed request inflates to a body and its envelope at most
        server = GrpcServer(
            {**service.methods(), **admin_methods(self.broker)},
            max_receive_message_length=4 * self.options.max_message_size,
            max_inflated_message_length=self.options.max_message_size + INFLATED_ENVELOPE,
            limits=http2_limits(self.options),
        )
        listener.served = server.connection_count  # connections being sniffed count toward the cap too
        self.port = await server.start(self.options.listen, listener)
        host = self.options.listen.rpartition(":")[0]
        service.listen_address = f"{host}:{self.port}"
        self.grpc_server = server
        return self.port

    async def stop(self) -> None:
        if self.grpc_server is not None and self.broker is not None:  # started: both are set
            self.broker.stop_polling()
            self.service.closing.set()
            await self.grpc_server.stop(self.options.grace_seconds)
        if self.broker is not None:
            await self.broker.close()
        if self.store is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.store.close)


def tls_listener(options: ServeOptions) -> SniffingListener:
    """The listener for `--tls`: with its certificate (the user's, or the store's self-signed one)
    unless TLS is off."""
    context = None
    if options.tls != OFF:
        hosts = certificate_hosts(options.listen, options.advertise)
        cert_file, key_file = certificate_files(options.store, options.tls_cert, options.tls_key, hosts)
        try:
            context = server_context(cert_file, key_file)
        except ssl.SSLError as exc:
            raise ValueError(f"TLS certificate {cert_file} with key {key_file}: {exc.reason or exc}") from None
        log.info("TLS %s: certificate %s", options.tls, cert_file)
    return SniffingListener(
        options.tls, context, preface_timeout=options.preface_timeout_ms / 1000, max_connections=options.max_connections
    )


async def serve(options: ServeOptions) -> None:
    server = Server(options)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        port = await server.start()
    except BaseException:  # a bad config file, a port in use: close what was opened (no abort marker)
        await server.stop()
        raise
    host = options.listen.rpartition(":")[0]
    log.info(
        "tidemq ready: gRPC on %s:%d, store %s, %s flush, %s event loop",
        host,
        port,
        options.store,
        options.flush,
        type(loop).__module__.partition(".")[0],
    )
    await stop.wait()
    log.info("shutting down: no new calls, finishing in-flight ones")
    await server.stop()
    log.info("stopped cleanly")


# The event loop, the store's dispatch thread and its flush thread hand work to each other; CPython
# passes the GIL to a waiting thread only after this interval (default 5 ms) unless the holder
# blocks, which put that much on a message's way from send to delivery.
GIL_SWITCH_INTERVAL_S = 0.0005


def event_loop_factory(choice: str):
    """The event loop `serve` runs on.  uvloop's costs less CPU per gRPC call than asyncio's;
    `auto` takes it when it is installed."""
    if choice == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise RuntimeError("--event-loop uvloop: the uvloop package is not installed") from None
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def run(args: argparse.Namespace) -> int:
    options = resolve_options(args)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    raise_open_file_limit()  # every mapped queue file holds an open file
    with asyncio.Runner(loop_factory=event_loop_factory(options.event_loop)) as runner:
        runner.run(serve(options))
    return 0
