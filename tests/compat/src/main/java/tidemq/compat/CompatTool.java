package tidemq.compat;

import com.alibaba.fastjson2.JSONArray;
import com.alibaba.fastjson2.JSONObject;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.rocketmq.client.QueryResult;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageAccessor;
import org.apache.rocketmq.common.message.MessageConst;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.protocol.subscription.SubscriptionGroupConfig;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

/**
 * The RocketMQ side of tidemq's compatibility tests: writes and reads through a real RocketMQ
 * 5.5.0 broker with the 4.x-style Java client and admin tools, printing one JSON object a line.
 *
 * <pre>
 *   produce NAMESRV BROKER_ADDR          create the test topics and group, send the scenario
 *   consume NAMESRV GROUP TOPIC COUNT    pull up to COUNT messages from the group's offsets, commit
 *   admin NAMESRV BROKER_ADDR [query...] topics, groups, runtime stats, then each query:
 *                                        uniq:TOPIC:ID  or  key:TOPIC:KEY  or  topic:TOPIC
 * </pre>
 */
public final class CompatTool {
    static final String TOPIC = "CompatTopic";
    static final String WIDE_TOPIC = "CompatWide";
    static final String FIFO_TOPIC = "CompatFifo";
    static final String LMQ_PARENT = "CompatParent";
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
            case "consume":
                consume(args[1], args[2], args[3], Integer.parseInt(args[4]));
                break;
            case "admin":
                admin(args[1], args[2], java.util.Arrays.copyOfRange(args, 3, args.length));
                break;
            default:
                throw new IllegalArgumentException("unknown command " + args[0]);
        }
    }

    static void emit(JSONObject line) {
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
        SubscriptionGroupConfig group = new SubscriptionGroupConfig();
        group.setGroupName(GROUP);
        group.setRetryMaxTimes(5);
        admin.createAndUpdateSubscriptionGroupConfig(brokerAddr, group);
        admin.shutdown();

        DefaultMQProducer producer = new DefaultMQProducer("compat_producer");
        producer.setNamesrvAddr(namesrv);
        producer.setInstanceName("compat-producer-" + System.nanoTime());
        producer.setSendMsgTimeout(10000);
        producer.start();
        waitForRoute(producer, TOPIC);
        waitForRoute(producer, WIDE_TOPIC);
        waitForRoute(producer, FIFO_TOPIC);
        waitForRoute(producer, LMQ_PARENT);
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
        producer.shutdown();
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
        long deadline = System.currentTimeMillis() + 30000;
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

    static String brokerName(DefaultMQAdminExt admin, String topic) throws Exception {
        return admin.examineTopicRouteInfo(topic).getBrokerDatas().get(0).getBrokerName();
    }
}
