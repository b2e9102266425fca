package integration

import (
	"context"
	"crypto/rand"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/apache/rocketmq-client-go/v2/rlog"
	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/broker/rocketmqadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/sourcetest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/kafkapub"
	"github.com/idemq/idemq/outbox/publishertest"
	"github.com/idemq/idemq/outbox/rocketmqpub"
	"github.com/idemq/idemq/wire"
	"github.com/segmentio/kafka-go"
)

// The conformance suites on the real brokers: outbox/publishertest for both
// publishers, consumer/sourcetest for both pull-mode sources. Each case gets
// its own topic (and consumer group).

// kafkaTopicMaxBytes is the max.message.bytes of the publisher suite's Kafka
// topics: small, so that the broker itself refuses Harness.Refuse's
// envelopes.
const kafkaTopicMaxBytes = 16 << 10

func TestPublisherConformanceKafka(t *testing.T) {
	t.Parallel()
	publishertest.Run(t, func(t *testing.T) publishertest.Harness {
		return kafkaPublisherHarness(t, kafkaBrokers(t), nil, randomName("idemq-pubtest-"))
	})
}

// The same suite with the publisher on the SASL_SSL listener (TLS +
// SCRAM-SHA-512 through kafkapub.Config.Transport). The topics are made and
// read back over the PLAINTEXT listener.
func TestPublisherConformanceKafkaSASL(t *testing.T) {
	t.Parallel()
	k := kafkaSASL(t)
	publishertest.Run(t, func(t *testing.T) publishertest.Harness {
		return kafkaPublisherHarness(t, k.brokers, mustTransport(t, k.admin()), k.name("pubtest"))
	})
}

// kafkaPublisherHarness is the publisher suite's harness: a kafkapub
// Publisher on brokers through rt (nil: PLAINTEXT) publishing to topic.
func kafkaPublisherHarness(t *testing.T, brokers []string, rt kafka.RoundTripper, topic string) publishertest.Harness {
	const partitions = 3
	cl := &kafka.Client{Addr: kafka.TCP(kafkaBrokers(t)...), Timeout: 10 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := cl.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1,
		ConfigEntries: []kafka.ConfigEntry{{ConfigName: "max.message.bytes", ConfigValue: strconv.Itoa(kafkaTopicMaxBytes)}}}}})
	if err != nil || resp.Errors[topic] != nil {
		t.Fatalf("create topic %s: %v %v", topic, err, resp)
	}
	// EnsureTopics on an existing topic waits until every partition's
	// leader serves it.
	if err := kafkaadapter.EnsureTopics(ctx, kafkaBrokers(t), partitions, topic); err != nil {
		t.Fatal(err)
	}
	return publishertest.Harness{
		Publisher: kafkaPub(t, brokers, rt),
		Topic:     topic,
		Read: func(t testing.TB, n int) []publishertest.Message {
			t.Helper()
			var out []publishertest.Message
			eventually(t, 2*time.Minute, fmt.Sprintf("%d messages on %s", n, topic), func() bool {
				out = out[:0]
				for p, msgs := range obReadAll(t, topic, partitions) {
					for _, m := range msgs {
						hs := map[string]string{}
						for _, h := range m.Headers {
							hs[h.Key] = string(h.Value)
						}
						out = append(out, publishertest.Message{Lane: strconv.Itoa(p), Seq: m.Offset, Key: m.Key, Value: m.Value, Headers: hs})
					}
				}
				return len(out) >= n
			})
			return out
		},
		// A record above the topic's max.message.bytes: the broker
		// answers MESSAGE_TOO_LARGE.
		Refuse: func(e outbox.Envelope) outbox.Envelope {
			e.Payload = randomBytes(t, 2*kafkaTopicMaxBytes)
			return e
		},
	}
}

func kafkaPub(t testing.TB, brokers []string, rt kafka.RoundTripper) *kafkapub.Publisher {
	t.Helper()
	p, err := kafkapub.New(kafkapub.Config{Brokers: brokers, Transport: rt})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func TestPublisherConformanceRocketMQ(t *testing.T) {
	t.Parallel()
	rlog.SetLogLevel("error")
	ns := []string{rocketmqNamesrv(t)}
	pub, err := rocketmqpub.New(rocketmqpub.Config{NameServers: ns, InstanceName: randomName("pubtest-")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	publishertest.Run(t, func(t *testing.T) publishertest.Harness {
		topic := obRocketTopic(t, ns)
		return publishertest.Harness{
			Publisher: pub,
			Topic:     topic,
			Read:      newRocketTopicReader(t, ns, topic).read,
			// A body above the broker's maxMessageSize (4 MiB by default),
			// random so that the client's compression cannot shrink it: the
			// broker answers MESSAGE_ILLEGAL.
			Refuse: func(e outbox.Envelope) outbox.Envelope {
				e.Payload = randomBytes(t, 5<<20)
				return e
			},
		}
	})
}

// rocketTopicReader reads every message of a RocketMQ topic from its first
// offset with a push consumer of its own group, started before anything is
// published, and keeps them by queue and offset (a message consumed twice is
// kept once).
type rocketTopicReader struct {
	mu   sync.Mutex
	seen map[string]publishertest.Message
}

func newRocketTopicReader(t testing.TB, ns []string, topic string) *rocketTopicReader {
	t.Helper()
	r := &rocketTopicReader{seen: map[string]publishertest.Message{}}
	pc, err := rocketmq.NewPushConsumer(
		rmqconsumer.WithGroupName(randomName("pubtest_read_")),
		rmqconsumer.WithNsResolver(primitive.NewPassthroughResolver(ns)),
		rmqconsumer.WithInstance(randomName("pubtest-read-")),
		rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset),
	)
	if err != nil {
		t.Fatal(err)
	}
	err = pc.Subscribe(topic, rmqconsumer.MessageSelector{}, func(_ context.Context, msgs ...*primitive.MessageExt) (rmqconsumer.ConsumeResult, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, m := range msgs {
			var key []byte
			if k := m.GetKeys(); k != "" {
				key = []byte(k)
			}
			lane := fmt.Sprintf("%s/%d", m.Queue.BrokerName, m.Queue.QueueId)
			r.seen[fmt.Sprintf("%s@%d", lane, m.QueueOffset)] = publishertest.Message{Lane: lane, Seq: m.QueueOffset, Key: key,
				Value: m.Body, Headers: m.GetProperties()}
		}
		return rmqconsumer.ConsumeSuccess, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = shutdownRocketPush(pc) })
	return r
}

// read returns the messages read so far once there are at least n.
func (r *rocketTopicReader) read(t testing.TB, n int) []publishertest.Message {
	t.Helper()
	var out []publishertest.Message
	eventually(t, 3*time.Minute, fmt.Sprintf("%d messages read back", n), func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		out = out[:0]
		for _, m := range r.seen {
			out = append(out, m)
		}
		return len(out) >= n
	})
	return out
}

func randomBytes(t testing.TB, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSourceConformanceKafka(t *testing.T) {
	t.Parallel()
	sourcetest.Run(t, func(t *testing.T) sourcetest.Harness {
		const partitions = 3
		topic, group := newTopic(t, partitions), randomName("g-srctest-")
		return kafkaSourceHarness(kafkaBrokers(t), nil, nil, topic, group, partitions)
	})
}

// The same suite over the SASL_SSL listener (TLS + SCRAM-SHA-512): the
// source's group, partition readers and horizon check go through the
// Reader's Dialer, the test's producer through a kafkasec Transport.
func TestSourceConformanceKafkaSASL(t *testing.T) {
	t.Parallel()
	k := kafkaSASL(t)
	sourcetest.Run(t, func(t *testing.T) sourcetest.Harness {
		const partitions = 3
		topic, group := k.topic(t, partitions), k.name("g-srctest")
		return kafkaSourceHarness(k.brokers, mustDialer(t, k.admin()), mustTransport(t, k.admin()), topic, group, partitions)
	})
}

// kafkaSourceHarness is the source suite's harness for topic and group on
// brokers; dialer and rt carry TLS/SASL (nil: PLAINTEXT). Committed offsets
// are read over the PLAINTEXT listener.
func kafkaSourceHarness(brokers []string, dialer *kafka.Dialer, rt kafka.RoundTripper, topic, group string, partitions int) sourcetest.Harness {
	var mu sync.Mutex // guards partitions, raised by Grow
	return sourcetest.Harness{
		Produce: func(t testing.TB, msgs []sourcetest.Message) {
			t.Helper()
			w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, Transport: rt,
				BatchTimeout: 5 * time.Millisecond, BatchSize: 1000, Balancer: kafka.Murmur2Balancer{}}
			defer func() { _ = w.Close() }()
			out := make([]kafka.Message, len(msgs))
			for i, m := range msgs {
				out[i] = kafka.Message{Key: m.Key, Value: m.Value, Headers: []kafka.Header{{Key: wire.MessageIDHeader, Value: []byte(m.ID)}}}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := w.WriteMessages(ctx, out...); err != nil {
				t.Fatal(err)
			}
		},
		NewSource: func(t testing.TB) consumer.Source {
			t.Helper()
			rc := readerConfig(t, group, topic)
			rc.Brokers, rc.Dialer = brokers, dialer
			src, err := kafkaadapter.NewSource(kafkaadapter.Config{Reader: rc})
			if err != nil {
				t.Fatal(err)
			}
			return src
		},
		Committed: func(t testing.TB) map[string]int64 {
			t.Helper()
			mu.Lock()
			n := partitions
			mu.Unlock()
			out := map[string]int64{}
			for p, off := range committedOffsets(t, group, topic, n) {
				if off >= 0 {
					out[topic+"/"+strconv.Itoa(p)] = off
				}
			}
			return out
		},
		// Grow adds two partitions (CreatePartitions) and writes one
		// message to each.
		Grow: func(t testing.TB) []sourcetest.Message {
			t.Helper()
			mu.Lock()
			defer mu.Unlock()
			cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: rt}
			addPartitions(t, cl, topic, partitions+2)
			var out []sourcetest.Message
			for p := partitions; p < partitions+2; p++ {
				m := sourcetest.Message{ID: fmt.Sprintf("%s-added-%d", t.Name(), p), Value: []byte("{}")}
				produceWith(t, cl, topic, p, m.ID)
				out = append(out, m)
			}
			partitions += 2
			return out
		},
	}
}

// The RocketMQ pull-mode source. Its Harness has no Committed: reading a
// group's offsets from the broker takes a client of the group, which would
// join the group and take queues from the source under test, so the suite
// checks committed positions through where the next source resumes.
func TestSourceConformanceRocketMQ(t *testing.T) {
	t.Parallel()
	rlog.SetLogLevel("error")
	ns := []string{rocketmqNamesrv(t)}
	p, err := rocketmq.NewProducer(producer.WithNsResolver(primitive.NewPassthroughResolver(ns)),
		producer.WithInstanceName(rocketmqadapter.InstanceName("srctest-producer")),
		producer.WithQueueSelector(producer.NewHashQueueSelector()))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown() })
	manual := rmqManualProducer(t)
	sourcetest.Run(t, func(t *testing.T) sourcetest.Harness {
		topic, group := obRocketTopic(t, ns), randomName("srctest_")
		return sourcetest.Harness{
			Produce: func(t testing.TB, msgs []sourcetest.Message) {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				for _, m := range msgs {
					pm := primitive.NewMessage(topic, m.Value)
					pm.WithProperty(wire.MessageIDHeader, m.ID)
					pm.WithKeys([]string{string(m.Key)})
					pm.WithShardingKey(string(m.Key))
					res, err := p.SendSync(ctx, pm)
					if err != nil || res.Status != primitive.SendOK {
						t.Fatalf("send %s: %v %v", m.ID, res, err)
					}
				}
			},
			NewSource: func(t testing.TB) consumer.Source {
				t.Helper()
				src, err := rocketmqadapter.NewSource(rocketmqadapter.SourceConfig{NameServers: ns, Group: group, Topic: topic,
					InstanceName:  rocketmqadapter.InstanceName("srctest"),
					ClientOptions: []rmqconsumer.Option{rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset)}})
				if err != nil {
					t.Fatal(err)
				}
				return src
			},
			// Grow raises the queues from 4 to 8 (updateTopic) and writes one
			// message to each of queues 4…7.
			Grow: func(t testing.TB) []sourcetest.Message {
				t.Helper()
				_, broker := rmqEndpoints(t)
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if err := rocketmqadapter.EnsureTopic(ctx, ns, broker, topic, 8); err != nil {
					t.Fatal(err)
				}
				name := rmqBrokerName(t, topic)
				var out []sourcetest.Message
				for q := 4; q < 8; q++ {
					m := sourcetest.Message{ID: fmt.Sprintf("%s-added-%d", t.Name(), q), Value: []byte(fmt.Sprintf("added-%d", q))}
					rmqSendTo(t, manual, topic, name, q, m.ID)
					out = append(out, m)
				}
				return out
			},
		}
	})
}
