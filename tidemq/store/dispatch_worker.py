"""Entry point of a parallel-dispatch worker process (see parallel_dispatch):

    python -m tidemq.store.dispatch_worker READ_FD WRITE_FD CONSUMEQUEUE_DIR UNITS_PER_FILE INDEX(0|1) OWNER OWNERS

It reads the file sizes of the queues whose files are not of the default size (a pickled dict),
then pickled `BatchTask`s and the `UnitsHandover`s of the queues it owns (worker OWNER of OWNERS)
from READ_FD, and answers `BatchResult`s and `UnitsWritten` on WRITE_FD until it reads None or the
pipe closes (its coordinator is gone)."""

import sys

from tidemq.store.batch_builder import _Channel, _worker_main

if __name__ == "__main__":
    read_fd, write_fd, root, units, index, owner, owners = sys.argv[1:8]
    _worker_main(_Channel(int(read_fd), int(write_fd)), root, int(units), index == "1", int(owner), int(owners))
