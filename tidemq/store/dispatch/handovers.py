"""The batches whose builder handed units over to other workers, waiting for them to be written
(the coordinator's bookkeeping; see coordinator).

A worker building a batch packs the units of another worker's queues it did not write into a
`UnitsHandover` per owner.  The coordinator forwards each, unopened, to its owner, who writes the
units (before its next build, or between decoding a batch and writing it) and answers
`UnitsWritten`.  A batch's answer is complete when its builder has answered and every owner it
handed units to has written them; until then it waits here.
"""

from __future__ import annotations

from collections.abc import Callable

from .messages import BatchResult


class Handovers:
    """`forward(owner, batch id, payload)` sends units handed over to worker `owner`: True if it
    was sent (its answer is awaited), False if they were written at once."""

    def __init__(self, forward: Callable[[int, int, bytes], bool]) -> None:
        self._forward = forward
        # batch id -> the owners (worker numbers) still to write the units it handed over, from its
        # first answer until it is processed at the head or dropped
        self._unwritten: dict[int, set[int]] = {}
        self._built: dict[int, BatchResult] = {}  # answered, waiting for its handed-over units

    def hand_over(self, result: BatchResult) -> bool:
        """Forward the units a batch's builder handed over to their owners; True when none is
        left to write (else the answer waits here).  A batch built again (its builder died) hands
        over the same units: only its first answer's are forwarded, and an owner that dies
        before writing them is sent them again by the coordinator."""
        batch_id = result.batch_id
        unwritten = self._unwritten.get(batch_id)
        if unwritten is None:
            unwritten = self._unwritten[batch_id] = set()
            for owner, payload in result.handovers:
                if self._forward(owner, batch_id, payload):
                    unwritten.add(owner)
        result.handovers = ()
        if unwritten:
            self._built[batch_id] = result
            return False
        return True

    def written(self, batch_id: int, owner: int) -> BatchResult | None:
        """Worker `owner` wrote the units batch `batch_id` handed it: the batch's answer if that
        was the last of them."""
        unwritten = self._unwritten.get(batch_id)
        if unwritten is None:
            return None  # processed, or dropped
        unwritten.discard(owner)
        if not unwritten:
            return self._built.pop(batch_id, None)
        return None

    def rebuilding(self, batch_id: int) -> None:
        """The batch is built again (its builder died holding its index entries): its answer
        waiting here is void; its handovers stay forwarded."""
        self._built.pop(batch_id, None)

    def processed(self, batch_id: int) -> None:
        """The batch was processed at the head."""
        self._unwritten.pop(batch_id, None)

    def clear(self) -> None:
        """Every outstanding batch was dropped."""
        self._unwritten.clear()
        self._built.clear()
