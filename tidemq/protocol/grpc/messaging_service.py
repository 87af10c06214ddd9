"""apache.rocketmq.v2.MessagingService over the broker: decode the request, call the broker,
encode the answer.  Business errors travel in `response.status` with the gRPC status OK, as the
Java proxy does; every response carries a status.

Handlers take the request and the call (`transport.Rpc`: metadata, peer, deadline).  Those that
need not wait are plain functions: the transport answers them without a task."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging

from ...broker import Broker, BrokerError, Code, Publish, ReceiveRequest, lite, validation
from . import convert
from .stubs import pb, svc
from .transport import BIDI_STREAM, SERVER_STREAM, UNARY, Method, Rpc

log = logging.getLogger(__name__)

SERVICE = "apache.rocketmq.v2.MessagingService"
CLIENT_ID_HEADER = "x-mq-client-id"
NAMESPACE_HEADER = "x-mq-namespace"
LANGUAGE_HEADER = "x-mq-language"
POLL_MARGIN_S = 1.0  # answer a long poll this long before the client's deadline
_RECEIVE_OK = svc.ReceiveMessageResponse(status=convert.OK)  # first response of a receive that found messages
_UNDECODABLE = object()  # a Telemetry message that is not a TelemetryCommand


def _telemetry_command(data: bytes):
    """The TelemetryCommand in `data`, or _UNDECODABLE (answered with BAD_REQUEST, not a broken
    stream)."""
    try:
        return svc.TelemetryCommand.FromString(data)
    except Exception:  # protobuf's DecodeError, or what a hostile byte string raises
        return _UNDECODABLE


def _client_id(rpc: Rpc) -> str:
    return rpc.metadata_value(CLIENT_ID_HEADER)


def _require(client_id: str) -> str:
    """`client_id`, or BrokerError CLIENT_ID_REQUIRED when the call carried none."""
    if not client_id:
        raise BrokerError(Code.CLIENT_ID_REQUIRED, f"metadata {CLIENT_ID_HEADER} is missing")
    return client_id


def _set_overall_status(response, failed: bool) -> None:
    """A per-entry response's own status: OK, the entries' one status if they share it, else
    MULTIPLE_RESULTS."""
    if not failed:
        response.status.CopyFrom(convert.OK)
        return
    entries = response.entries
    codes = {e.status.code for e in entries}
    response.status.CopyFrom(entries[0].status if len(codes) == 1 else convert.status(Code.MULTIPLE_RESULTS))


@functools.lru_cache(maxsize=1024)
def _host_of(peer: str) -> str:
    """ "ipv4:127.0.0.1:53412" / "ipv6:[::1]:53412" -> the host."""
    _, _, rest = peer.partition(":")
    host, _, _ = rest.rpartition(":")
    return host.strip("[]") or "127.0.0.1"


def _peer_host(rpc: Rpc) -> str:
    return _host_of(rpc.peer())


def unary(response_type):
    """Run a unary handler (plain or async); a BrokerError (or a missing client id) becomes the
    response's status, anything else is logged and answered with INTERNAL_ERROR."""

    def failed(handler, exc: Exception):
        if isinstance(exc, BrokerError):
            return response_type(status=convert.status(exc.code, exc.message))
        log.error("%s failed", handler.__name__, exc_info=exc)
        return response_type(status=convert.status(Code.INTERNAL_ERROR, "internal error"))

    def decorate(handler):
        async def guarded(answer):
            try:
                return await answer
            except Exception as exc:
                return failed(handler, exc)

        @functools.wraps(handler)
        def wrapper(self, request, rpc):
            try:
                _require(_client_id(rpc))
                answer = handler(self, request, rpc)
            except Exception as exc:
                return failed(handler, exc)
            return guarded(answer) if inspect.iscoroutine(answer) else answer

        return wrapper

    return decorate


class MessagingService:
    def __init__(self, broker: Broker, listen_address: str = "127.0.0.1:8081") -> None:
        self.broker = broker
        self.listen_address = listen_address  # advertised when a client names no endpoint
        self.closing = asyncio.Event()  # set at shutdown: telemetry streams end

    def methods(self) -> dict[str, Method]:
        """The transport's method table: the RPCs the SDK makes (others are UNIMPLEMENTED)."""

        def method(name, kind, request_type, response_type):
            return Method(kind, getattr(self, name), request_type.FromString, response_type.SerializeToString)

        table = {
            name: method(name, UNARY, getattr(svc, f"{name}Request"), getattr(svc, f"{name}Response"))
            for name in (
                "QueryRoute",
                "Heartbeat",
                "SendMessage",
                "QueryAssignment",
                "AckMessage",
                "ChangeInvisibleDuration",
                "ForwardMessageToDeadLetterQueue",
                "NotifyClientTermination",
                "EndTransaction",
                "RecallMessage",
                "SyncLiteSubscription",
            )
        }
        table["ReceiveMessage"] = method(
            "ReceiveMessage", SERVER_STREAM, svc.ReceiveMessageRequest, svc.ReceiveMessageResponse
        )
        table["Telemetry"] = Method(
            BIDI_STREAM, self.Telemetry, _telemetry_command, svc.TelemetryCommand.SerializeToString
        )
        return {f"/{SERVICE}/{name}": m for name, m in table.items()}

    def _advertised(self, requested: pb.Endpoints) -> pb.Endpoints:
        address = self.broker.config.advertised_address
        if address:
            return convert.endpoints(address)
        if requested.addresses:
            return requested
        return convert.endpoints(self.listen_address)

    @unary(svc.QueryRouteResponse)
    def QueryRoute(self, request, rpc):
        topic = self.broker.route(convert.resource_name(request.topic))
        where = self._advertised(request.endpoints)
        queues = convert.message_queues(topic, request.topic, self.broker.config.broker_name, where)
        return svc.QueryRouteResponse(status=convert.OK, message_queues=queues)

    @unary(svc.HeartbeatResponse)
    def Heartbeat(self, request, rpc):
        client_type = convert.CLIENT_TYPE_NAMES.get(request.client_type, "")
        self.broker.heartbeat(_client_id(rpc), client_type, convert.resource_name(request.group))
        return svc.HeartbeatResponse(status=convert.OK)

    @unary(svc.SendMessageResponse)
    async def SendMessage(self, request, rpc):
        if not request.messages:
            raise BrokerError(Code.BAD_REQUEST, "no message to send")
        publishes: list[Publish | BrokerError] = []
        for message in request.messages:
            try:
                publishes.append(convert.publish_from(message))
            except BrokerError as exc:
                publishes.append(exc)
        stored = iter(
            await self.broker.send_batch(
                [p for p in publishes if not isinstance(p, BrokerError)], lambda: _peer_host(rpc)
            )
        )  # the peer is looked up only when a record needs it
        response = svc.SendMessageResponse()
        entries = response.entries
        failed = 0
        for message, publish in zip(request.messages, publishes):
            result = publish if isinstance(publish, BrokerError) else next(stored)
            if isinstance(result, BrokerError):
                entry = entries.add(message_id=message.system_properties.message_id)
                entry.status.CopyFrom(convert.status(result.code, result.message))
                failed += 1
            else:
                entry = entries.add(
                    message_id=result.message_id,
                    offset=result.queue_offset,
                    transaction_id=result.transaction_id,
                    recall_handle=result.recall_handle,
                )
                entry.status.CopyFrom(convert.OK)
        _set_overall_status(response, failed > 0)
        return response

    @unary(svc.QueryAssignmentResponse)
    def QueryAssignment(self, request, rpc):
        broker = self.broker
        topic = broker.route(convert.resource_name(request.topic))
        group = convert.resource_name(request.group)
        validation.check_group_name(group, broker.config)
        fifo = broker.group(group).fifo
        if topic.perm & 4 == 0:
            raise BrokerError(Code.FORBIDDEN, f"topic {topic.name!r} is not readable")
        where = self._advertised(request.endpoints)
        # a FIFO group is assigned every queue (a receive loop each), others one queue id -1
        queues = convert.message_queues(topic, request.topic, broker.config.broker_name, where, None if fifo else [-1])
        return svc.QueryAssignmentResponse(
            status=convert.OK, assignments=[pb.Assignment(message_queue=q) for q in queues]
        )

    async def ReceiveMessage(self, request, rpc):
        """The responses of one receive: status, one per message, delivery timestamp (or a single
        status for an error).  If the stream breaks, what was not written comes back soon."""
        client_id = _client_id(rpc)
        try:
            _require(client_id)
            poll_ms = request.long_polling_timeout.ToMilliseconds() if request.HasField("long_polling_timeout") else 0
            if poll_ms > 0:
                poll_ms = max(0, min(poll_ms, int((rpc.time_remaining() - POLL_MARGIN_S) * 1000)))
            req = ReceiveRequest(
                group=convert.resource_name(request.group),
                topic=convert.resource_name(request.message_queue.topic),
                client_id=client_id,
                filter_type=convert.FILTER_TYPE_NAMES.get(request.filter_expression.type, "?"),
                filter_expression=request.filter_expression.expression or "*",
                batch_size=request.batch_size,
                invisible_ms=request.invisible_duration.ToMilliseconds(),
                auto_renew=request.auto_renew,
                poll_ms=poll_ms,
            )
            received = await self.broker.receive(req)
        except BrokerError as exc:
            return [svc.ReceiveMessageResponse(status=convert.status(exc.code, exc.message))]
        except Exception:
            log.exception("ReceiveMessage failed")
            return [svc.ReceiveMessageResponse(status=convert.status(Code.INTERNAL_ERROR, "internal error"))]
        done = svc.ReceiveMessageResponse()
        done.delivery_timestamp.FromMilliseconds(self.broker.clock())
        if not received:
            return [svc.ReceiveMessageResponse(status=convert.status(Code.MESSAGE_NOT_FOUND, "no new message")), done]

        def unwritten(count: int) -> None:
            count = min(count - 1, len(received))  # the delivery timestamp is the last response
            if count > 0:
                for queue, handles in _by_queue(
                    req.topic, [(r.queue_topic, r.receipt_handle) for r in received[-count:]]
                ):
                    self.broker.release(req.group, queue, handles)

        rpc.on_unwritten = unwritten
        namespace = request.message_queue.topic.resource_namespace
        now = self.broker.clock()
        responses = [_RECEIVE_OK]
        fill = convert.fill_delivered_message
        try:
            for r in received:
                response = svc.ReceiveMessageResponse()
                fill(
                    response.message,
                    r.record,
                    namespace,
                    r.receipt_handle,
                    r.delivery_attempt,
                    r.invisible_until - now,
                    lite.delivered_topic(r, "") if r.queue_topic else "",
                )
                responses.append(response)
        except Exception:
            unwritten(len(received) + 1)  # none will be written: release them all
            raise
        responses.append(done)
        return responses

    @unary(svc.AckMessageResponse)
    def AckMessage(self, request, rpc):
        if not request.entries:
            raise BrokerError(Code.BAD_REQUEST, "no entry to ack")
        group, topic = convert.resource_name(request.group), convert.resource_name(request.topic)
        failures: list = [None] * len(request.entries)
        entries_by_queue: dict[str, list[int]] = {}
        for i, entry in enumerate(request.entries):  # a lite message is acked on its lite topic's queue
            entries_by_queue.setdefault(lite.queue_of(topic, entry.lite_topic), []).append(i)
        for queue, indexes in entries_by_queue.items():
            results = self.broker.ack_many(group, queue, [request.entries[i].receipt_handle for i in indexes])
            for i, failure in zip(indexes, results):
                failures[i] = failure
        response = svc.AckMessageResponse()
        entries = response.entries
        for entry, failure in zip(request.entries, failures):
            result = entries.add(message_id=entry.message_id, receipt_handle=entry.receipt_handle)
            result.status.CopyFrom(convert.OK if failure is None else convert.status(failure.code, failure.message))
        _set_overall_status(response, any(failures))
        return response

    def ChangeInvisibleDuration(self, request, rpc):
        handle = request.receipt_handle
        try:
            _require(_client_id(rpc))
            topic = lite.queue_of(convert.resource_name(request.topic), request.lite_topic)
            handle = self.broker.change_invisible(
                convert.resource_name(request.group),
                topic,
                request.receipt_handle,
                request.invisible_duration.ToMilliseconds(),
            )
            result_status = convert.OK
        except BrokerError as exc:
            result_status = convert.status(exc.code, exc.message)
        except Exception:
            log.exception("ChangeInvisibleDuration failed")
            result_status = convert.status(Code.INTERNAL_ERROR, "internal error")
        return svc.ChangeInvisibleDurationResponse(status=result_status, receipt_handle=handle)

    @unary(svc.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(self, request, rpc):
        topic = lite.queue_of(convert.resource_name(request.topic), request.lite_topic)
        await self.broker.forward_to_dead_letter(convert.resource_name(request.group), topic, request.receipt_handle)
        return svc.ForwardMessageToDeadLetterQueueResponse(status=convert.OK)

    @unary(svc.NotifyClientTerminationResponse)
    def NotifyClientTermination(self, request, rpc):
        self.broker.client_terminated(_client_id(rpc))
        return svc.NotifyClientTerminationResponse(status=convert.OK)

    async def Telemetry(self, rpc):
        """Answers the client's settings; writes the broker's commands (transaction checks)."""
        client_id = _client_id(rpc)
        namespace = rpc.metadata_value(NAMESPACE_HEADER)  # the client's names in the commands
        commands = self.broker.telemetry_opened(client_id)
        closing = asyncio.ensure_future(self.closing.wait())
        next_command = None
        try:
            while True:
                read = rpc.read()
                while not read.done():
                    if next_command is None:
                        next_command = asyncio.ensure_future(commands.get())
                    await asyncio.wait((read, closing, next_command), return_when=asyncio.FIRST_COMPLETED)
                    if next_command.done():
                        await rpc.write(_command(next_command.result(), namespace))
                        next_command = None
                    elif closing.done():  # shutting down: end the stream, the client reconnects elsewhere
                        return
                command = read.result()
                if command is None:
                    return
                if command is _UNDECODABLE:  # answered, then the stream ends: what follows is suspect
                    await rpc.write(
                        svc.TelemetryCommand(
                            status=convert.status(Code.BAD_REQUEST, "the telemetry command cannot be decoded")
                        )
                    )
                    return
                if command.HasField("settings"):
                    await rpc.write(self._settings_reply(client_id, command.settings))
        finally:
            closing.cancel()
            if next_command is not None:
                next_command.cancel()
            self.broker.telemetry_closed(client_id, commands)

    def _settings_reply(self, client_id: str, settings: pb.Settings) -> svc.TelemetryCommand:
        try:
            _require(client_id)
            client_type = convert.CLIENT_TYPE_NAMES.get(settings.client_type, "")
            group = convert.resource_name(settings.subscription.group) if settings.HasField("subscription") else ""
            if settings.HasField("publishing"):
                topics = [convert.resource_name(t) for t in settings.publishing.topics]
            else:
                topics = [convert.resource_name(s.topic) for s in settings.subscription.subscriptions]
            fifo = settings.subscription.HasField("fifo") and settings.subscription.fifo
            server = self.broker.client_settings(client_id, client_type, group, topics, fifo)
            return svc.TelemetryCommand(status=convert.OK, settings=convert.server_settings(settings, server))
        except BrokerError as exc:
            return svc.TelemetryCommand(status=convert.status(exc.code, exc.message))

    @unary(svc.EndTransactionResponse)
    async def EndTransaction(self, request, rpc):
        resolution = convert.RESOLUTION_NAMES.get(request.resolution, "")
        await self.broker.end_transaction(
            convert.resource_name(request.topic), request.message_id, request.transaction_id, resolution
        )
        return svc.EndTransactionResponse(status=convert.OK)

    @unary(svc.RecallMessageResponse)
    async def RecallMessage(self, request, rpc):
        message_id = await self.broker.recall(convert.resource_name(request.topic), request.recall_handle)
        return svc.RecallMessageResponse(status=convert.OK, message_id=message_id)

    @unary(svc.SyncLiteSubscriptionResponse)
    def SyncLiteSubscription(self, request, rpc):
        action = convert.LITE_ACTIONS.get(request.action)
        if action is None:
            raise BrokerError(Code.BAD_REQUEST, f"unknown lite subscription action {request.action}")
        names = list(request.lite_topic_set)
        if action == lite.PARTIAL_ADD and rpc.metadata_value(LANGUAGE_HEADER) == "PYTHON":
            names = lite.python_partial_add(names)
        self.broker.lite.sync(
            _client_id(rpc),
            convert.resource_name(request.group),
            convert.resource_name(request.topic),
            action,
            names,
            request.version if request.HasField("version") else None,
            convert.offset_option(request),
        )
        return svc.SyncLiteSubscriptionResponse(status=convert.OK)


def _command(command, namespace: str) -> svc.TelemetryCommand:
    """The telemetry command for a broker's command to a client."""
    if isinstance(command, lite.UnsubscribeLite):
        return convert.unsubscribe_lite(command)
    return convert.recover_orphaned_transaction(command, namespace)


def _by_queue(topic: str, handles: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """(queue topic, receipt handle) pairs grouped by queue; "" is `topic`."""
    groups: dict[str, list[str]] = {}
    for queue, handle in handles:
        groups.setdefault(queue or topic, []).append(handle)
    return list(groups.items())
