"""The on-disk formats as pure codecs over bytes: the commit-log record, its properties, the
columnar decode dispatch and recovery use, and the units of special queues.  No files, no state."""
