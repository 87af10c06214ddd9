"""Entry point of a parallel-dispatch worker process (see worker_process):

    python -P -m tidemq.store.dispatch.worker_entry READ_FD WRITE_FD CONSUMEQUEUE_DIR UNITS_PER_FILE INDEX(0|1) OWNER OWNERS

Nothing in tidemq imports this module, so `-m` runs it once."""

import sys

from tidemq.store.dispatch.messages import Channel
from tidemq.store.dispatch.workers import worker_main

if __name__ == "__main__":
    read_fd, write_fd, root, units, index, owner, owners = sys.argv[1:8]
    worker_main(Channel(int(read_fd), int(write_fd)), root, int(units), index == "1", int(owner), int(owners))
