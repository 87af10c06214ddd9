"""The key index (RocketMQ's IndexService): its files and the dispatch sink that fills them."""
