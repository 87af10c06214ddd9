"""The commit log: its segments, the append encoder, flush policies, the checkpoint and the
warming of pages ahead of the appends."""
