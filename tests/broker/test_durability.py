"""DurableFutures: sends under sync flush wait for the fsync that covers them, share fsyncs, and
fail with FlushTimeoutError when the disk will not flush or the store closes first."""

import asyncio

import pytest

from tidemq.broker.durability import DurableFutures
from tidemq.store import FlushTimeoutError, Message, MessageStore, StoreConfig


def sync_store(directory, **kw) -> MessageStore:
    return MessageStore(directory, StoreConfig(segment_size=1 << 20, flush="sync", **kw))


def test_each_future_settles_after_an_fsync_covers_it_and_fsyncs_are_shared(tmp_path):
    store = sync_store(tmp_path)
    settled = []

    futures = set()

    async def putter(durable, i):
        for j in range(25):
            result, end = store.put_unflushed(Message(topic="d", body=b"%d-%d" % (i, j), queue_id=i % 4))
            future = durable.after(end)
            futures.add(future)
            await future
            assert store.group_commit.flushed >= end  # settled only once durable
            settled.append(result)

    requests = []
    request = store.group_commit.request

    def counted_request(end_offset, listener):
        requests.append(end_offset)
        return request(end_offset, listener)

    store.group_commit.request = counted_request

    async def scenario():
        durable = DurableFutures(store, asyncio.get_running_loop())
        await asyncio.wait_for(asyncio.gather(*(putter(durable, i) for i in range(32))), 30)

    try:
        asyncio.run(scenario())
        assert len(settled) == 800
        assert len({r.commit_log_offset for r in settled}) == 800
        assert store.group_commit.fsyncs < 800 / 4  # 32 putters share each fsync
        # one request stands for every wait until the fsync answers it: not one per send
        assert len(requests) <= 2 * store.group_commit.fsyncs + 1
        # every send waits on a future of its own (the sends between two fsyncs share the wait)
        assert len(futures) == 800
        assert store.wait_dispatched()
        assert sum(store.max_offset("d", q) for q in range(4)) == 800
    finally:
        store.close()


class _Rest:
    """The rest of a coroutine run by hand up to its first suspension, for a task to finish (as
    the gRPC transport runs handlers: those that need not wait are answered without a task)."""

    def __init__(self, coroutine, waiting) -> None:
        self.coroutine, self.waiting = coroutine, waiting

    def __await__(self):
        waiting = self.waiting
        while True:
            sent = yield waiting
            try:
                waiting = self.coroutine.send(sent)
            except StopIteration as stop:
                return stop.value


def test_sends_run_by_hand_to_their_first_wait_and_finished_by_tasks_all_succeed(tmp_path):
    store = sync_store(tmp_path)

    async def send(durable, i):
        result, end = store.put_unflushed(Message(topic="h", body=b"%d" % i))
        await durable.after(end)
        return result

    async def rest(coroutine, waiting):
        return await _Rest(coroutine, waiting)

    async def scenario():
        loop = asyncio.get_running_loop()
        durable = DurableFutures(store, loop)
        tasks = []
        for i in range(50):  # appended one after another while no fsync started: one group
            coroutine = send(durable, i)
            tasks.append(loop.create_task(rest(coroutine, coroutine.send(None))))
        return await asyncio.wait_for(asyncio.gather(*tasks), 30)

    try:
        results = asyncio.run(scenario())
        assert len({r.commit_log_offset for r in results}) == 50
        assert store.group_commit.flushed >= max(r.commit_log_offset + r.size for r in results)
    finally:
        store.close()


def test_a_send_after_an_fsync_started_does_not_join_the_group_before_it(tmp_path):
    # an fsync that started may not cover what is appended next: that send opens a new group,
    # so that the sends before it are settled by that fsync without waiting for the next
    store = sync_store(tmp_path)

    async def scenario():
        durable = DurableFutures(store, asyncio.get_running_loop())
        _, first_end = store.put_unflushed(Message(topic="g", body=b"first"))
        first = durable.after(first_end)
        store.group_commit.fsyncs_started += 1  # as the flush thread counts an fsync it starts
        _, second_end = store.put_unflushed(Message(topic="g", body=b"second"))
        second = durable.after(second_end)
        assert second is not first
        await asyncio.wait_for(asyncio.gather(first, second), 10)
        return second_end

    try:
        end = asyncio.run(scenario())
        assert store.group_commit.flushed >= end
    finally:
        store.close()


def test_a_batch_waits_once_for_its_last_byte(tmp_path):
    store = sync_store(tmp_path)

    async def scenario():
        durable = DurableFutures(store, asyncio.get_running_loop())
        results, end = store.put_unflushed([Message(topic="b", body=b"x%d" % i) for i in range(10)])
        assert end == results[-1].commit_log_offset + results[-1].size
        await asyncio.wait_for(durable.after(end), 10)
        return results, end

    try:
        results, end = asyncio.run(scenario())
        assert [r.queue_offset for r in results] == list(range(10))
        assert store.group_commit.flushed >= end
    finally:
        store.close()


def test_under_async_flush_the_future_is_settled_at_once(tmp_path):
    with MessageStore(tmp_path, StoreConfig(segment_size=1 << 20)) as store:

        async def scenario():
            durable = DurableFutures(store, asyncio.get_running_loop())
            result, end = store.put_unflushed(Message(topic="a", body=b"now"))
            future = durable.after(end)
            assert future.done()
            await future
            return result

        assert asyncio.run(scenario()).queue_offset == 0


def test_a_disk_that_will_not_flush_fails_the_wait_after_the_timeout(tmp_path):
    store = sync_store(tmp_path, sync_flush_timeout_ms=300)

    def failing_flush():
        raise OSError(5, "Input/output error")

    store.commit_log.flush = failing_flush  # the environment: every fsync fails

    async def scenario():
        durable = DurableFutures(store, asyncio.get_running_loop())
        result, end = store.put_unflushed(Message(topic="f", body=b"lost?"))
        with pytest.raises(FlushTimeoutError, match="Input/output error"):
            await asyncio.wait_for(durable.after(end), 10)
        return result

    try:
        result = asyncio.run(scenario())
        assert store.group_commit.flushed < result.commit_log_offset + result.size
    finally:
        del store.commit_log.flush
        store.close()


def test_waits_still_open_when_the_flusher_stops_fail_instead_of_hanging(tmp_path):
    store = sync_store(tmp_path, sync_flush_timeout_ms=60_000)

    def failing_flush():
        raise OSError(28, "No space left on device")

    store.commit_log.flush = failing_flush

    async def scenario():
        durable = DurableFutures(store, asyncio.get_running_loop())
        result, end = store.put_unflushed(Message(topic="c", body=b"pending"))
        future = durable.after(end)
        await asyncio.get_running_loop().run_in_executor(None, store.group_commit.stop)  # as closing does
        with pytest.raises(FlushTimeoutError, match="No space left"):
            await asyncio.wait_for(future, 10)
        # and a wait begun after the flusher stopped fails too
        result, end = store.put_unflushed(Message(topic="c", body=b"later"))
        with pytest.raises(FlushTimeoutError):
            await asyncio.wait_for(durable.after(end), 10)

    try:
        asyncio.run(scenario())
    finally:
        del store.commit_log.flush
        store.close()
