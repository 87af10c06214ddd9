"""The ConsumeQueues: one queue's index of its messages in the commit log, the set of every
queue, and the budget of their files' mappings."""
