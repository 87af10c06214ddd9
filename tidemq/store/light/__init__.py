"""Light message queues (RIP-28): multi-dispatch, and the key-value store that holds them."""

from .queues import LightQueues, is_light_queue

__all__ = ["LightQueues", "is_light_queue"]
