"""How many files a process may keep mapped: Python's `mmap.mmap` keeps a duplicate of the file
descriptor for as long as the mapping lives, so every mapped ConsumeQueue file holds one open file.
A store with more queues than the open-file limit (often a soft limit of 1,024) would otherwise
stop dispatching with EMFILE ("Too many open files") and could not even be closed.

- `raise_limit()` lifts this process's soft RLIMIT_NOFILE to its hard limit, as servers do at
  start (`tidemq serve` and the dispatch worker processes; an embedding application keeps its
  own limit).
- `mapping_budget(share)` is how many queue-file mappings a cache of them keeps: its share of
  what the soft limit leaves after a reserve for segments, index files, pipes and sockets, and at
  most 30,000 (`vm.max_map_count` is 65,530 by default).  A cache whose mappings hold no
  descriptor (`_queue_file.Mapping`: `descriptors=False`) is bounded by the map count alone: its
  share of the 30,000.  The store process has two such caches:
  its ConsumeQueues' files (`CONSUME_QUEUE_SHARE`: a queue cycled through with more queues than
  mappings would map again on every visit) and the batch builder that dispatches small backlogs
  inline (`INLINE_BUILDER_SHARE`: such a backlog names few queues); a dispatch worker has one.
  Mappings past a budget are dropped and made again when used.
"""

from __future__ import annotations

import logging
from types import ModuleType

resource: ModuleType | None
try:
    import resource
except ImportError:  # not a POSIX system: no limit to read or raise
    resource = None

log = logging.getLogger(__name__)

RESERVE = 256  # descriptors left for everything that is not a queue-file mapping
MAX_MAPPINGS = 30_000
MIN_MAPPINGS = 16
CONSUME_QUEUE_SHARE = 0.8
INLINE_BUILDER_SHARE = 0.1


def raise_limit() -> int:
    """Raise the soft open-file limit to the hard one; returns the soft limit in force."""
    if resource is None:
        return 1 << 20
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            log.info("open-file limit raised from %d to %d", soft, hard)
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, exc)
    return soft


def mapping_budget(share: float, descriptors: bool = True) -> int:
    """How many queue-file mappings a cache holding `share` of this process's open files may
    keep under its present soft limit; of its mappings, when they hold no file descriptor
    (`descriptors` False)."""
    if not descriptors:
        return max(MIN_MAPPINGS, int(MAX_MAPPINGS * share))
    if resource is None:
        return MAX_MAPPINGS
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_MAPPINGS
    return max(MIN_MAPPINGS, min(MAX_MAPPINGS, int((soft - RESERVE) * share)))
