"""tidemq: a RocketMQ-compatible message broker and embedded message store."""

__version__ = "0.1.0"
