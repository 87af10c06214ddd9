"""Dispatch: building the ConsumeQueues and the key index from the commit log, in log order, by the
sequential `Dispatcher` (the reference) or the parallel one with worker processes (RIP-52)."""
