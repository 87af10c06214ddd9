package tidemq.compat;

import com.alibaba.fastjson2.JSONArray;
import com.alibaba.fastjson2.JSONObject;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.QueryResult;
import com.google.common.hash.Hashing;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPullConsumer;
import org.apache.rocketmq.client.consumer.PullResult;
import org.apache.rocketmq.client.consumer.PopCallback;
import org.apache.rocketmq.client.consumer.PopResult;
import org.apache.rocketmq.client.consumer.PopStatus;
import org.apache.rocketmq.client.consumer.PullStatus;
import org.apache.rocketmq.client.impl.factory.MQClientInstance;
import org.apache.rocketmq.common.KeyBuilder;
import org.apache.rocketmq.common.constant.ConsumeInitMode;
import org.apache.rocketmq.common.filter.ExpressionType;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageAccessor;
import org.apache.rocketmq.common.message.MessageClientIDSetter;
import org.apache.rocketmq.common.message.MessageConst;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.protocol.header.PopMessageRequestHeader;
import org.apache.rocketmq.remoting.protocol.subscription.SubscriptionGroupConfig;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

/**
 * The RocketMQ side of tidemq's compatibility tests: writes and reads through a real RocketMQ
 * 5.5.0 broker with the 4.x-style Java client and admin tools, printing one JSON object a line.
 *
 * <pre>
 *   produce NAMESRV BROKER_ADDR          create the test topics and group, send the scenario
 *   append NAMESRV TOPIC COUNT           send COUNT more messages to an existing topic
 *   consume NAMESRV GROUP TOPIC COUNT    pull up to COUNT messages from the group's offsets, commit
 *   txconsume NAMESRV PGROUP GROUP TOPIC COUNT
 *                                        consume as above while a transaction producer of PGROUP
 *                                        answers every check-back COMMIT
 *   admin NAMESRV BROKER_ADDR [query...] topics, groups, runtime stats, then each query:
 *                                        uniq:TOPIC:ID  or  key:TOPIC:KEY  or  topic:TOPIC
 * </pre>
 */
public final class CompatTool {
    static final String TOPIC = "CompatTopic";
    static final String WIDE_TOPIC = "CompatWide";
    static final String FIFO_TOPIC = "CompatFifo";
    static final String LMQ_PARENT = "CompatParent";
    static final String TIMER_TOPIC = "CompatTimer";
    static final String TX_TOPIC = "CompatTx";
    static final String TX_PRODUCER = "compat_tx_producer";
    static final long HOUR_MS = 3600_000L;
    // a group (of the longest name allowed) whose pop retry topic is longer than 127 characters
    static final String POP_GROUP = "compat_" + "g".repeat(113);
    static final String GROUP = "compat_group";
    static final String[] TAGS = {"TagA", "TagB", "\u6807\u7b7e", "tag\uD834\uDD1E"};

    public static void main(String[] args) {
        try {
            run(args);
        } catch (Throwable e) {
            e.printStackTrace();
            System.exit(1);  // the clients' threads would keep the JVM alive
        }
        System.out.flush();
        System.exit(0);
    }

    static void run(String[] args) throws Exception {
        switch (args[0]) {
            case "produce":
                produce(args[1], args[2]);
                break;
            case "append":
                append(args[1], args[2], Integer.parseInt(args[3]));
                break;
            case "consume":
                consume(args[1], args[2], args[3], Integer.parseInt(args[4]));
                break;
            case "txconsume":
                txconsume(args[1], args[2], args[3], args[4], Integer.parseInt(args[5]));
                break;
            case "admin":
                admin(args[1], args[2], java.util.Arrays.copyOfRange(args, 3, args.length));
                break;
            default:
                throw new IllegalArgumentException("unknown command " + args[0]);
        }
    }

    static synchronized void emit(JSONObject line) {
        System.out.println(line.toJSONString());
    }

    static DefaultMQAdminExt startAdmin(String namesrv) throws Exception {
        DefaultMQAdminExt admin = new DefaultMQAdminExt(30000);  // a loaded CI machine
        admin.setNamesrvAddr(namesrv);
        admin.setInstanceName("compat-admin-" + System.nanoTime());
        admin.start();
        return admin;
    }

    static TopicConfig topic(String name, int queues, String messageType) {
        TopicConfig config = new TopicConfig(name, queues, queues, 6);
        Map<String, String> attributes = new HashMap<>();
        attributes.put("+message.type", messageType);
        config.setAttributes(attributes);
        return config;
    }

    static void produce(String namesrv, String brokerAddr) throws Exception {
        DefaultMQAdminExt admin = startAdmin(namesrv);
        admin.createAndUpdateTopicConfig(brokerAddr, topic(TOPIC, 4, "NORMAL"));
        admin.createAndUpdateTopicConfig(brokerAddr, topic(WIDE_TOPIC, 256, "NORMAL"));
        admin.createAndUpdateTopicConfig(brokerAddr, topic(FIFO_TOPIC, 2, "FIFO"));
        admin.createAndUpdateTopicConfig(brokerAddr, topic(LMQ_PARENT, 1, "NORMAL"));
        admin.createAndUpdateTopicConfig(brokerAddr, topic(TIMER_TOPIC, 2, "DELAY"));
        admin.createAndUpdateTopicConfig(brokerAddr, topic(TX_TOPIC, 2, "TRANSACTION"));
        SubscriptionGroupConfig group = new SubscriptionGroupConfig();
        group.setGroupName(GROUP);
        group.setRetryMaxTimes(5);
        admin.createAndUpdateSubscriptionGroupConfig(brokerAddr, group);
        admin.shutdown();

        DefaultMQProducer producer = started(new DefaultMQProducer("compat_producer"), namesrv);
        waitForRoute(producer, TOPIC);
        waitForRoute(producer, WIDE_TOPIC);
        waitForRoute(producer, FIFO_TOPIC);
        waitForRoute(producer, LMQ_PARENT);
        waitForRoute(producer, TIMER_TOPIC);
        // normal messages: tags (one non-BMP), several keys, user properties, bodies over the
        // 4 KiB compression threshold
        for (int i = 0; i < 40; i++) {
            String body = i % 5 == 0 ? "big body ".repeat(700) + i : "hello " + i;
            Message msg = new Message(TOPIC, TAGS[i % TAGS.length], body.getBytes(StandardCharsets.UTF_8));
            msg.setKeys(List.of("k" + i, "order-" + (i % 7)));
            msg.putUserProperty("color", i % 2 == 0 ? "blue" : "red");
            report("normal", msg, producer.send(msg));
        }
        // one batch
        List<Message> batch = new ArrayList<>();
        for (int i = 0; i < 10; i++) {
            Message msg = new Message(TOPIC, "batch", ("batch " + i).getBytes(StandardCharsets.UTF_8));
            msg.setKeys("b" + i);
            batch.add(msg);
        }
        SendResult batchResult = producer.send(batch);
        String[] ids = batchResult.getMsgId().split(",");
        for (int i = 0; i < batch.size(); i++) {
            JSONObject line = describe("batch", batch.get(i));
            line.put("msgId", ids[i]);
            line.put("queueId", batchResult.getMessageQueue().getQueueId());
            line.put("queueOffset", batchResult.getQueueOffset() + i);
            emit(line);
        }
        // delay levels long enough to stay in SCHEDULE_TOPIC_XXXX while the test runs
        int[] levels = {16, 17, 18, 18, 16};
        for (int i = 0; i < levels.length; i++) {
            Message msg = new Message(TOPIC, "delayed", ("delay " + i).getBytes(StandardCharsets.UTF_8));
            msg.setDelayTimeLevel(levels[i]);
            msg.setKeys("d" + i);
            report("delay", msg, producer.send(msg));
        }
        // light message queues: each message also goes to two LMQs
        for (int i = 0; i < 6; i++) {
            Message msg = new Message(LMQ_PARENT, "lmq", ("lmq " + i).getBytes(StandardCharsets.UTF_8));
            MessageAccessor.putProperty(msg, MessageConst.PROPERTY_INNER_MULTI_DISPATCH,
                i % 2 == 0 ? "%LMQ%compat_a,%LMQ%compat_b" : "%LMQ%compat_b");
            report("lmq", msg, producer.send(msg));
        }
        // a topic with 256 queues: one message on each, and a few more
        for (int i = 0; i < 260; i++) {
            Message msg = new Message(WIDE_TOPIC, "w", ("wide " + i).getBytes(StandardCharsets.UTF_8));
            report("wide", msg, producer.send(msg, new MessageQueue(WIDE_TOPIC, brokerName(producer, WIDE_TOPIC), i % 256)));
        }
        // timer messages, due in an hour or more: they stay in the timer wheel
        long base = System.currentTimeMillis() + HOUR_MS;
        for (int i = 0; i < 4; i++) {
            Message msg = new Message(TIMER_TOPIC, "timer", ("timer " + i).getBytes(StandardCharsets.UTF_8));
            msg.setKeys("t" + i);
            msg.setDeliverTimeMs(base + i * 1500L);
            JSONObject line = describe("timer", msg);
            SendResult result = producer.send(msg);
            line.put("msgId", result.getMsgId());
            line.put("deliverMs", base + i * 1500L);
            emit(line);
        }
        // FIFO: each message group on the queue RocketMQ's proxy picks for it (Guava's
        // consistent hash of the group's String.hashCode over the write queues)
        String[] messageGroups = {"order-a", "order-b", "order-c"};
        for (int i = 0; i < 12; i++) {
            String messageGroup = messageGroups[i % messageGroups.length];
            Message msg = new Message(FIFO_TOPIC, "fifo", (messageGroup + " " + i).getBytes(StandardCharsets.UTF_8));
            MessageAccessor.putProperty(msg, MessageConst.PROPERTY_SHARDING_KEY, messageGroup);
            int queueId = Hashing.consistentHash(messageGroup.hashCode(), 2);
            JSONObject line = describe("fifo", msg);
            SendResult result = producer.send(msg, new MessageQueue(FIFO_TOPIC, brokerName(producer, FIFO_TOPIC), queueId));
            line.put("msgId", result.getMsgId());
            line.put("messageGroup", messageGroup);
            line.put("queueId", result.getMessageQueue().getQueueId());
            line.put("queueOffset", result.getQueueOffset());
            emit(line);
        }
        popRetryOfLongGroup(namesrv, producer);
        producer.shutdown();
        transactions(namesrv);
    }

    /** A message popped by a group with a long name and never acked: once its invisible time
     * is over, RocketMQ's revive service stores it in the group's pop retry topic
     * (`%RETRY%group_topic`, longer than 127 characters), as a v2 record. */
    static void popRetryOfLongGroup(String namesrv, DefaultMQProducer producer) throws Exception {
        MessageQueue queue = producer.fetchPublishMessageQueues(TOPIC).get(0);
        MQClientInstance factory = producer.getDefaultMQProducerImpl().getMqClientFactory();
        String brokerAddr = factory.findBrokerAddressInPublish(queue.getBrokerName());
        PopMessageRequestHeader header = new PopMessageRequestHeader();
        header.setConsumerGroup(POP_GROUP);
        header.setTopic(TOPIC);
        header.setQueueId(queue.getQueueId());
        header.setMaxMsgNums(1);
        header.setInvisibleTime(1000);
        header.setPollTime(1000);
        header.setBornTime(System.currentTimeMillis());
        header.setInitMode(ConsumeInitMode.MIN);
        header.setExpType(ExpressionType.TAG);
        header.setExp("*");
        CompletableFuture<PopResult> popped = new CompletableFuture<>();
        factory.getMQClientAPIImpl().popMessageAsync(queue.getBrokerName(), brokerAddr, header, 10000, new PopCallback() {
            @Override
            public void onSuccess(PopResult popResult) {
                popped.complete(popResult);
            }

            @Override
            public void onException(Throwable e) {
                popped.completeExceptionally(e);
            }
        });
        PopResult result = popped.get(30, TimeUnit.SECONDS);
        if (result.getPopStatus() != PopStatus.FOUND) {
            throw new IllegalStateException("the pop found nothing: " + result);
        }
        String popId = result.getMsgFoundList().get(0).getMsgId();
        String retryTopic = KeyBuilder.buildPopRetryTopic(TOPIC, POP_GROUP, false);
        DefaultMQPullConsumer reader = new DefaultMQPullConsumer("compat_retry_reader");
        reader.setNamesrvAddr(namesrv);
        reader.setInstanceName("compat-retry-reader-" + System.nanoTime());
        reader.start();
        MessageQueue retryQueue = new MessageQueue(retryTopic, queue.getBrokerName(), 0);
        long deadline = System.currentTimeMillis() + 120000;
        while (true) {
            try {
                PullResult pulled = reader.pull(retryQueue, "*", 0, 1);
                if (pulled.getPullStatus() == PullStatus.FOUND) {
                    MessageExt retried = pulled.getMsgFoundList().get(0);
                    JSONObject line = new JSONObject();
                    line.put("kind", "retry");
                    line.put("topic", retried.getTopic());
                    line.put("msgId", retried.getMsgId());
                    line.put("poppedId", popId);
                    emit(line);
                    break;
                }
            } catch (Exception e) {
                // the retry topic does not exist before the first revive
            }
            if (System.currentTimeMillis() > deadline) {
                throw new IllegalStateException("the retry of " + popId + " did not arrive in " + retryTopic);
            }
            Thread.sleep(200);
        }
        reader.shutdown();
    }

    /** Committed, rolled-back and open (UNKNOW, and UNKNOW again when checked) transactions. */
    static void transactions(String namesrv) throws Exception {
        String[] outcomes = {"commit", "rollback", "open"};
        TransactionMQProducer producer = new TransactionMQProducer(TX_PRODUCER);
        producer.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                switch ((String) arg) {
                    case "commit":
                        return LocalTransactionState.COMMIT_MESSAGE;
                    case "rollback":
                        return LocalTransactionState.ROLLBACK_MESSAGE;
                    default:
                        return LocalTransactionState.UNKNOW;
                }
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                return LocalTransactionState.UNKNOW;
            }
        });
        started(producer, namesrv);
        waitForRoute(producer, TX_TOPIC);
        for (int i = 0; i < 6; i++) {
            String outcome = outcomes[i % outcomes.length];
            Message msg = new Message(TX_TOPIC, "tx", ("tx " + outcome + " " + i).getBytes(StandardCharsets.UTF_8));
            msg.setKeys("x" + i);
            TransactionSendResult result = producer.sendMessageInTransaction(msg, outcome);
            JSONObject line = describe("tx-" + outcome, msg);
            line.put("msgId", result.getMsgId());
            line.put("transactionId", result.getTransactionId());
            line.put("state", result.getLocalTransactionState().name());
            emit(line);
        }
        producer.shutdown();
    }

    static void append(String namesrv, String topic, int count) throws Exception {
        DefaultMQProducer producer = started(new DefaultMQProducer("compat_appender"), namesrv);
        waitForRoute(producer, topic);
        for (int i = 0; i < count; i++) {
            Message msg = new Message(topic, "appended", ("appended by RocketMQ " + i).getBytes(StandardCharsets.UTF_8));
            msg.setKeys("ra" + i);
            report("append", msg, producer.send(msg));
        }
        producer.shutdown();
    }

    static void txconsume(String namesrv, String producerGroup, String group, String topic, int count) throws Exception {
        TransactionMQProducer producer = new TransactionMQProducer(producerGroup);
        producer.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                return LocalTransactionState.UNKNOW;
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                JSONObject line = new JSONObject();
                line.put("checked", MessageClientIDSetter.getUniqID(msg));
                line.put("transactionId", msg.getTransactionId());
                emit(line);
                return LocalTransactionState.COMMIT_MESSAGE;
            }
        });
        started(producer, namesrv);
        // a producer that has sent nothing knows no broker: route it to the topic's broker and
        // heartbeat there, so that the broker has a channel to check back through
        MQClientInstance factory = producer.getDefaultMQProducerImpl().getMqClientFactory();
        factory.updateTopicRouteInfoFromNameServer(topic);
        factory.sendHeartbeatToAllBrokerWithLock();
        try {
            consume(namesrv, group, topic, count);
        } finally {
            producer.shutdown();
        }
    }

    /** `producer`, on the name server, started. */
    static <P extends DefaultMQProducer> P started(P producer, String namesrv) throws Exception {
        producer.setNamesrvAddr(namesrv);
        producer.setInstanceName(producer.getProducerGroup() + "-" + System.nanoTime());
        producer.setSendMsgTimeout(10000);
        producer.start();
        return producer;
    }

    static String brokerName(DefaultMQProducer producer, String topic) throws Exception {
        return producer.fetchPublishMessageQueues(topic).get(0).getBrokerName();
    }

    static void waitForRoute(DefaultMQProducer producer, String topic) throws Exception {
        for (int attempt = 0; ; attempt++) {
            try {
                if (!producer.fetchPublishMessageQueues(topic).isEmpty()) {
                    return;
                }
            } catch (Exception e) {
                if (attempt > 100) {
                    throw e;
                }
            }
            Thread.sleep(200);
        }
    }

    static JSONObject describe(String kind, Message msg) {
        JSONObject line = new JSONObject();
        line.put("kind", kind);
        line.put("topic", msg.getTopic());
        line.put("tags", msg.getTags());
        line.put("keys", msg.getKeys());
        line.put("body", new String(msg.getBody(), StandardCharsets.UTF_8));
        return line;
    }

    static void report(String kind, Message msg, SendResult result) {
        JSONObject line = describe(kind, msg);
        line.put("msgId", result.getMsgId());
        line.put("offsetMsgId", result.getOffsetMsgId());
        line.put("queueId", result.getMessageQueue().getQueueId());
        line.put("queueOffset", result.getQueueOffset());
        emit(line);
    }

    static void consume(String namesrv, String group, String topic, int count) throws Exception {
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(group);
        consumer.setNamesrvAddr(namesrv);
        consumer.setInstanceName("compat-consumer-" + System.nanoTime());
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setAutoCommit(false);
        consumer.setPollTimeoutMillis(1000);
        consumer.subscribe(topic, "*");
        consumer.start();
        int received = 0;
        long deadline = System.currentTimeMillis() + 60000;
        int idle = 0;
        while (received < count && System.currentTimeMillis() < deadline && idle < 8) {
            List<MessageExt> batch = consumer.poll();
            if (batch.isEmpty()) {
                idle += received > 0 ? 1 : 0;
                continue;
            }
            idle = 0;
            for (MessageExt msg : batch) {
                JSONObject line = new JSONObject();
                line.put("msgId", msg.getMsgId());
                line.put("topic", msg.getTopic());
                line.put("queueId", msg.getQueueId());
                line.put("queueOffset", msg.getQueueOffset());
                line.put("tags", msg.getTags());
                line.put("keys", msg.getKeys());
                line.put("body", new String(msg.getBody(), StandardCharsets.UTF_8));
                line.put("storeTimestamp", msg.getStoreTimestamp());
                line.put("properties", msg.getProperties());
                emit(line);
                received++;
            }
            consumer.commitSync();
        }
        consumer.commitSync();
        consumer.shutdown();
    }

    static void admin(String namesrv, String brokerAddr, String[] queries) throws Exception {
        DefaultMQAdminExt admin = startAdmin(namesrv);
        waitForRegistration(admin, brokerAddr);
        JSONObject summary = new JSONObject();
        summary.put("topics", new JSONArray(admin.fetchAllTopicList().getTopicList()));
        summary.put("groups", new JSONArray(admin.getAllSubscriptionGroup(brokerAddr, 5000).getSubscriptionGroupTable().keySet()));
        summary.put("runtime", admin.fetchBrokerRuntimeStats(brokerAddr).getTable());
        emit(summary);
        for (String query : queries) {
            String[] parts = query.split(":", 3);
            JSONObject line = new JSONObject();
            line.put("query", query);
            JSONArray found = new JSONArray();
            if (parts[0].equals("topic")) {
                TopicConfig config = admin.examineTopicConfig(brokerAddr, parts[1]);
                line.put("readQueueNums", config.getReadQueueNums());
                line.put("writeQueueNums", config.getWriteQueueNums());
                line.put("attributes", config.getAttributes());
                JSONObject maxOffsets = new JSONObject();
                for (int q = 0; q < config.getReadQueueNums(); q++) {
                    maxOffsets.put(String.valueOf(q), admin.maxOffset(new MessageQueue(parts[1], brokerName(admin, parts[1]), q)));
                }
                line.put("maxOffsets", maxOffsets);
            } else {
                QueryResult result = parts[0].equals("uniq")
                    ? admin.queryMessageByUniqKey(null, parts[1], parts[2], 32, 0, Long.MAX_VALUE)
                    : admin.queryMessage(null, parts[1], parts[2], 32, 0, Long.MAX_VALUE);
                for (MessageExt msg : result.getMessageList()) {
                    found.add(new String(msg.getBody(), StandardCharsets.UTF_8));
                }
                line.put("found", found);
            }
            emit(line);
        }
        admin.shutdown();
    }

    /** Until the name server lists the broker at brokerAddr (it registers after it boots). */
    static void waitForRegistration(DefaultMQAdminExt admin, String brokerAddr) throws Exception {
        long deadline = System.currentTimeMillis() + 120000;
        while (admin.examineBrokerClusterInfo().getBrokerAddrTable().values().stream()
                .noneMatch(broker -> broker.getBrokerAddrs().containsValue(brokerAddr))) {
            if (System.currentTimeMillis() > deadline) {
                throw new IllegalStateException("the name server does not list the broker at " + brokerAddr);
            }
            Thread.sleep(200);
        }
    }

    static String brokerName(DefaultMQAdminExt admin, String topic) throws Exception {
        return admin.examineTopicRouteInfo(topic).getBrokerDatas().get(0).getBrokerName();
    }
}
