"""The broker: messaging semantics over the store (send, pop receive, ack, change invisible time,
retries, dead letters, long polling, auto-renew).  asyncio, no protobuf.

Ownership: everything here runs on one event loop (`start(loop)`), so the in-flight table, the
metadata tables and the sessions need no locks.  A pop (read units, read records, record the
deliveries, journal them) never awaits in the middle, so two receives of one group never see the
same entry.  Sending lives in `publishing.Publisher`, FIFO groups' message-group chains in
`fifo.py`, transactions in `transactions.py`; the dispatch thread reaches the loop only through
`call_soon_threadsafe` (arrival notifications)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

from ..store import Message, MessageStore
from . import bodies, clock, fifo, lite, timers, validation
from .codes import BrokerError, Code, disk_refused, log_failure
from .config import BrokerConfig
from .consumer_offsets import ConsumerOffsets, adopt_offsets, consumed_offsets
from .filters import MATCH_ALL, Filter, parse_filter
from .long_polling import LongPolling
from .metadata import DLQ_PREFIX, GroupConfig, Metadata, TopicConfig, dead_letter_topic
from .pop_journal import JournalWriteError, PopJournal, delivery_fields
from .pop_state import Delivery, Subscription
from .priority import PriorityPop
from .publishing import PeerHost, Publisher
from .sessions import ServerSettings, Sessions
from .timers import TimerService
from .transactions import Transactions
from .types import LITE, PRIORITY, TRANSACTION, Publish, Received, ReceiveRequest, SendResult

log = logging.getLogger(__name__)

PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
_SCAN_LIMIT = 1024  # consume-queue units one pop examines per queue at most (tag filters skip)
REVIVE_INTERVAL_MS = 500  # how often due last attempts are moved to the dead-letter queue unasked


class Broker:
    def __init__(self, store: MessageStore, config: BrokerConfig | None = None) -> None:
        self.store = store
        self.config = config or BrokerConfig()
        self.clock = self.config.clock
        self.metadata = Metadata(store.directory / "config")
        self.journal = PopJournal(store.directory / "pop")
        self.subscriptions, replayed_generation = self.journal.replay()
        # consumed offsets as RocketMQ keeps them: ahead of the journal if another broker
        # consumed this store since (see consumer_offsets)
        self.consumer_offsets = ConsumerOffsets(store.directory / "config")
        adopt_offsets(self.subscriptions, self.consumer_offsets.offsets())
        # handle generations never repeat, not even across restarts with nothing in flight
        self._generation = max(replayed_generation, self.clock() * 1000)
        self.journal.open(self.subscriptions.values())
        # subscriptions holding FIFO entries: released at their first pop if the group is not FIFO
        self._held = {key for key, sub in self.subscriptions.items() if fifo.has_held(sub)}
        self.sessions = Sessions(self.config.client_expire_ms)
        self.long_polling = LongPolling(self.clock)
        self._pop_start: dict[tuple[str, str], int] = {}  # first queue of the next pop per group and topic
        self._wake_timers: dict[str, tuple[int, clock.Timer]] = {}
        self._tasks: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scan_incomplete = False  # set by a pop that stopped at _SCAN_LIMIT with entries left
        self._valid_groups: set[str] = set()  # names that passed validation (hot path: every ack)
        self._valid_topics: set[str] = set()
        self._filters: dict[tuple[str, str], Filter] = {}  # parsed filter expressions
        self.stats = dict.fromkeys(("sent", "delivered", "redelivered", "acked", "dead_lettered", "auto_renewals"), 0)
        self.publisher = Publisher(store, self.config, self.topic, self.stats)
        self.transactions = self.publisher.transactions = Transactions(
            store, self.config, self.sessions, self.publisher.put
        )
        self._daemons: set[asyncio.Task] = set()  # background loops that run until close
        self.priority = PriorityPop(self.config.priority_retry_first_percent)
        self.timers = TimerService(store, store.directory / "config", self.clock, self.publisher.put)
        self._timer_task: asyncio.Task | None = None
        self.lite = self.publisher.lite = lite.Lite(self)
        # (group, topic) pairs whose progress changed since consumerOffset.json was last written
        self._offsets_changed: dict[tuple[str, str], None] = dict.fromkeys(self.subscriptions)
        self.journal.listener = self._progress_changed

    # -- life -----------------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.store.subscribe(self._on_arrival)
        self.store.drive_light_queue_expiry()  # the lite maintenance round runs it (lite.expire_queues)
        self.store.wait_dispatched()  # the half and op queues are read whole
        self.transactions.rebuild()
        self._maintenance = self._spawn(self._maintenance_loop())
        self._revive = self._spawn(self._revive_loop())
        self._daemons.update((self._maintenance, self._revive, self._spawn(self._transaction_check_loop())))
        self.store.subscribe(self.timers.listener(loop))
        self._timer_task = asyncio.ensure_future(self.timers.run(self._flush_store))

    def _on_arrival(self, changes: dict) -> None:  # dispatch thread
        loop = self._loop
        if loop is not None and not loop.is_closed():
            topics = {topic for topic, _ in changes}
            try:
                loop.call_soon_threadsafe(self.lite.wake, topics)
            except RuntimeError:
                pass  # the loop closed between the check and the call

    async def _maintenance_loop(self) -> None:
        while True:
            await clock.sleep(self.clock, self.config.renew_interval_ms)
            try:
                self.renew(self.clock())
                self.journal.sync()
                self.save_consumer_offsets()
                if self.journal.needs_compaction():
                    self.journal.compact(self.subscriptions.values())
                self.lite.maintain(self.clock())
                self.sessions.expire(self.clock())
            except Exception as exc:
                log_failure(log, "broker maintenance failed", exc)

    async def _transaction_check_loop(self) -> None:
        while True:
            await clock.sleep(self.clock, self.config.transaction_check_interval_ms)
            try:
                await self.transactions.check(self.clock())
            except Exception:
                log.exception("transaction check failed")

    async def _revive_loop(self) -> None:
        while True:
            await clock.sleep(self.clock, REVIVE_INTERVAL_MS)
            try:
                self.revive(self.clock())
            except Exception:
                log.exception("moving due last attempts to the dead-letter queue failed")

    def _spawn(self, coroutine) -> asyncio.Task:
        task = self._loop.create_task(coroutine) if self._loop is not None else asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def settle(self) -> None:
        """Wait for background moves (dead letters) started so far to finish."""
        while True:
            pending = [t for t in self._tasks if t not in self._daemons and not t.done()]
            if not pending:
                return
            await asyncio.wait(pending)

    def stop_polling(self) -> None:
        """Answer every waiting receive now; later receives do not wait (shutdown, step 1)."""
        self.long_polling.close()

    async def close(self) -> None:
        """Cancel background work and make the journal durable (shutdown, after the server
        finished its calls).  The store is closed by its owner."""
        self.stop_polling()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        for _, timer in self._wake_timers.values():
            timer.cancel()
        await self._stop_timers()
        self.journal.close()
        self.lite.close()
        self.save_consumer_offsets()

    def _progress_changed(self, group: str, topic: str) -> None:  # the pop journal's listener
        self._offsets_changed[(group, topic)] = None
        self.lite.progress_changed(group, topic)

    def save_consumer_offsets(self) -> None:
        """Write the consumed offsets that changed since the last save to consumerOffset.json
        (those of key-value light queues go to the light-queue tables: `Lite.commit_offsets`)."""
        changed, self._offsets_changed = self._offsets_changed, {}
        subs = (self.subscriptions.get(key) for key in self.lite.file_offsets(changed))
        self.consumer_offsets.update(consumed_offsets(sub for sub in subs if sub is not None))

    async def _stop_timers(self) -> None:
        """Stop releasing, make the releases durable and checkpoint them (a clean stop)."""
        if self._timer_task is not None:
            self._timer_task.cancel()
            try:
                await self._timer_task
            except (asyncio.CancelledError, Exception):
                pass
        try:
            self.store.flush()
            self.timers.checkpoint()
        except Exception as exc:
            log_failure(log, "could not checkpoint the timers; releases since the last checkpoint repeat", exc)

    async def _flush_store(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.store.flush)

    async def recall(self, topic: str, handle: str) -> str:
        return await timers.recall(self, topic, handle)

    # -- metadata -------------------------------------------------------------------------------

    def topic(self, name: str, create: bool = True) -> TopicConfig:
        topic = self.metadata.topics.get(name)
        if topic is not None:
            return topic
        if lite.is_lmq(name):  # a light queue: no metadata behind it
            return lite.light_queue_config(name)
        if name.startswith(DLQ_PREFIX):
            return self.metadata.put_topic(TopicConfig(name, queue_nums=1))
        if create and self.config.auto_create_topic_enable:
            log.info("auto-creating topic %s with %d queues", name, self.config.default_topic_queue_nums)
            return self.metadata.put_topic(TopicConfig(name, queue_nums=self.config.default_topic_queue_nums))
        raise BrokerError(Code.TOPIC_NOT_FOUND, f"topic {name!r} does not exist")

    def group(self, name: str, create: bool = True) -> GroupConfig:
        group = self.metadata.groups.get(name)
        if group is not None:
            return group
        if create and self.config.auto_create_subscription_group:
            log.info("auto-creating consumer group %s", name)
            return self.metadata.put_group(GroupConfig(name))
        raise BrokerError(Code.CONSUMER_GROUP_NOT_FOUND, f"consumer group {name!r} does not exist")

    def route(self, topic_name: str) -> TopicConfig:
        self._check_topic(topic_name)
        return self.topic(topic_name)

    # -- clients --------------------------------------------------------------------------------

    def client_settings(
        self, client_id: str, client_type: str, group: str, topics: list[str], fifo_requested: bool = False
    ) -> ServerSettings:
        """`fifo_requested`: the client's settings ask for FIFO consumption, which makes its
        group FIFO (a group has one order mode for all its consumers)."""
        session = self.sessions.touch(client_id, self.clock())
        session.client_type, session.group, session.topics = client_type, group, topics
        group_config = self.group(group) if group else None
        if client_type in lite.LITE_CONSUMER_TYPES and group_config is not None and topics:
            self.lite.bind(group_config, topics[0])
        if fifo_requested and group_config is not None and not group_config.fifo:
            log.info("consumer group %s made FIFO: client %s asked for it", group, client_id)
            group_config.fifo = True
            self.metadata.put_group(group_config)
        return ServerSettings(
            max_body_size=self.config.max_message_size,
            validate_message_type=True,
            send_attempts=self.config.producer_send_attempts,
            max_delivery_attempts=group_config.max_delivery_attempts if group_config else 17,
            retry_backoff_ms=tuple(group_config.retry_backoff_ms) if group_config else (),
            long_polling_timeout_ms=self.config.long_polling_timeout_ms,
            fifo=group_config.fifo if group_config else False,
            lite_subscription_quota=self.config.lite_subscription_quota,
            max_lite_topic_size=self.config.max_lite_topic_size,
        )

    def heartbeat(self, client_id: str, client_type: str, group: str) -> None:
        if group:
            self._check_group(group)
            self.group(group)
        session = self.sessions.touch(client_id, self.clock())
        if client_type:
            session.client_type = client_type
        if group:
            session.group = group

    def telemetry_opened(self, client_id: str) -> asyncio.Queue:
        """Returns the queue of commands (transaction checks) to write on the stream."""
        self.sessions.touch(client_id, self.clock()).telemetry_streams += 1
        return self.transactions.attach(client_id)

    def telemetry_closed(self, client_id: str, commands: asyncio.Queue | None = None) -> None:
        if commands is not None:
            self.transactions.detach(client_id, commands)
        session = self.sessions.clients.get(client_id)
        if session is not None:
            session.telemetry_streams = max(0, session.telemetry_streams - 1)

    def client_terminated(self, client_id: str) -> None:
        """The client said goodbye: its auto-renewed messages become visible in a second, and its
        waiting receives are answered."""
        now = self.clock()
        self.sessions.terminate(client_id, now)
        self.long_polling.notify_client(client_id)
        self.lite.client_gone(client_id)
        for sub in self.subscriptions.values():
            for q in sub.queues.values():
                for d in list(q.in_flight.values()):
                    if d.renew_owner == client_id:
                        try:
                            self._set_invisible(sub, d, now + self.config.offline_invisible_time_ms, d.generation, "")
                        except BrokerError:
                            return  # logged; the renewal stops and they come back at their deadline

    # -- send -----------------------------------------------------------------------------------

    async def send(self, msg: Publish, peer_host: PeerHost = "127.0.0.1") -> SendResult:
        (result,) = await self.send_batch([msg], peer_host)
        if isinstance(result, BrokerError):
            raise result
        return result

    async def send_batch(
        self, messages: list[Publish], peer_host: PeerHost = "127.0.0.1"
    ) -> list[SendResult | BrokerError]:
        results = await self.publisher.send_batch(messages, peer_host)
        for i, msg in enumerate(messages):
            result = results[i]
            if msg.message_type == TRANSACTION and isinstance(result, SendResult):
                results[i] = self.transactions.prepared(msg, result)
        return results

    async def end_transaction(self, topic: str, message_id: str, transaction_id: str, resolution: str) -> None:
        """EndTransaction: `resolution` COMMIT or ROLLBACK (anything else leaves it open)."""
        self._check_topic(topic)
        await self.transactions.end(topic, message_id, transaction_id, resolution)

    # -- receive --------------------------------------------------------------------------------

    def check_receive(self, req: ReceiveRequest) -> tuple[TopicConfig, GroupConfig, Filter]:
        self._check_names(req.group, req.topic)
        if not req.auto_renew:
            validation.check_invisible_time(req.invisible_ms, self.config)
        tag_filter = self._filters.get((req.filter_type, req.filter_expression))
        if tag_filter is None:
            tag_filter = parse_filter(req.filter_type, req.filter_expression)
            if len(self._filters) < 10_000:
                self._filters[(req.filter_type, req.filter_expression)] = tag_filter
        if req.poll_ms < 0:
            raise BrokerError(Code.ILLEGAL_POLLING_TIME, f"long polling timeout {req.poll_ms} ms is negative")
        if req.batch_size <= 0:
            raise BrokerError(Code.BAD_REQUEST, f"batch size {req.batch_size} must be positive")
        return self.topic(req.topic), self.group(req.group), tag_filter

    async def receive(self, req: ReceiveRequest) -> list[Received]:
        topic, group, tag_filter = self.check_receive(req)
        pop: Callable[[], list[Received]]
        next_due: Callable[[], int | None]
        if (topic.message_type == LITE and not lite.is_lmq(topic.name)) or group.lite_bind_topic:
            self.lite.check_receive(group, topic)  # a lite consumer's light queues, held on its bind topic
            pop = functools.partial(self.lite.pop, req, topic, group, tag_filter)
            next_due = functools.partial(self.lite.next_due, req.client_id, topic, group)
        else:
            sub = self._subscription(group.name, topic.name)
            pop = functools.partial(self.pop, sub, topic, group, tag_filter, req)
            next_due = sub.next_due
        give_up = self.clock() + req.poll_ms
        while True:
            self._scan_incomplete = False
            got = pop()
            if got or self.long_polling.closed or self.sessions.terminated(req.client_id):
                return got
            remaining = give_up - self.clock()
            if remaining <= 0:
                return got  # a scan cut short resumes at the next receive: its cursors moved on
            if self._scan_incomplete:  # filtered-out entries left to skip: go on, letting others run
                await asyncio.sleep(0)
                continue
            due = next_due()
            if due is not None:
                remaining = min(remaining, max(0, due - self.clock()))
            await self.long_polling.wait(topic.name, req.client_id, remaining)

    def move_cursor(self, group: str, topic: str, queue_id: int, cursor: int) -> None:
        """Move the group's read cursor on a queue forward to `cursor` (journaled first)."""
        try:
            self.journal.append(["p", group, topic, [[queue_id, cursor]], []])
        except JournalWriteError as exc:
            raise _journal_refused(exc, "the new read position") from None
        self._subscription(group, topic).advance(queue_id, cursor)

    def _subscription(self, group: str, topic: str) -> Subscription:
        sub = self.subscriptions.get((group, topic))
        if sub is None:
            sub = self.subscriptions[(group, topic)] = Subscription(group, topic)
        return sub

    def pop(
        self, sub: Subscription, topic: TopicConfig, group: GroupConfig, tag_filter: Filter, req: ReceiveRequest
    ) -> list[Received]:
        """Deliver up to `req.batch_size` messages: due redeliveries first, then new entries from
        every queue of the topic (a priority topic: level by level, highest first, as
        `priority.PriorityPop` orders them).  Synchronous: nothing else runs on the loop meanwhile."""
        now = self.clock()
        fifo_state = self._fifo_state(sub, group)
        batch = min(req.batch_size, self.config.max_batch_size)
        invisible = self.config.auto_renew_invisible_time_ms if req.auto_renew else req.invisible_ms
        owner = req.client_id if req.auto_renew else ""
        until = now + invisible
        out: list[Received] = []
        journal_deliveries: list = []
        cursors: list = []
        dead: list[Delivery] = []
        cursors_before = {qid: q.cursor for qid, q in sub.queues.items()}  # to undo the pop
        replaced: list[Delivery] = []  # the due deliveries this pop delivers again

        def redeliver(d: Delivery) -> None:
            self._redeliver(sub, d, group, tag_filter, now, until, owner, out, journal_deliveries, dead, replaced)

        if topic.message_type == PRIORITY and fifo_state is None:

            def pop_level(qid: int) -> bool:
                self._pop_new(
                    sub, topic, tag_filter, batch, now, until, owner, out, journal_deliveries, cursors, (qid,)
                )
                return self._scan_incomplete

            self.priority.fill(sub, topic.queue_nums, batch, out, now, redeliver, pop_level)
        else:
            self.priority.hand_back(sub)
            while len(out) < batch:
                d = sub.pop_due(now)
                if d is None:
                    break
                redeliver(d)
            if len(out) < batch:
                self._pop_new(
                    sub,
                    topic,
                    tag_filter,
                    batch,
                    now,
                    until,
                    owner,
                    out,
                    journal_deliveries,
                    cursors,
                    fifo_state=fifo_state,
                )
        if journal_deliveries or cursors:
            try:
                self.journal.append(["p", sub.group, sub.topic, cursors, journal_deliveries])
            except JournalWriteError as exc:
                _undo_pop(sub, out, replaced, cursors_before)
                if dead:
                    self._move_to_dead_letters(sub, group, dead, now)
                raise _journal_refused(exc, "the deliveries") from None
            if journal_deliveries:
                self._schedule_wake(sub.topic, until)
        self.stats["delivered"] += len(out)
        if lite.is_lmq(sub.topic):
            for received in out:
                received.queue_topic = sub.topic
        if dead:
            self._move_to_dead_letters(sub, group, dead, now)
        return out

    def _fifo_state(self, sub: Subscription, group: GroupConfig) -> fifo.FifoState | None:
        """The message-group chains of a FIFO group's subscription (rebuilt at its first pop);
        None for other groups, whose held entries (left from FIFO days) are released."""
        if group.fifo:
            return sub.fifo or fifo.FifoState.rebuild(sub, self.store, self._waker(sub.topic))
        if sub.fifo is not None or (sub.group, sub.topic) in self._held:
            self._held.discard((sub.group, sub.topic))
            fifo.FifoState(sub, self._waker(sub.topic)).release_all()
        return None

    def _waker(self, topic: str):
        return lambda: self.lite.wake((topic,))

    def _redeliver(self, sub, d, group, tag_filter, now, until, owner, out, journal_deliveries, dead, replaced) -> None:
        """Deliver the due delivery `d` again, drop it (gone, or filtered out), or mark it for the
        dead-letter queue (past the group's max attempts); `replaced` gets the deliveries it replaces."""
        rec = self.store.read_record(d.commit_log_offset)
        if rec is None or (
            (rec.queue_offset != d.queue_offset or rec.topic != sub.topic) and not lite.is_lmq(sub.topic)
        ):
            sub.finish(d.queue_id, d.queue_offset)  # gone (retention): nothing to deliver
            self._journal_done(sub, d)
            return
        if not tag_filter.accepts(rec):
            sub.finish(d.queue_id, d.queue_offset)  # the group no longer wants it
            self._journal_done(sub, d)
            return
        if d.attempt >= group.max_delivery_attempts:
            dead.append(d)
            return
        self._generation += 1
        again = Delivery(
            d.queue_id, d.queue_offset, d.commit_log_offset, d.attempt + 1, until, self._generation, owner, now
        )
        sub.deliver(again)
        replaced.append(d)
        journal_deliveries.append(delivery_fields(again))
        out.append(Received(rec, again.handle, again.attempt, until))
        self.stats["redelivered"] += d.attempt > 0  # attempt 0: a released FIFO entry

    def _journal_done(self, sub: Subscription, d: Delivery) -> None:
        """Journal that an entry is done (no record, no match, dead-lettered); if the disk refuses,
        it is done in memory only, and after a restart it comes back and is handled again."""
        try:
            self.journal.append(["f", sub.group, sub.topic, d.queue_id, d.queue_offset])
        except JournalWriteError as exc:
            log.warning(
                "%s; %s/%d@%d is done, journaled at the next snapshot", exc, sub.topic, d.queue_id, d.queue_offset
            )

    def revive(self, now: int) -> int:
        """Move every delivery on its last attempt whose deadline has passed to the dead-letter
        queue, whether or not a consumer of its group receives (RocketMQ's revive service);
        returns how many moves started."""
        moved = 0
        for sub in self.subscriptions.values():
            group = self.metadata.groups.get(sub.group)
            if group is None:
                continue
            sub.set_dead_after(group.max_delivery_attempts)
            dead = sub.pop_due_last(now)
            if dead:
                self._move_to_dead_letters(sub, group, dead, now)
                moved += len(dead)
        return moved

    def _move_to_dead_letters(self, sub: Subscription, group: GroupConfig, dead: list[Delivery], now: int) -> None:
        for d in dead:  # hidden while in transit to the dead-letter queue (not journaled)
            self._generation += 1
            sub.set_invisible(d.queue_id, d.queue_offset, now + 60_000, self._generation, "")
        self._spawn(self._dead_letter(sub, group, dead))

    def _pop_new(
        self,
        sub,
        topic,
        tag_filter,
        batch,
        now,
        until,
        owner,
        out,
        journal_deliveries,
        cursors,
        queue_ids=None,
        fifo_state=None,
    ) -> None:
        """New entries of the topic's queues: `queue_ids` in that order, or every queue, starting
        one further at each pop.  `fifo_state`: a FIFO group's
        message-group chains, which hold back later messages of a busy message group."""
        store = self.store
        withdrawn = self.publisher.withdrawn
        if queue_ids is None:
            n = topic.queue_nums
            start = self._pop_start.get((sub.group, topic.name), 0) % n
            self._pop_start[(sub.group, topic.name)] = (start + 1) % n
            queue_ids = [(start + i) % n for i in range(n)]
        for qid in queue_ids:
            if len(out) >= batch:
                break
            q = sub.queues.get(qid)
            low = store.min_offset(topic.name, qid)
            if q is None:
                q = sub.queue(qid, low)
            cursor = max(q.cursor, low)
            high = store.max_offset(topic.name, qid)
            scanned = 0
            while (
                cursor < high
                and len(out) < batch
                and scanned < _SCAN_LIMIT
                and (fifo_state is None or fifo_state.has_room(qid))
            ):
                want = batch - len(out) if tag_filter is MATCH_ALL else min(64, high - cursor)
                units = store.read_units(topic.name, qid, cursor, want)
                if not units:
                    break
                for unit in units:
                    scanned += 1
                    cursor = unit.queue_offset + 1
                    if not tag_filter.matches_code(unit.tags_code):
                        continue
                    if withdrawn and unit.commit_log_offset in withdrawn:
                        continue  # its send was reported failed
                    rec = store.read_unit(unit)
                    if rec is None or not tag_filter.accepts(rec):
                        continue
                    self._generation += 1
                    if fifo_state is not None and not fifo_state.admit(qid, unit.queue_offset, rec):
                        d = Delivery(
                            qid, unit.queue_offset, unit.commit_log_offset, 0, fifo.HELD, self._generation, "", now
                        )
                        sub.deliver(d)  # behind an earlier message of its message group
                        journal_deliveries.append(delivery_fields(d))
                        if not fifo_state.has_room(qid):
                            break
                        continue
                    d = Delivery(qid, unit.queue_offset, unit.commit_log_offset, 1, until, self._generation, owner, now)
                    sub.deliver(d)
                    journal_deliveries.append(delivery_fields(d))
                    out.append(Received(rec, d.handle, 1, until))
                    if len(out) >= batch:
                        break
            if scanned >= _SCAN_LIMIT and cursor < high:
                self._scan_incomplete = True
            if cursor > q.cursor:
                sub.advance(qid, cursor)
                cursors.append([qid, cursor])

    def _schedule_wake(self, topic: str, due: int) -> None:
        """Wake the topic's waiting receivers when `due` passes, so redeliveries are not held
        back until a long poll ends.  One timer per topic, for its earliest deadline."""
        if self._loop is None:
            return
        current = self._wake_timers.get(topic)
        if current is not None and current[0] <= due:
            return
        if current is not None:
            current[1].cancel()
        self._wake_timers[topic] = (due, self.clock.call_later(due - self.clock(), lambda: self._wake_topic(topic)))

    def _wake_topic(self, topic: str) -> None:
        self._wake_timers.pop(topic, None)
        self.lite.wake((topic,))

    # -- ack, change invisible time, dead letters --------------------------------------------------

    def _check_group(self, group: str) -> None:
        if group not in self._valid_groups:
            validation.check_group_name(group, self.config)
            if len(self._valid_groups) < 100_000:
                self._valid_groups.add(group)

    def _check_names(self, group: str, topic: str) -> None:
        self._check_group(group)
        self._check_topic(topic)

    def _check_topic(self, topic: str) -> None:
        if topic not in self._valid_topics:
            if lite.is_lmq(topic):
                lite.check_lmq_name(topic, self.config)
            else:
                validation.check_topic_name(topic, self.config)
            if len(self._valid_topics) < 100_000:
                self._valid_topics.add(topic)

    def _delivery(self, group: str, topic: str, handle: str) -> tuple[Subscription, Delivery]:
        self._check_names(group, topic)
        sub = self.subscriptions.get((group, topic))
        d = sub.lookup(handle, self.clock()) if sub is not None else None
        if sub is None or d is None:
            raise BrokerError(Code.INVALID_RECEIPT_HANDLE, "receipt handle is unknown, superseded or expired")
        return sub, d

    def ack(self, group: str, topic: str, handle: str) -> None:
        (error,) = self.ack_many(group, topic, [handle])
        if error is not None:
            raise error

    def ack_many(self, group: str, topic: str, handles: list[str]) -> list[BrokerError | None]:
        """Ack several deliveries with one journal line; per handle None or why it failed."""
        self._check_names(group, topic)
        sub = self.subscriptions.get((group, topic))
        if sub is None:
            return [
                BrokerError(Code.INVALID_RECEIPT_HANDLE, "receipt handle is unknown, superseded or expired")
                for _ in handles
            ]
        now = self.clock()
        results: list[BrokerError | None] = []
        done: dict[tuple[int, int], int] = {}  # (queue id, offset) -> index in results
        for handle in handles:
            d = sub.lookup(handle, now)
            if d is None or (d.queue_id, d.queue_offset) in done:
                results.append(
                    BrokerError(Code.INVALID_RECEIPT_HANDLE, "receipt handle is unknown, superseded or expired")
                )
                continue
            done[(d.queue_id, d.queue_offset)] = len(results)
            results.append(None)
        if done:
            try:  # journaled before the table changes: a refused line changes nothing
                self.journal.append(["F", group, topic, [list(key) for key in done]])
            except JournalWriteError as exc:
                error = _journal_refused(exc, "the acks")
                return [error if result is None else result for result in results]
            for qid, offset in done:
                sub.finish(qid, offset)
            self.stats["acked"] += len(done)
        return results

    def change_invisible(self, group: str, topic: str, handle: str, invisible_ms: int) -> str:
        """A new deadline `invisible_ms` from now; returns the new receipt handle."""
        if not 0 <= invisible_ms <= self.config.max_invisible_time_ms:
            raise BrokerError(
                Code.ILLEGAL_INVISIBLE_TIME,
                f"invisible time {invisible_ms} ms outside [0, {self.config.max_invisible_time_ms}] ms",
            )
        sub, d = self._delivery(group, topic, handle)
        self._generation += 1
        until = self.clock() + invisible_ms
        self._set_invisible(sub, d, until, self._generation, "")
        return d.handle

    def release(self, group: str, topic: str, handles: list[str]) -> None:
        """Deliveries the client never got (the stream broke): visible again in a second."""
        sub = self.subscriptions.get((group, topic))
        if sub is None:
            return
        now = self.clock()
        for handle in handles:
            d = sub.lookup(handle, now)
            if d is not None:
                try:
                    self._set_invisible(sub, d, now + self.config.offline_invisible_time_ms, d.generation, "")
                except BrokerError:
                    return  # logged; they come back at their own deadline

    def _set_invisible(self, sub: Subscription, d: Delivery, until: int, generation: int, owner: str) -> None:
        """Raises BrokerError, with nothing changed, if the journal cannot record it."""
        try:
            self.journal.append(["i", sub.group, sub.topic, d.queue_id, d.queue_offset, until, generation, owner])
        except JournalWriteError as exc:
            raise _journal_refused(exc, "the new invisible time") from None
        sub.set_invisible(d.queue_id, d.queue_offset, until, generation, owner)
        self._schedule_wake(sub.topic, until)

    async def forward_to_dead_letter(self, group: str, topic: str, handle: str) -> None:
        sub, d = self._delivery(group, topic, handle)
        await self._dead_letter(sub, self.group(group), [d])

    async def _dead_letter(self, sub: Subscription, group: GroupConfig, deliveries: list[Delivery]) -> None:
        dlq = self.topic(dead_letter_topic(group.name))
        for d in deliveries:
            rec = self.store.read_record(d.commit_log_offset)
            if rec is not None:
                properties = dict(rec.properties)
                properties.setdefault(PROPERTY_RETRY_TOPIC, rec.topic)
                properties.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, rec.msg_id)
                properties[PROPERTY_MAX_RECONSUME_TIMES] = str(group.retry_max_times)
                properties.pop(lite.PROPERTY_MULTI_DISPATCH, None)  # the copy goes to the DLQ only
                properties.pop(lite.PROPERTY_MULTI_QUEUE_OFFSET, None)
                try:
                    await self.publisher.put(
                        [
                            Message(
                                topic=dlq.name,
                                body=rec.body_bytes,
                                queue_id=0,
                                properties=properties,
                                flag=rec.flag,
                                sysflag=rec.sysflag & bodies.BODY_FLAGS,
                                born_timestamp=rec.born_timestamp,
                                born_host=rec.born_host,
                                reconsume_times=d.attempt,
                            )
                        ]
                    )
                except BrokerError as exc:
                    log.error(
                        "could not move %s/%d@%d to %s (%s); it stays in flight and is retried",
                        rec.topic,
                        d.queue_id,
                        d.queue_offset,
                        dlq.name,
                        exc.message,
                    )
                    continue
                log.info(
                    "moved %s/%d@%d to %s after %d delivery attempts",
                    rec.topic,
                    d.queue_id,
                    d.queue_offset,
                    dlq.name,
                    d.attempt,
                )
                self.stats["dead_lettered"] += 1
            if sub.finish(d.queue_id, d.queue_offset) is not None:
                self._journal_done(sub, d)

    # -- auto-renew -----------------------------------------------------------------------------

    def renew(self, now: int) -> int:
        """Extend auto-renewed deliveries close to their deadline while their client is alive;
        make them visible in a second when it is gone.  Returns how many changed."""
        cfg = self.config
        changed = 0
        for sub in self.subscriptions.values():
            for q in sub.queues.values():
                for d in list(q.in_flight.values()):
                    if not d.renew_owner or d.invisible_until - now >= cfg.renew_ahead_ms:
                        continue
                    if not self.sessions.alive(d.renew_owner, now):
                        self._set_invisible(sub, d, now + cfg.offline_invisible_time_ms, d.generation, "")
                    elif now - d.first_popped >= cfg.renew_max_ms:
                        self._set_invisible(sub, d, d.invisible_until, d.generation, "")
                    else:
                        self._set_invisible(sub, d, now + cfg.auto_renew_invisible_time_ms, d.generation, d.renew_owner)
                        self.stats["auto_renewals"] += 1
                    changed += 1
        return changed


def _journal_refused(exc: JournalWriteError, what: str) -> BrokerError:
    """What a client is told when the pop journal could not record its call (the environment:
    the broker's disk is full or failing); nothing of the call took effect."""
    log.error("%s: %s not recorded", exc, what)
    return disk_refused(exc, what)


def _undo_pop(sub: Subscription, out: list[Received], replaced: list[Delivery], cursors_before: dict[int, int]) -> None:
    """Take back the deliveries of a pop whose journal line the disk refused: the redelivered
    ones are due again as they were, the new ones unread."""
    for received in out:
        qid, offset, _ = (int(part) for part in received.receipt_handle.split("."))
        sub.finish(qid, offset)
    for d in replaced:
        sub.deliver(d)
    for qid in list(sub.queues):
        if qid in cursors_before:
            sub.queues[qid].cursor = cursors_before[qid]
        elif not sub.queues[qid].in_flight:
            del sub.queues[qid]
