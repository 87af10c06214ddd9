"""Broker options; names follow RocketMQ's BrokerConfig / ProxyConfig where one exists."""

from __future__ import annotations

from dataclasses import dataclass, field

from .clock import Clock, WallClock

# RocketMQ's default customized backoff for push consumers (messageDelayLevel 3 onward), in ms.
DEFAULT_RETRY_BACKOFF_MS = [
    1_000,
    5_000,
    10_000,
    30_000,
    60_000,
    120_000,
    180_000,
    240_000,
    300_000,
    360_000,
    420_000,
    480_000,
    540_000,
    600_000,
    1_200_000,
    1_800_000,
    3_600_000,
    7_200_000,
]


@dataclass
class BrokerConfig:
    auto_create_topic_enable: bool = True  # autoCreateTopicEnable
    auto_create_subscription_group: bool = True  # autoCreateSubscriptionGroup
    default_topic_queue_nums: int = 8  # defaultTopicQueueNums
    broker_name: str = "tidemq"  # brokerName
    max_message_size: int = 4 * 1024 * 1024  # maxMessageSize
    max_user_property_count: int = 128  # maxUserPropertyNum
    max_user_property_bytes: int = 16 * 1024  # maxUserPropertySize
    max_topic_length: int = 127  # maxTopicLength (gRPC proxy)
    max_group_length: int = 120  # maxConsumerGroupLength
    max_message_group_bytes: int = 64  # maxMessageGroupSize
    min_invisible_time_ms: int = 10_000  # minInvisibleTimeMillsOfReceive
    max_invisible_time_ms: int = 12 * 3600 * 1000  # maxInvisibleTimeMills
    max_batch_size: int = 32  # maxMsgNums of a pop
    long_polling_timeout_ms: int = 20_000  # grpcClientConsumerLongPollingTimeoutMillis (push consumers)
    auto_renew_invisible_time_ms: int = 60_000  # defaultInvisibleTimeMills
    renew_ahead_ms: int = 10_000  # renewAheadTimeMillis
    renew_interval_ms: int = 5_000  # renewSchedulePeriodMillis
    renew_max_ms: int = 3 * 3600 * 1000  # renewMaxTimeMillis
    offline_invisible_time_ms: int = 1_000
    client_expire_ms: int = 120_000  # channelExpiredTimeout
    timer_max_delay_sec: int = 86_400  # timerMaxDelaySec: how far ahead a delivery time may be
    producer_send_attempts: int = 3  # backoff_policy.max_attempts sent to producers
    transaction_timeout_ms: int = 6_000  # transactionTimeOut: a half message's immunity from checks
    transaction_check_max: int = 15  # transactionCheckMax: checks before it is dropped
    transaction_check_interval_ms: int = 30_000  # transactionCheckInterval
    # share of a priority topic's pops, in percent, that serve a level's due redeliveries before its
    # fresh messages; 0: a redelivery ranks just below the fresh messages of its level
    priority_retry_first_percent: int = 0  # popFromRetryProbabilityForPriority
    lite_subscription_quota: int = 1200  # lite topics one lite consumer may subscribe (liteSubClientQuota)
    max_lite_topic_size: int = 64  # characters of a lite topic name (maxLiteTopicSize)
    lite_topic_quota: int = 10_000_000  # lite topics of one bind topic (maxLiteTopicCount)
    # (client, lite topic) pairs the broker holds at most (maxLiteSubscriptionCount)
    max_lite_subscription_count: int = 100_000
    # PARTIAL_ADD SyncLiteSubscription requests a second, all clients together (maxSyncLiteSubscriptionRate)
    max_sync_lite_subscription_rate: float = 5000.0
    advertised_address: str = ""  # grpc endpoint advertised in routes; "" echoes the client's access point
    # the one clock of deadlines, long polling and timers (clock.py)
    clock: Clock = field(default_factory=WallClock, repr=False)
    # `reached(step)` is called at each step of light-queue expiry (lite_expiry.STEPS): a test's
    # fault object stops the process there; None in service
    expiry_faults: object | None = field(default=None, repr=False)
