package tidemq.testclient;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientConfigurationBuilder;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.LitePushConsumer;
import org.apache.rocketmq.client.apis.consumer.MessageListener;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageBuilder;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.ProducerBuilder;
import org.apache.rocketmq.client.apis.producer.SendReceipt;
import org.apache.rocketmq.client.apis.producer.Transaction;
import org.apache.rocketmq.client.apis.producer.TransactionResolution;

/**
 * The official RocketMQ 5 Java client driven from the command line, for tidemq's tests.  The
 * same commands and output as tests/clients/go (see tests/clients/__init__.py):
 *
 * <pre>
 * send    --endpoint H:P --topic T [--count N] [--body TEXT ({i}: the index)] [--tag X] [--keys K1,K2]
 *         [--type NORMAL|FIFO|DELAY|PRIORITY|TRANSACTION|LITE] [--group MESSAGE_GROUP | --groups G]
 *         [--delay-ms D] [--priority P] [--lite-topic L] [--transaction commit|rollback|none]
 *         [--check commit|rollback|unknown] [--await-checks C] [--timeout-ms T]
 * receive --endpoint H:P --topic T --group G [--count N] [--simple | --push] [--filter TAG_EXPRESSION]
 *         [--await-ms A] [--invisible-ms I] [--timeout-ms T] [--no-ack] [--fail-every K] [--poison BODY]
 *         [--lite-topics L1,L2 (with --push: a lite push consumer of bind topic T)]
 * both:   [--tls default|on|off] (default: the client's own default, TLS on) [--namespace NS]
 * </pre>
 *
 * One JSON object a line on stdout: first {"event": "client", "language": "java", "tls": B} (B:
 * whether the client's configuration has TLS on), then {"event": "sent", ...} per message sent,
 * {"event": "received", ...} per message received, then {"event": "done", "count": N}.  Exit status 0 when
 * every message was sent or received, 3 when a receive ran out of time, 1 on an error (stderr).
 *
 * --groups G gives message i the message group "group-(i mod G)".  --await-checks C keeps the
 * producer open after its sends until its transaction checker has answered for C distinct messages
 * (a "checked" line per answer), within --timeout-ms.  --fail-every K fails the first delivery of every K-th distinct
 * message (push: the listener answers FAILURE; simple: its invisible duration is changed to 0),
 * its "received" line saying "failed": true; --poison BODY fails every delivery of a message with
 * that body; N counts the messages consumed.
 */
public final class Client {
    private final Map<String, String> options = new HashMap<>();
    private final ClientServiceProvider provider = ClientServiceProvider.loadService();
    private final Map<String, Boolean> seen = new HashMap<>();
    private final java.util.Set<String> checked = java.util.concurrent.ConcurrentHashMap.newKeySet();
    private final java.util.concurrent.Semaphore checks = new java.util.concurrent.Semaphore(0);

    private Client(String[] args, int from) {
        for (int i = from; i < args.length; i++) {
            String name = args[i];
            if (!name.startsWith("--")) {
                throw new IllegalArgumentException("not an option: " + name);
            }
            boolean flag = name.equals("--simple") || name.equals("--push") || name.equals("--no-ack");
            if (flag) {
                options.put(name.substring(2), "true");
            } else if (i + 1 < args.length) {
                options.put(name.substring(2), args[++i]);
            } else {
                throw new IllegalArgumentException(name + " needs a value");
            }
        }
    }

    public static void main(String[] args) {
        try {
            if (args.length == 0) {
                throw new IllegalArgumentException("usage: send|receive --endpoint HOST:PORT --topic T ...");
            }
            Client client = new Client(args, 1);
            int status;
            switch (args[0]) {
                case "send":
                    status = client.send();
                    break;
                case "receive":
                    status = client.receive();
                    break;
                default:
                    throw new IllegalArgumentException("unknown command " + args[0]);
            }
            System.out.flush();
            System.exit(status);
        } catch (Throwable e) {
            e.printStackTrace();
            System.exit(1);
        }
    }

    private String option(String name, String otherwise) {
        return options.getOrDefault(name, otherwise);
    }

    private String required(String name) {
        String value = options.get(name);
        if (value == null) {
            throw new IllegalArgumentException("--" + name + " is required");
        }
        return value;
    }

    private ClientConfiguration configuration() {
        ClientConfigurationBuilder builder = ClientConfiguration.newBuilder()
            .setEndpoints(required("endpoint"))
            .setRequestTimeout(Duration.ofMillis(Long.parseLong(option("request-timeout-ms", "5000"))));
        String tls = option("tls", "default");
        if (!tls.equals("default")) {
            builder.enableSsl(tls.equals("on"));
        }
        if (options.containsKey("namespace")) {
            builder.setNamespace(options.get("namespace"));
        }
        ClientConfiguration configuration = builder.build();
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("event", "client");
        line.put("language", "java");
        line.put("tls", configuration.isSslEnabled());
        emit(line);
        return configuration;
    }

    private int send() throws Exception {
        String topic = required("topic");
        String type = option("type", "NORMAL");
        int count = Integer.parseInt(option("count", "1"));
        ProducerBuilder builder = provider.newProducerBuilder()
            .setClientConfiguration(configuration()).setTopics(topic);
        if (type.equals("TRANSACTION")) {
            TransactionResolution answer = TransactionResolution.valueOf(option("check", "commit").toUpperCase());
            builder.setTransactionChecker(view -> {
                emit(view("checked", view));
                if (checked.add(view.getMessageId().toString())) {
                    checks.release();
                }
                return answer;
            });
        }
        try (Producer producer = builder.build()) {
            for (int i = 0; i < count; i++) {
                Message message = message(topic, type, i);
                SendReceipt receipt;
                if (type.equals("TRANSACTION")) {
                    Transaction transaction = producer.beginTransaction();
                    receipt = producer.send(message, transaction);
                    String ending = option("transaction", "commit");
                    if (ending.equals("commit")) {
                        transaction.commit();
                    } else if (ending.equals("rollback")) {
                        transaction.rollback();
                    }
                } else {
                    receipt = producer.send(message);
                }
                Map<String, Object> line = new LinkedHashMap<>();
                line.put("event", "sent");
                line.put("index", i);
                line.put("message_id", receipt.getMessageId().toString());
                line.put("topic", topic);
                line.put("body", body(i));
                emit(line);
            }
            int awaited = Integer.parseInt(option("await-checks", "0"));
            long wait = Long.parseLong(option("timeout-ms", "30000"));
            if (awaited > 0 && !checks.tryAcquire(awaited, wait, TimeUnit.MILLISECONDS)) {
                emit(done(count));
                return 3;
            }
        }
        emit(done(count));
        return 0;
    }

    /** Whether this delivery fails: a poison message's, or the first of every K-th distinct message. */
    private synchronized boolean fails(MessageView view) {
        if (options.containsKey("poison") && options.get("poison").equals(view("received", view).get("body"))) {
            return true;
        }
        int every = Integer.parseInt(option("fail-every", "0"));
        String id = view.getMessageId().toString();
        if (every <= 0 || seen.containsKey(id)) {
            return false;
        }
        boolean failing = (seen.size() + 1) % every == 0;
        seen.put(id, failing);
        return failing;
    }

    private static Map<String, Object> received(MessageView view, boolean failed) {
        Map<String, Object> line = view("received", view);
        line.put("received_at", System.currentTimeMillis());
        line.put("failed", failed);
        return line;
    }

    private String body(int index) {
        return option("body", "message-{i}").replace("{i}", Integer.toString(index));
    }

    private Message message(String topic, String type, int index) {
        MessageBuilder builder = provider.newMessageBuilder().setTopic(topic)
            .setBody(body(index).getBytes(StandardCharsets.UTF_8));
        if (options.containsKey("tag")) {
            builder.setTag(options.get("tag"));
        }
        if (options.containsKey("keys")) {
            builder.setKeys(options.get("keys").split(","));
        }
        if (options.containsKey("groups")) {
            builder.setMessageGroup("group-" + index % Integer.parseInt(options.get("groups")));
        } else if (type.equals("FIFO") || options.containsKey("group")) {
            builder.setMessageGroup(option("group", "group-0"));
        }
        if (type.equals("DELAY") || options.containsKey("delay-ms")) {
            builder.setDeliveryTimestamp(System.currentTimeMillis() + Long.parseLong(option("delay-ms", "1000")));
        }
        if (type.equals("PRIORITY") || options.containsKey("priority")) {
            builder.setPriority(Integer.parseInt(option("priority", "0")));
        }
        if (type.equals("LITE") || options.containsKey("lite-topic")) {
            builder.setLiteTopic(option("lite-topic", "lite-0"));
        }
        return builder.build();
    }

    /** A lite push consumer of bind topic {@code topic}, subscribed to --lite-topics. */
    private LitePushConsumer litePushConsumer(String topic, String group, MessageListener listener) throws Exception {
        LitePushConsumer lite = provider.newLitePushConsumerBuilder()
            .setClientConfiguration(configuration()).setConsumerGroup(group).bindTopic(topic)
            .setMessageListener(listener)
            .build();
        List<String> names = java.util.Arrays.asList(options.get("lite-topics").split(","));
        for (String name : names) {
            lite.subscribeLite(name);
        }
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("event", "subscribed");
        line.put("lite_topics", names);
        emit(line);
        return lite;
    }

    private int receive() throws Exception {
        String topic = required("topic");
        String group = required("group");
        int count = Integer.parseInt(option("count", "1"));
        Duration invisible = Duration.ofMillis(Long.parseLong(option("invisible-ms", "20000")));
        long giveUp = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(Long.parseLong(option("timeout-ms", "30000")));
        boolean ack = !options.containsKey("no-ack");
        Map<String, FilterExpression> subscription = new HashMap<>();
        subscription.put(topic, new FilterExpression(option("filter", "*"), FilterExpressionType.TAG));
        int received = 0;
        if (options.containsKey("push")) {
            LinkedBlockingQueue<Map<String, Object>> arrived = new LinkedBlockingQueue<>();
            MessageListener listener = view -> {
                boolean failed = fails(view);
                arrived.add(received(view, failed));
                return ack && !failed ? ConsumeResult.SUCCESS : ConsumeResult.FAILURE;
            };
            java.io.Closeable consumer = options.containsKey("lite-topics")
                ? litePushConsumer(topic, group, listener)
                : provider.newPushConsumerBuilder()
                    .setClientConfiguration(configuration()).setConsumerGroup(group)
                    .setSubscriptionExpressions(subscription)
                    .setMessageListener(listener)
                    .build();
            try {
                while (received < count) {
                    long left = giveUp - System.nanoTime();
                    Map<String, Object> line = left > 0 ? arrived.poll(left, TimeUnit.NANOSECONDS) : null;
                    if (line == null) {
                        break;
                    }
                    emit(line);
                    if (!(Boolean) line.get("failed")) {
                        received++;
                    }
                }
            } finally {
                consumer.close();
            }
        } else {
            try (SimpleConsumer consumer = provider.newSimpleConsumerBuilder()
                .setClientConfiguration(configuration()).setConsumerGroup(group)
                .setSubscriptionExpressions(subscription)
                .setAwaitDuration(Duration.ofMillis(Long.parseLong(option("await-ms", "2000"))))
                .build()) {
                while (received < count && System.nanoTime() < giveUp) {
                    List<MessageView> views;
                    try {
                        views = consumer.receive(Math.min(32, count - received), invisible);
                    } catch (Exception e) {
                        System.err.println("receive failed, retrying: " + e);
                        Thread.sleep(100);
                        continue;
                    }
                    for (MessageView view : views) {
                        boolean failed = fails(view);
                        emit(received(view, failed));
                        if (failed) {
                            consumer.changeInvisibleDuration(view, Duration.ZERO);
                            continue;
                        }
                        if (ack) {
                            consumer.ack(view);
                        }
                        received++;
                    }
                }
            }
        }
        emit(done(received));
        return received >= count ? 0 : 3;
    }

    private static Map<String, Object> done(int count) {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("event", "done");
        line.put("count", count);
        return line;
    }

    private static Map<String, Object> view(String event, MessageView view) {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("event", event);
        line.put("message_id", view.getMessageId().toString());
        line.put("topic", view.getTopic());
        ByteBuffer body = view.getBody().duplicate();
        byte[] bytes = new byte[body.remaining()];
        body.get(bytes);
        line.put("body", new String(bytes, StandardCharsets.UTF_8));
        line.put("tag", view.getTag().orElse(null));
        line.put("keys", new ArrayList<>(view.getKeys()));
        line.put("message_group", view.getMessageGroup().orElse(null));
        line.put("priority", view.getPriority().orElse(null));
        line.put("delivery_timestamp", view.getDeliveryTimestamp().orElse(null));
        line.put("delivery_attempt", view.getDeliveryAttempt());
        line.put("properties", new LinkedHashMap<>(view.getProperties()));
        line.put("lite_topic", view.getLiteTopic().orElse(null));
        return line;
    }

    private static synchronized void emit(Map<String, Object> line) {
        StringBuilder out = new StringBuilder();
        json(out, line);
        System.out.println(out);
        System.out.flush();
    }

    private static void json(StringBuilder out, Object value) {
        if (value == null) {
            out.append("null");
        } else if (value instanceof Number || value instanceof Boolean) {
            out.append(value);
        } else if (value instanceof Map) {
            out.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> entry : ((Map<?, ?>) value).entrySet()) {
                if (!first) {
                    out.append(", ");
                }
                first = false;
                json(out, entry.getKey().toString());
                out.append(": ");
                json(out, entry.getValue());
            }
            out.append('}');
        } else if (value instanceof Collection) {
            out.append('[');
            boolean first = true;
            for (Object item : (Collection<?>) value) {
                if (!first) {
                    out.append(", ");
                }
                first = false;
                json(out, item);
            }
            out.append(']');
        } else {
            out.append('"');
            for (char c : value.toString().toCharArray()) {
                if (c == '"' || c == '\\') {
                    out.append('\\').append(c);
                } else if (c < 0x20) {
                    out.append(String.format("\\u%04x", (int) c));
                } else {
                    out.append(c);
                }
            }
            out.append('"');
        }
    }
}
