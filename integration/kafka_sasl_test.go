package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/broker/kafkasec"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/kafkapub"
	"github.com/idemq/idemq/wire"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

// The SASL_SSL listener of scripts/services.sh (TLS with a test CA, SCRAM
// logins, ACLs on): its address, CA, the admin user (a super user) and a
// read-only user who may Read and Describe the topics and consumer groups
// named <prefix>* but not DescribeConfigs them. docker-compose.yml and the
// testcontainers fallback have no such listener.
type saslKafka struct {
	brokers                            []string
	ca                                 string
	user, password                     string
	readerUser, readerPassword, prefix string
}

var saslEnvNames = []string{"TEST_KAFKA_SASL_BROKERS", "TEST_KAFKA_SASL_CA", "TEST_KAFKA_SASL_USER", "TEST_KAFKA_SASL_PASSWORD",
	"TEST_KAFKA_SASL_READER_USER", "TEST_KAFKA_SASL_READER_PASSWORD"}

func kafkaSASL(t testing.TB) saslKafka {
	t.Helper()
	for _, n := range saslEnvNames {
		if os.Getenv(n) == "" {
			if servicesRequired() {
				t.Fatalf("%s is not set and CI=true (TEST_REQUIRE_BROKERS): the SASL_SSL Kafka listener is required; %s", n, startHint)
			}
			t.Skipf("%s is not set: no SASL_SSL Kafka listener (scripts/services.sh starts one; docker-compose.yml does not)", n)
		}
	}
	k := saslKafka{brokers: strings.Split(os.Getenv("TEST_KAFKA_SASL_BROKERS"), ","), ca: os.Getenv("TEST_KAFKA_SASL_CA"),
		user: os.Getenv("TEST_KAFKA_SASL_USER"), password: os.Getenv("TEST_KAFKA_SASL_PASSWORD"),
		readerUser: os.Getenv("TEST_KAFKA_SASL_READER_USER"), readerPassword: os.Getenv("TEST_KAFKA_SASL_READER_PASSWORD"),
		prefix: os.Getenv("TEST_KAFKA_SASL_READER_PREFIX")}
	if k.prefix == "" {
		k.prefix = "idemq-sasl-"
	}
	return k
}

func (k saslKafka) sec(user, password string) kafkasec.Config {
	return kafkasec.Config{TLS: kafkasec.TLS{CAFile: k.ca}, SASL: kafkasec.SASL{Mechanism: kafkasec.ScramSHA512, Username: user, Password: password}}
}

func (k saslKafka) admin() kafkasec.Config { return k.sec(k.user, k.password) }

func (k saslKafka) reader() kafkasec.Config { return k.sec(k.readerUser, k.readerPassword) }

// name is a fresh topic or group name the read-only user may read.
func (k saslKafka) name(what string) string { return randomName(k.prefix + what + "-") }

func mustDialer(t testing.TB, c kafkasec.Config) *kafka.Dialer {
	t.Helper()
	d, err := c.Dialer()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func mustTransport(t testing.TB, c kafkasec.Config) kafka.RoundTripper {
	t.Helper()
	rt, err := c.Transport()
	if err != nil {
		t.Fatal(err)
	}
	if tr, ok := rt.(*kafka.Transport); ok {
		t.Cleanup(tr.CloseIdleConnections)
	}
	return rt
}

// topic creates a fresh topic over SASL_SSL (EnsureTopicsWith, admin user).
func (k saslKafka) topic(t testing.TB, partitions int) string {
	t.Helper()
	topic := k.name("t")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := kafkaadapter.EnsureTopicsWith(ctx, mustTransport(t, k.admin()), k.brokers, partitions, topic); err != nil {
		t.Fatalf("EnsureTopicsWith over SASL_SSL: %v", err)
	}
	return topic
}

// produce writes n messages with message IDs <tag>-<i> over SASL_SSL.
func (k saslKafka) produce(t testing.TB, topic, tag string, n int) []string {
	t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(k.brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, Transport: mustTransport(t, k.admin()),
		BatchTimeout: 5 * time.Millisecond, BatchSize: 1000, Balancer: &kafka.RoundRobin{}}
	defer func() { _ = w.Close() }()
	ids := make([]string, n)
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		ids[i] = fmt.Sprintf("%s-%03d", tag, i)
		msgs[i] = kafka.Message{Value: []byte("payload " + ids[i]), Headers: []kafka.Header{{Key: wire.MessageIDHeader, Value: []byte(ids[i])}}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("produce over SASL_SSL: %v", kafkasec.Explain(err))
	}
	return ids
}

// noopHandler is the handler of a consumer that must not get to handle.
func noopHandler(context.Context, pgx.Tx, *dedup.Message) error {
	return errors.New("not expected to run")
}

func (k saslKafka) readerConfig(d *kafka.Dialer, group, topic string) kafka.ReaderConfig {
	return kafka.ReaderConfig{Brokers: k.brokers, GroupID: group, Topic: topic, StartOffset: kafka.FirstOffset, Dialer: d,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: time.Second, RebalanceTimeout: 6 * time.Second, MaxWait: 100 * time.Millisecond}
}

// consumeAll runs consumer.Run over src until every id was handled and the
// group's lag (GroupLagWith over SASL_SSL, admin user) is 0, then stops it
// and checks each message was handled exactly once.
func (k saslKafka) consumeAll(t *testing.T, e *env, src *kafkaadapter.Source, group, topic string, ids []string) {
	t.Helper()
	app := newApplier(e.appliesTable())
	c, err := consumer.New(consumer.Config{Scope: group, Store: e.store, Handler: app.handler(),
		CommitEvery: 10, CommitInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, src) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("consumer.Run = %v, want nil after its context ended", err)
		}
	}()
	admin := mustTransport(t, k.admin())
	eventually(t, 2*time.Minute, fmt.Sprintf("%d messages handled and committed", len(ids)), func() bool {
		select {
		case err := <-done:
			t.Fatalf("consumer.Run returned early: %v", err)
		default:
		}
		if app.total() < len(ids) {
			return false
		}
		lag, err := kafkaadapter.GroupLagWith(e.ctx, admin, k.brokers, group, topic)
		return err == nil && lag == 0
	})
	for _, id := range ids {
		if n := app.callsFor(id); n != 1 {
			t.Errorf("message %s handled %d times, want 1", id, n)
		}
	}
	if got := app.total(); got != len(ids) {
		t.Errorf("%d handler calls, want %d", got, len(ids))
	}
	if got := e.count(`select count(*) from `+app.table+` where message_id like $1`, ids[0][:strings.LastIndex(ids[0], "-")]+"-%"); got != len(ids) {
		t.Errorf("%d rows applied, want %d", got, len(ids))
	}
}

// consumer.Run over TLS + SCRAM-SHA-512, with the redelivery horizon asked
// from the broker (DescribeConfigs through the Reader's Dialer): every
// message is handled once and the offsets are committed. The topic is made
// with EnsureTopicsWith and the messages produced over SASL_SSL too.
func TestKafkaSASLConsumerRun(t *testing.T) {
	t.Parallel()
	k := kafkaSASL(t)
	e := setup(t, nil)
	topic, group := k.topic(t, 3), k.name("g")
	ids := k.produce(t, topic, randomName("m"), 30)

	// The horizon check's request itself, over SASL_SSL: the broker's
	// default retention (7 days), as the PLAINTEXT listener reports it.
	h, err := kafkaadapter.TopicRetentionWith(e.ctx, mustTransport(t, k.admin()), k.brokers, topic)
	if err != nil {
		t.Fatalf("TopicRetentionWith over SASL_SSL: %v", err)
	}
	plain, err := kafkaadapter.TopicRetention(e.ctx, kafkaBrokers(t), topic)
	if err != nil || h != plain || h <= 0 {
		t.Fatalf("retention over SASL_SSL %s, over PLAINTEXT %s (%v): want the same bounded value", h, plain, err)
	}

	src, err := kafkaadapter.NewSource(kafkaadapter.Config{Reader: k.readerConfig(mustDialer(t, k.admin()), group, topic)})
	if err != nil {
		t.Fatal(err)
	}
	k.consumeAll(t, e, src, group, topic, ids)
	committed := committedOffsets(t, group, topic, 3)
	var sum int64
	for _, off := range committed {
		sum += max(off, 0)
	}
	if sum != int64(len(ids)) {
		t.Errorf("committed offsets %v sum to %d, want %d", committed, sum, len(ids))
	}
}

// The relay (outbox + kafkapub) publishes over SASL_SSL: topic creation
// (CreateTopics), partition lookups and produce requests all go through
// Config.Transport.
func TestKafkaSASLRelayPublishes(t *testing.T) {
	t.Parallel()
	k := kafkaSASL(t)
	o := setupOutbox(t)
	topic := k.name("relay")
	const n = 40
	want := o.addRows(t, topic, n, 4, "sasl")
	pub, err := kafkapub.New(kafkapub.Config{Brokers: k.brokers, Transport: mustTransport(t, k.admin()), CreateTopics: true, TopicPartitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	o.startRelay(t, pub, fastRelay(randomName("relay-")))
	eventually(t, 2*time.Minute, "all rows published", func() bool {
		st := o.stats(t)
		return st.Pending == 0 && st.Parked == 0
	})
	got := map[string]string{}
	for _, msgs := range obReadAll(t, topic, 2) {
		for _, m := range msgs {
			got[header(m, wire.MessageIDHeader)] = string(m.Key)
		}
	}
	if len(got) != n {
		t.Fatalf("%d distinct messages on %s, want %d", len(got), topic, n)
	}
	for id, key := range want {
		if got[id] != key {
			t.Errorf("row %s: key %q on the topic, want %q", id, got[id], key)
		}
	}
}

// A wrong password fails fast with an error that says the login was
// refused, never contains the password, and does not park outbox rows.
func TestKafkaSASLWrongPassword(t *testing.T) {
	t.Parallel()
	k := kafkaSASL(t)
	e := setup(t, nil)
	const wrong = "not-the-password-4711"
	bad := k.sec(k.user, wrong)
	check := func(what string, err error, took time.Duration) {
		t.Helper()
		if !errors.Is(err, kafkasec.ErrAuthentication) || !errors.Is(err, kafka.SASLAuthenticationFailed) {
			t.Errorf("%s: %v, want kafkasec.ErrAuthentication wrapping kafka.SASLAuthenticationFailed", what, err)
		} else if !strings.Contains(err.Error(), "SASL.Password") {
			t.Errorf("%s: %q does not point at SASL.Password", what, err)
		}
		if err != nil && strings.Contains(err.Error(), wrong) {
			t.Errorf("%s: the error contains the password: %q", what, err)
		}
		if took > 15*time.Second {
			t.Errorf("%s took %s, want a quick failure", what, took)
		}
		t.Logf("%s: %s: %v", what, took.Round(time.Millisecond), err)
	}

	topic := k.topic(t, 1)
	c, err := consumer.New(consumer.Config{Scope: "g", Store: e.store, Handler: noopHandler})
	if err != nil {
		t.Fatal(err)
	}
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{Reader: k.readerConfig(mustDialer(t, bad), k.name("g"), topic)})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = c.Run(e.ctx, src)
	check("consumer.Run (horizon check)", err, time.Since(start))

	// With the horizon stated there is no check: Fetch itself (the group
	// join) fails.
	src, err = kafkaadapter.NewSource(kafkaadapter.Config{Reader: k.readerConfig(mustDialer(t, bad), k.name("g"), topic), RedeliveryHorizon: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	err = c.Run(e.ctx, src)
	check("consumer.Run (fetch)", err, time.Since(start))

	start = time.Now()
	err = kafkaadapter.EnsureTopicsWith(e.ctx, mustTransport(t, bad), k.brokers, 1, k.name("t"))
	check("EnsureTopicsWith", err, time.Since(start))

	pub, err := kafkapub.New(kafkapub.Config{Brokers: k.brokers, Transport: mustTransport(t, bad)})
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	err = pub.Publish(e.ctx, []outbox.Envelope{{Topic: topic, Payload: []byte("x")}})
	var perr outbox.PublishErrors
	if !errors.As(err, &perr) || len(perr) != 1 {
		t.Fatalf("Publish = %v, want PublishErrors", err)
	}
	check("kafkapub.Publish", perr[0], time.Since(start))
	if !outbox.IsUnavailable(perr[0]) {
		t.Errorf("a refused login is a row error (%v): rows would be parked", perr[0])
	}
}

// A client whose security settings do not match the listener gets an error
// saying so, not a bare EOF.
func TestKafkaSASLProtocolMismatch(t *testing.T) {
	t.Parallel()
	k := kafkaSASL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range []struct {
		what    string
		brokers []string
		rt      kafka.RoundTripper
	}{
		{"PLAINTEXT client on the SASL_SSL port", k.brokers, nil},
		{"SASL_SSL client on the PLAINTEXT port", kafkaBrokers(t), mustTransport(t, k.admin())},
	} {
		start := time.Now()
		_, err := kafkaadapter.TopicRetentionWith(ctx, c.rt, c.brokers, "any")
		if !errors.Is(err, kafkasec.ErrSecurityMismatch) {
			t.Errorf("%s: %v, want kafkasec.ErrSecurityMismatch", c.what, err)
		}
		t.Logf("%s: %s: %v", c.what, time.Since(start).Round(time.Millisecond), err)
	}
}

// An explicit Config.RedeliveryHorizon is what the source reports, without
// asking the broker: longer than the store's record retention it makes Run
// refuse to start (ErrRetentionTooShort) although the topic's retention.ms
// (7 days) would pass; shorter, Run consumes.
func TestKafkaSASLExplicitHorizon(t *testing.T) {
	t.Parallel()
	k := kafkaSASL(t)
	e := setup(t, nil) // SucceededRetention 7 days
	topic := k.topic(t, 1)
	ids := k.produce(t, topic, randomName("h"), 5)
	c, err := consumer.New(consumer.Config{Scope: "g", Store: e.store, Handler: noopHandler})
	if err != nil {
		t.Fatal(err)
	}
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{Reader: k.readerConfig(mustDialer(t, k.admin()), k.name("g"), topic),
		RedeliveryHorizon: 8 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if h, err := src.RedeliveryHorizon(e.ctx); h != 8*24*time.Hour || err != nil {
		t.Fatalf("RedeliveryHorizon = %s, %v; want the configured 192h", h, err)
	}
	if err := c.Run(e.ctx, src); !errors.Is(err, dedup.ErrRetentionTooShort) {
		t.Fatalf("Run with RedeliveryHorizon 8 days > SucceededRetention 7 days = %v, want ErrRetentionTooShort", err)
	}
	if _, err := kafkaadapter.NewSource(kafkaadapter.Config{Reader: k.readerConfig(nil, "g", topic), RedeliveryHorizon: -time.Second}); !errors.Is(err, kafkaadapter.ErrInvalidConfig) ||
		!strings.Contains(err.Error(), "RedeliveryHorizon") {
		t.Errorf("negative RedeliveryHorizon: %v, want ErrInvalidConfig naming RedeliveryHorizon", err)
	}
	group := k.name("g")
	src, err = kafkaadapter.NewSource(kafkaadapter.Config{Reader: k.readerConfig(mustDialer(t, k.admin()), group, topic), RedeliveryHorizon: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	k.consumeAll(t, e, src, group, topic, ids)
}

// The read-only user (Read and Describe on its topics and groups, no
// DescribeConfigs) is stopped by the horizon check with an error naming
// the ACL and Config.RedeliveryHorizon; with RedeliveryHorizon set it
// consumes every message once.
func TestKafkaSASLHorizonCheckDenied(t *testing.T) {
	t.Parallel()
	k := kafkaSASL(t)
	e := setup(t, nil)
	topic, group := k.topic(t, 2), k.name("g")
	ids := k.produce(t, topic, randomName("r"), 20)
	c, err := consumer.New(consumer.Config{Scope: group, Store: e.store, Handler: noopHandler})
	if err != nil {
		t.Fatal(err)
	}
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{Reader: k.readerConfig(mustDialer(t, k.reader()), group, topic)})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Run(e.ctx, src)
	if !errors.Is(err, kafkaadapter.ErrHorizonCheckDenied) {
		t.Fatalf("Run as the read-only user = %v, want ErrHorizonCheckDenied", err)
	}
	for _, s := range []string{"DescribeConfigs", "RedeliveryHorizon", topic} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not name %s", err, s)
		}
	}
	if !errors.Is(err, kafka.TopicAuthorizationFailed) && !errors.Is(err, kafka.ClusterAuthorizationFailed) {
		t.Errorf("error %v does not wrap the broker's authorization error", err)
	}
	t.Logf("denied: %v", err)

	src, err = kafkaadapter.NewSource(kafkaadapter.Config{Reader: k.readerConfig(mustDialer(t, k.reader()), group, topic),
		RedeliveryHorizon: 7 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	k.consumeAll(t, e, src, group, topic, ids)
}
