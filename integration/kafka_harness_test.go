package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/wire"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

// newTopic creates a fresh topic with the given partitions.
func newTopic(t testing.TB, partitions int) string {
	t.Helper()
	topic := randomName("idemq-test-")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := kafkaadapter.EnsureTopics(ctx, kafkaBrokers(t), partitions, topic); err != nil {
		t.Fatal(err)
	}
	return topic
}

// kmsg is a message to produce: id "" means no message-id header.
type kmsg struct {
	id, payload string
	headers     map[string]string
}

func produce(t testing.TB, topic string, msgs ...kmsg) {
	t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(kafkaBrokers(t)...), Topic: topic, RequiredAcks: kafka.RequireAll,
		BatchTimeout: 5 * time.Millisecond, BatchSize: 1000, Balancer: &kafka.RoundRobin{}}
	defer w.Close()
	var out []kafka.Message
	for _, m := range msgs {
		km := kafka.Message{Value: []byte(m.payload)}
		if m.id != "" {
			km.Headers = append(km.Headers, kafka.Header{Key: wire.MessageIDHeader, Value: []byte(m.id)})
		}
		for k, v := range m.headers {
			km.Headers = append(km.Headers, kafka.Header{Key: k, Value: []byte(v)})
		}
		out = append(out, km)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.WriteMessages(ctx, out...); err != nil {
		t.Fatal(err)
	}
}

// fillers are n messages that only occupy offsets.
func fillers(n int) []kmsg {
	out := make([]kmsg, n)
	for i := range out {
		out[i] = kmsg{id: randomName("filler-"), payload: "filler"}
	}
	return out
}

func readerConfig(t testing.TB, group, topic string) kafka.ReaderConfig {
	return kafka.ReaderConfig{Brokers: kafkaBrokers(t), GroupID: group, Topic: topic, StartOffset: kafka.FirstOffset,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: time.Second, RebalanceTimeout: 6 * time.Second,
		MaxWait: 100 * time.Millisecond}
}

// commitCall is one Commit seen by spySource: the lane and the offset of the
// last completed delivery (Kafka stores offset+1).
type commitCall struct {
	lane   string
	offset int64
	err    error
}

// spySource wraps the real kafka-go source: it records every commit, can fail
// commits (failCommit) and can re-deliver an earlier message (replay), as a
// rebalance with buffered messages does.
type spySource struct {
	inner      *kafkaadapter.Source
	failCommit func(done []consumer.Delivery) error
	// failAfter, when set, runs after the commit reached Kafka and may
	// return an error anyway (a lost response).
	failAfter func(done []consumer.Delivery) error
	beforeOK  func(done []consumer.Delivery) // runs before a commit is sent

	mu      sync.Mutex
	commits []commitCall
	fetched []kafka.Message
	replay  chan kafka.Message
}

func newSpySource(t testing.TB, group, topic string) *spySource {
	t.Helper()
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{Reader: readerConfig(t, group, topic)})
	if err != nil {
		t.Fatal(err)
	}
	return &spySource{inner: src, replay: make(chan kafka.Message, 16)}
}

func (s *spySource) Fetch(ctx context.Context) (consumer.Delivery, error) {
	for {
		select {
		case m := <-s.replay:
			return kafkaadapter.ToDelivery(m, ""), nil
		default:
		}
		fctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		d, err := s.inner.Fetch(fctx)
		cancel()
		if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			continue
		}
		if err == nil {
			m, _ := kafkaadapter.MessageOf(d)
			s.mu.Lock()
			s.fetched = append(s.fetched, m)
			s.mu.Unlock()
		}
		return d, err
	}
}

func (s *spySource) Commit(ctx context.Context, done []consumer.Delivery) error {
	var err error
	if s.failCommit != nil {
		err = s.failCommit(done)
	}
	if err == nil && s.beforeOK != nil {
		s.beforeOK(done)
	}
	if err == nil {
		err = s.inner.Commit(ctx, done)
		if err == nil && s.failAfter != nil {
			err = s.failAfter(done)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range done {
		s.commits = append(s.commits, commitCall{lane: d.Lane, offset: d.Offset, err: err})
	}
	return err
}

func (s *spySource) Close() error { return s.inner.Close() }

// redeliver re-injects the fetched message at offset off.
func (s *spySource) redeliver(t testing.TB, off int64) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.fetched {
		if m.Offset == off {
			s.replay <- m
			return
		}
	}
	t.Fatalf("offset %d was never fetched", off)
}

func (s *spySource) successfulCommits() []commitCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []commitCall
	for _, c := range s.commits {
		if c.err == nil {
			out = append(out, c)
		}
	}
	return out
}

// running is a consumer.Run in the background.
type running struct {
	cancel context.CancelFunc
	done   chan error
}

func startConsumer(t testing.TB, cfg consumer.Config, src consumer.Source) *running {
	t.Helper()
	if cfg.CommitEvery == 0 {
		cfg.CommitEvery = 1
	}
	if cfg.CommitInterval == 0 {
		cfg.CommitInterval = 50 * time.Millisecond
	}
	if cfg.RetryInitial == 0 {
		cfg.RetryInitial, cfg.RetryMax = 10*time.Millisecond, 50*time.Millisecond
	}
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx, src) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop shuts the consumer down gracefully and waits for Run to return.
func (r *running) stop(t testing.TB) {
	t.Helper()
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("consumer.Run: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Error("consumer.Run did not return 60s after cancel")
	}
}

// eventually polls cond every 50ms for up to d: the tests' one way of
// waiting for something to happen (see also wait_test.go).
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	eventuallyExplained(t, d, what, cond, nil)
}

// eventuallyExplained is eventually, and on a timeout the failure also says
// what explain returns (the state a reader needs to tell why).
func eventuallyExplained(t testing.TB, d time.Duration, what string, cond func() bool, explain func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			if explain != nil {
				t.Fatalf("timed out after %s waiting for %s; %s", d, what, explain())
			}
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		<-tick.C
	}
}

// state says whether Run has returned, and its error, without taking it
// from stop.
func (r *running) state() string {
	select {
	case err := <-r.done:
		r.done <- err
		return fmt.Sprintf("consumer.Run returned %v", err)
	default:
		return "consumer.Run running"
	}
}

// committedOffsets returns the group's committed offset per partition of
// topic (-1 when none).
func committedOffsets(t testing.TB, group, topic string, partitions int) map[int]int64 {
	t.Helper()
	cl := &kafka.Client{Addr: kafka.TCP(kafkaBrokers(t)...), Timeout: 10 * time.Second}
	parts := make([]int, partitions)
	for i := range parts {
		parts[i] = i
	}
	resp, err := cl.OffsetFetch(context.Background(), &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]int64{}
	for _, p := range resp.Topics[topic] {
		out[p.Partition] = p.CommittedOffset
	}
	return out
}

// groupOffset is the committed offset of partition 0 of topic for group (-1
// when none).
func groupOffset(t testing.TB, group, topic string) int64 {
	t.Helper()
	cl := &kafka.Client{Addr: kafka.TCP(kafkaBrokers(t)...), Timeout: 10 * time.Second}
	resp, err := cl.OffsetFetch(context.Background(), &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: {0}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range resp.Topics[topic] {
		if p.Partition == 0 {
			return p.CommittedOffset
		}
	}
	return -1
}

func waitCaughtUp(t testing.TB, group, topic string) {
	t.Helper()
	eventually(t, 90*time.Second, "group "+group+" to commit the whole topic", func() bool {
		lag, err := kafkaadapter.GroupLag(context.Background(), kafkaBrokers(t), group, topic)
		return err == nil && lag == 0
	})
}

// appliesTable creates a table with one row per handler effect.
func (e *env) appliesTable() string {
	tbl := e.table("applies")
	e.exec(`create table ` + tbl + ` (message_id text not null, payload bytea, business_key text)`)
	return tbl
}

// applier is a spy handler: counts calls per message ID and inserts one row
// per call; fail decides errors.
type applier struct {
	table string
	mu    sync.Mutex
	calls map[string]int
	fail  func(m *dedup.Message) error
}

func newApplier(table string) *applier { return &applier{table: table, calls: map[string]int{}} }

func (a *applier) handler() pgstore.Handler {
	return func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		a.mu.Lock()
		a.calls[m.Identity.MessageID]++
		a.mu.Unlock()
		if a.fail != nil {
			if err := a.fail(m); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `insert into `+a.table+` (message_id, payload, business_key) values ($1, $2, $3)`,
			m.Identity.MessageID, m.Payload, m.Identity.BusinessKey)
		return err
	}
}

func (a *applier) total() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, c := range a.calls {
		n += c
	}
	return n
}

func (a *applier) callsFor(id string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls[id]
}

func isFiller(m *dedup.Message) bool { return strings.HasPrefix(m.Identity.MessageID, "filler-") }
