// The official RocketMQ 5 Go client driven from the command line, for tidemq's tests.  The same
// commands and output as tests/clients/java (see tests/clients/__init__.py):
//
//	send    --endpoint H:P --topic T [--count N] [--body TEXT ({i}: the index)] [--tag X] [--keys K1,K2]
//	        [--type NORMAL|FIFO|DELAY|PRIORITY|TRANSACTION|LITE] [--group MESSAGE_GROUP | --groups G]
//	        [--delay-ms D] [--priority P] [--lite-topic L] [--transaction commit|rollback|none]
//	        [--check commit|rollback|unknown] [--await-checks C] [--timeout-ms T]
//	receive --endpoint H:P --topic T --group G [--count N] [--simple | --push] [--filter TAG_EXPRESSION]
//	        [--await-ms A] [--invisible-ms I] [--timeout-ms T] [--no-ack] [--fail-every K] [--poison BODY]
//	        [--lite-topics L1,L2 (with --push: a lite push consumer of bind topic T)]
//	both:   [--tls default|on|off] (default: the client's own default, TLS on) [--namespace NS]
//
// One JSON object a line on stdout: first {"event": "client", "language": "go", "tls": B} (B: whether
// the client's configuration has TLS on), then {"event": "sent", ...} per message sent, {"event":
// "received", ...} per message received, then {"event": "done", "count": N}.  Exit status 0 when every message
// was sent or received, 3 when a receive ran out of time, 1 on an error (stderr).
//
// --groups G gives message i the message group "group-(i mod G)".  --await-checks C keeps the
// producer open after its sends until its transaction checker has answered for C distinct messages
// (a "checked" line per answer), within --timeout-ms.  --fail-every K fails the first delivery of every K-th distinct
// message (push: the listener answers FAILURE; simple: its invisible duration is changed to 0),
// its "received" line saying "failed": true; --poison BODY fails every delivery of a message with
// that body; N counts the messages consumed.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	rmq "github.com/apache/rocketmq-clients/golang/v5"
	"github.com/apache/rocketmq-clients/golang/v5/credentials"
)

type options struct {
	endpoint, topic, group, body, tag, keys, kind, tls, namespace string
	transaction, check, filter, poison, liteTopic, liteTopics     string
	count, priority, groups, awaitChecks, failEvery               int
	delayMs, awaitMs, invisibleMs, timeoutMs, requestTimeoutMs    int
	simple, push, noAck                                           bool
	set                                                           map[string]bool
}

var output sync.Mutex

func emit(line map[string]any) {
	output.Lock()
	defer output.Unlock()
	data, err := json.Marshal(line)
	if err != nil {
		panic(err)
	}
	os.Stdout.Write(append(data, '\n'))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

func parse(args []string) *options {
	o := &options{set: map[string]bool{}}
	flags := flag.NewFlagSet(args[0], flag.ExitOnError)
	flags.StringVar(&o.endpoint, "endpoint", "", "HOST:PORT")
	flags.StringVar(&o.topic, "topic", "", "topic")
	flags.StringVar(&o.group, "group", "", "consumer group (receive) or message group (send)")
	flags.StringVar(&o.body, "body", "message-{i}", "body; {i} is the message's index")
	flags.StringVar(&o.tag, "tag", "", "tag")
	flags.StringVar(&o.keys, "keys", "", "comma-separated keys")
	flags.StringVar(&o.kind, "type", "NORMAL", "NORMAL|FIFO|DELAY|PRIORITY|TRANSACTION")
	flags.StringVar(&o.tls, "tls", "default", "default|on|off")
	flags.StringVar(&o.namespace, "namespace", "", "namespace")
	flags.StringVar(&o.transaction, "transaction", "commit", "commit|rollback|none")
	flags.StringVar(&o.check, "check", "commit", "commit|rollback|unknown: the transaction checker's answer")
	flags.StringVar(&o.filter, "filter", "*", "tag expression")
	flags.StringVar(&o.poison, "poison", "", "fail every delivery of the message with this body")
	flags.StringVar(&o.liteTopic, "lite-topic", "", "lite topic of the messages sent")
	flags.StringVar(&o.liteTopics, "lite-topics", "", "comma-separated lite topics a lite push consumer subscribes")
	flags.IntVar(&o.count, "count", 1, "messages to send or receive")
	flags.IntVar(&o.priority, "priority", 0, "priority")
	flags.IntVar(&o.groups, "groups", 0, "message groups, round robin")
	flags.IntVar(&o.awaitChecks, "await-checks", 0, "transaction checks to wait for after the sends")
	flags.IntVar(&o.failEvery, "fail-every", 0, "fail the first delivery of every K-th message")
	flags.IntVar(&o.delayMs, "delay-ms", 1000, "delivery delay")
	flags.IntVar(&o.awaitMs, "await-ms", 2000, "simple consumer long polling")
	flags.IntVar(&o.invisibleMs, "invisible-ms", 20000, "invisible duration")
	flags.IntVar(&o.timeoutMs, "timeout-ms", 30000, "how long a receive goes on")
	flags.IntVar(&o.requestTimeoutMs, "request-timeout-ms", 5000, "request timeout")
	flags.BoolVar(&o.simple, "simple", false, "simple consumer (the default)")
	flags.BoolVar(&o.push, "push", false, "push consumer")
	flags.BoolVar(&o.noAck, "no-ack", false, "do not ack (push: consume fails)")
	if err := flags.Parse(args[1:]); err != nil {
		fail(err)
	}
	flags.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	if o.endpoint == "" || o.topic == "" {
		fail(fmt.Errorf("--endpoint and --topic are required"))
	}
	switch o.tls {
	case "on":
		rmq.EnableSsl = true
	case "off":
		rmq.EnableSsl = false
	case "default":
	default:
		fail(fmt.Errorf("--tls must be default, on or off"))
	}
	return o
}

func (o *options) config(group string) *rmq.Config {
	emit(map[string]any{"event": "client", "language": "go", "tls": rmq.EnableSsl})
	return &rmq.Config{Endpoint: o.endpoint, NameSpace: o.namespace, ConsumerGroup: group,
		Credentials: &credentials.SessionCredentials{}}
}

func (o *options) bodyOf(index int) string {
	return strings.ReplaceAll(o.body, "{i}", strconv.Itoa(index))
}

func (o *options) message(index int) *rmq.Message {
	msg := &rmq.Message{Topic: o.topic, Body: []byte(o.bodyOf(index))}
	if o.set["tag"] {
		msg.SetTag(o.tag)
	}
	if o.set["keys"] {
		msg.SetKeys(strings.Split(o.keys, ",")...)
	}
	if o.groups > 0 {
		msg.SetMessageGroup("group-" + strconv.Itoa(index%o.groups))
	} else if o.kind == "FIFO" || o.set["group"] {
		group := o.group
		if group == "" {
			group = "group-0"
		}
		msg.SetMessageGroup(group)
	}
	if o.kind == "DELAY" || o.set["delay-ms"] {
		msg.SetDelayTimestamp(time.Now().Add(time.Duration(o.delayMs) * time.Millisecond))
	}
	if o.kind == "LITE" || o.set["lite-topic"] {
		msg.SetLiteTopic(o.liteTopic)
	}
	if o.kind == "PRIORITY" || o.set["priority"] {
		if err := msg.SetPriority(int32(o.priority)); err != nil {
			fail(err)
		}
	}
	return msg
}

func view(event string, mv *rmq.MessageView) map[string]any {
	var deliveryTimestamp any
	if t := mv.GetDeliveryTimestamp(); t != nil {
		deliveryTimestamp = t.UnixMilli()
	}
	keys := mv.GetKeys()
	if keys == nil {
		keys = []string{}
	}
	return map[string]any{
		"event": event, "message_id": mv.GetMessageId(), "topic": mv.GetTopic(), "body": string(mv.GetBody()),
		"tag": mv.GetTag(), "keys": keys, "message_group": mv.GetMessageGroup(),
		"priority":           nil, // the Go client's MessageView does not expose it
		"delivery_timestamp": deliveryTimestamp, "delivery_attempt": mv.GetDeliveryAttempt(),
		"properties": mv.GetProperties(), "lite_topic": mv.GetLiteTopic(),
	}
}

// failing decides whether a delivery fails: a poison message's, or the first of every K-th distinct
// message (--fail-every K).
type failing struct {
	mu     sync.Mutex
	every  int
	poison string
	seen   map[string]bool
}

func (f *failing) fails(mv *rmq.MessageView) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.poison != "" && string(mv.GetBody()) == f.poison {
		return true
	}
	if _, ok := f.seen[mv.GetMessageId()]; f.every <= 0 || ok {
		return false
	}
	fail := (len(f.seen)+1)%f.every == 0
	f.seen[mv.GetMessageId()] = fail
	return fail
}

func receivedLine(mv *rmq.MessageView, failed bool) map[string]any {
	line := view("received", mv)
	line["received_at"] = time.Now().UnixMilli()
	line["failed"] = failed
	return line
}

func send(o *options) int {
	opts := []rmq.ProducerOption{rmq.WithTopics(o.topic)}
	checks := make(chan struct{}, 1<<16)
	var checkedMu sync.Mutex
	checked := map[string]bool{}
	if o.kind == "TRANSACTION" {
		resolution := map[string]rmq.TransactionResolution{"commit": rmq.COMMIT, "rollback": rmq.ROLLBACK,
			"unknown": rmq.UNKNOWN}[o.check]
		opts = append(opts, rmq.WithTransactionChecker(&rmq.TransactionChecker{
			Check: func(mv *rmq.MessageView) rmq.TransactionResolution {
				emit(view("checked", mv))
				checkedMu.Lock()
				if !checked[mv.GetMessageId()] {
					checked[mv.GetMessageId()] = true
					checks <- struct{}{}
				}
				checkedMu.Unlock()
				return resolution
			},
		}))
	}
	producer, err := rmq.NewProducer(o.config(""), opts...)
	if err != nil {
		fail(err)
	}
	if err := producer.Start(); err != nil {
		fail(err)
	}
	defer producer.GracefulStop()
	timeout := time.Duration(o.requestTimeoutMs) * time.Millisecond
	for i := 0; i < o.count; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		var receipts []*rmq.SendReceipt
		if o.kind == "TRANSACTION" {
			transaction := producer.BeginTransaction()
			receipts, err = producer.SendWithTransaction(ctx, o.message(i), transaction)
			if err == nil && o.transaction == "commit" {
				err = transaction.Commit()
			} else if err == nil && o.transaction == "rollback" {
				err = transaction.RollBack()
			}
		} else {
			receipts, err = producer.Send(ctx, o.message(i))
		}
		cancel()
		if err != nil {
			fail(err)
		}
		emit(map[string]any{"event": "sent", "index": i, "message_id": receipts[0].MessageID, "topic": o.topic,
			"body": o.bodyOf(i)})
	}
	giveUp := time.After(time.Duration(o.timeoutMs) * time.Millisecond)
	for checked := 0; checked < o.awaitChecks; checked++ {
		select {
		case <-checks:
		case <-giveUp:
			emit(map[string]any{"event": "done", "count": o.count})
			return 3
		}
	}
	emit(map[string]any{"event": "done", "count": o.count})
	return 0
}

func receive(o *options) int {
	if o.group == "" {
		fail(fmt.Errorf("--group is required"))
	}
	subscription := map[string]*rmq.FilterExpression{o.topic: rmq.NewFilterExpression(o.filter)}
	giveUp := time.Now().Add(time.Duration(o.timeoutMs) * time.Millisecond)
	received := 0
	failures := &failing{every: o.failEvery, poison: o.poison, seen: map[string]bool{}}
	if o.push {
		arrived := make(chan map[string]any, 1024)
		listener := rmq.WithPushMessageListener(&rmq.FuncMessageListener{Consume: func(mv *rmq.MessageView) rmq.ConsumerResult {
			failed := failures.fails(mv)
			arrived <- receivedLine(mv, failed)
			if failed || o.noAck {
				return rmq.FAILURE
			}
			return rmq.SUCCESS
		}})
		var consumer rmq.PushConsumer
		if o.set["lite-topics"] {
			consumer = litePushConsumer(o, listener)
		} else {
			plain, err := rmq.NewPushConsumer(o.config(o.group), rmq.WithPushSubscriptionExpressions(subscription), listener)
			if err != nil {
				fail(err)
			}
			if err := plain.Start(); err != nil {
				fail(err)
			}
			consumer = plain
		}
		timer := time.NewTimer(time.Until(giveUp))
	wait:
		for received < o.count {
			select {
			case line := <-arrived:
				emit(line)
				if !line["failed"].(bool) {
					received++
				}
			case <-timer.C:
				break wait
			}
		}
		consumer.GracefulStop()
	} else {
		consumer, err := rmq.NewSimpleConsumer(o.config(o.group),
			rmq.WithSimpleAwaitDuration(time.Duration(o.awaitMs)*time.Millisecond),
			rmq.WithSimpleSubscriptionExpressions(subscription))
		if err != nil {
			fail(err)
		}
		if err := consumer.Start(); err != nil {
			fail(err)
		}
		invisible := time.Duration(o.invisibleMs) * time.Millisecond
		for received < o.count && time.Now().Before(giveUp) {
			want := o.count - received
			if want > 32 {
				want = 32
			}
			ctx, cancel := context.WithTimeout(context.Background(),
				time.Duration(o.awaitMs+o.requestTimeoutMs)*time.Millisecond)
			mvs, err := consumer.Receive(ctx, int32(want), invisible)
			cancel()
			if err != nil {
				if !strings.Contains(err.Error(), "MESSAGE_NOT_FOUND") {
					fmt.Fprintln(os.Stderr, "receive failed, retrying:", err)
				}
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for _, mv := range mvs {
				failed := failures.fails(mv)
				emit(receivedLine(mv, failed))
				if failed {
					if err := consumer.ChangeInvisibleDuration(mv, 0); err != nil {
						fail(err)
					}
					continue
				}
				if !o.noAck {
					if err := consumer.Ack(context.Background(), mv); err != nil {
						fail(err)
					}
				}
				received++
			}
		}
		consumer.GracefulStop()
	}
	emit(map[string]any{"event": "done", "count": received})
	if received < o.count {
		return 3
	}
	return 0
}

// litePushConsumer starts a lite push consumer of bind topic --topic subscribed to --lite-topics.
func litePushConsumer(o *options, listener rmq.PushConsumerOption) rmq.PushConsumer {
	invisible := time.Duration(o.invisibleMs) * time.Millisecond
	lite, err := rmq.NewLitePushConsumer(o.config(o.group), rmq.NewLitePushConsumerConfig(o.topic, invisible),
		listener, rmq.WithPushAwaitDuration(time.Duration(o.awaitMs)*time.Millisecond))
	if err != nil {
		fail(err)
	}
	if err := lite.Start(); err != nil {
		fail(err)
	}
	for _, name := range strings.Split(o.liteTopics, ",") {
		if err := lite.SubscribeLite(name); err != nil {
			fail(err)
		}
	}
	emit(map[string]any{"event": "subscribed", "lite_topics": strings.Split(o.liteTopics, ",")})
	return lite
}

func main() {
	if len(os.Args) < 2 {
		fail(fmt.Errorf("usage: send|receive --endpoint HOST:PORT --topic T ..."))
	}
	o := parse(os.Args[1:])
	switch os.Args[1] {
	case "send":
		os.Exit(send(o))
	case "receive":
		os.Exit(receive(o))
	default:
		fail(fmt.Errorf("unknown command %s", os.Args[1]))
	}
}
