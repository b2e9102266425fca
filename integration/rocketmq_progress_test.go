package integration

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idemq/idemq/broker/rocketmqadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/wire"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
)

// ---------------------------------------------------------------------------
// Issue 14: consumption progress survives rebalances. rocketmq-client-go's
// offset store drops every queue but the one given up from its table at each
// rebalance, so the offsets of the queues a consumer keeps are never
// persisted again (until a new ack or an idle long poll re-adds them), and
// of two queues given up in one rebalance only the first is persisted.

// rmqSentLog records the highest queue offset written per queue of a topic,
// from the send results: the broker's max offset of queue q is
// maxOffset[q]+1 when only the test writes to the topic.
type rmqSentLog struct {
	mu        sync.Mutex
	maxOffset map[int]int64
	n         int
}

func (s *rmqSentLog) send(t testing.TB, p rocketmq.Producer, topic string, body []byte, messageID string) {
	t.Helper()
	m := primitive.NewMessage(topic, body)
	if messageID != "" {
		m.WithProperty(wire.MessageIDHeader, messageID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := p.SendSync(ctx, m)
	if err != nil {
		t.Fatalf("send %s: %v", messageID, err)
	}
	if res.Status != primitive.SendOK || res.MessageQueue == nil {
		t.Fatalf("send %s: %+v", messageID, res)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.maxOffset == nil {
		s.maxOffset = map[int]int64{}
	}
	if cur, ok := s.maxOffset[res.MessageQueue.QueueId]; !ok || res.QueueOffset > cur {
		s.maxOffset[res.MessageQueue.QueueId] = res.QueueOffset
	}
	s.n++
}

func (s *rmqSentLog) queues() map[int]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int]int64{}
	for q, o := range s.maxOffset {
		out[q] = o + 1
	}
	return out
}

// rmqBrokerOffsets reads group's committed offset of every queue of topic
// from the broker (-1: none), through a pull consumer of the group in Assign
// mode with no queue assigned: CurrentOffset asks the broker for a queue the
// consumer does not hold. Call it only once the group's consumers are gone:
// the reader registers as a member of the group while it runs.
func rmqBrokerOffsets(t testing.TB, group, topic string, queues int) map[int]int64 {
	t.Helper()
	ns, _ := rmqEndpoints(t)
	pc, err := rocketmq.NewPullConsumer(
		rmqconsumer.WithGroupName(group),
		rmqconsumer.WithNsResolver(primitive.NewPassthroughResolver(ns)),
		rmqconsumer.WithInstance(rocketmqadapter.InstanceName("it-offsets")),
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Assign(topic, nil); err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pc.Shutdown() }()
	mqs, err := pc.GetTopicRouteInfo(topic)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]int64{}
	for _, mq := range mqs {
		off, err := pc.CurrentOffset(mq)
		if err != nil {
			t.Fatal(err)
		}
		out[mq.QueueId] = off
	}
	if len(out) != queues {
		t.Fatalf("offsets of %d queues, want %d: %v", len(out), queues, out)
	}
	return out
}

// rmqGroupLag is the group's lag on topic: the messages written (per the
// send log) minus the committed offset, summed over the queues.
func rmqGroupLag(t testing.TB, group, topic string, sent *rmqSentLog) (int64, map[int]int64) {
	t.Helper()
	committed := rmqBrokerOffsets(t, group, topic, 4)
	var lag int64
	for q, end := range sent.queues() {
		if c := max(committed[q], 0); c < end {
			lag += end - c
		}
	}
	return lag, committed
}

// rmqAllocations records, per consumer, the queues of a topic the client's
// last rebalance allocated to it (a wrapper of AllocateByAveragely given as
// the consumer's strategy).
type rmqAllocations struct {
	mu   sync.Mutex
	last map[string][]int // name → queue IDs of topic
}

func (a *rmqAllocations) strategy(name, topic string) rmqconsumer.AllocateStrategy {
	return func(group, cid string, mqAll []*primitive.MessageQueue, cidAll []string) []*primitive.MessageQueue {
		got := rmqconsumer.AllocateByAveragely(group, cid, mqAll, cidAll)
		if len(mqAll) > 0 && mqAll[0].Topic == topic {
			ids := make([]int, 0, len(got))
			for _, q := range got {
				ids = append(ids, q.QueueId)
			}
			a.mu.Lock()
			if a.last == nil {
				a.last = map[string][]int{}
			}
			a.last[name] = ids
			a.mu.Unlock()
		}
		return got
	}
}

func (a *rmqAllocations) of(name string) []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]int(nil), a.last[name]...)
}

// rmqMember is one consumer of a group in a progress test.
type rmqMember struct {
	name string
	stop func() // graceful stop; returns once the consumer is down
	// acked returns the offset acknowledged per queue ID: pull mode, the
	// offsets the Source committed; nil in push mode, where a listener's
	// answer is the acknowledgement.
	acked func() map[int]int64
}

// rmqProgressRun is the state shared by the members of one progress test.
type rmqProgressRun struct {
	t          *testing.T
	e          *env
	mode       string // "push": PushConsumer; "pull": Source under consumer.Run
	group      string
	topic      string
	delay      time.Duration // per handler run
	alloc      rmqAllocations
	deliveries atomic.Int64 // deliveries with an outcome, every member
	handled    atomic.Int64 // handler runs
	fetched    atomic.Int64 // pull mode: deliveries fetched (some dropped unhandled when their queue was revoked)
	reg        *prometheus.Registry
	metrics    *rocketmqadapter.QueueMetrics // shared by the members: one process
}

// rmqCountMetrics counts deliveries with an outcome.
type rmqCountMetrics struct{ n *atomic.Int64 }

func (m rmqCountMetrics) Delivery(string, dedup.Outcome, dedup.MatchedBy) { m.n.Add(1) }

func newProgressRun(t *testing.T, mode, prefix string, delay time.Duration) *rmqProgressRun {
	e := setup(t, nil)
	group := randomName(prefix)
	r := &rmqProgressRun{t: t, e: e, mode: mode, group: group, topic: rmqTopic(t, prefix, group), delay: delay, reg: prometheus.NewRegistry()}
	m, err := rocketmqadapter.NewQueueMetrics(r.reg, rmqCountMetrics{&r.deliveries})
	if err != nil {
		t.Fatal(err)
	}
	r.metrics = m
	return r
}

// metric sums the samples of the counter name over every label set.
func (r *rmqProgressRun) metric(name string) int64 {
	r.t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		r.t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return int64(sum)
}

// checkMetrics checks the per-queue counters against the deliveries seen:
// every delivery beyond the first of each message is a duplicate.
func (r *rmqProgressRun) checkMetrics(messages int64) {
	r.t.Helper()
	d, dup, re := r.metric("idemq_rocketmq_deliveries_total"), r.metric("idemq_rocketmq_duplicates_total"), r.metric("idemq_rocketmq_redeliveries_total")
	r.t.Logf("%s: metrics: deliveries %d, duplicates %d, redeliveries %d", r.mode, d, dup, re)
	if d != r.deliveries.Load() || dup != d-messages {
		r.t.Errorf("%s: idemq_rocketmq_deliveries_total %d, duplicates %d; want %d and %d", r.mode, d, dup, r.deliveries.Load(), r.deliveries.Load()-messages)
	}
	if re > dup {
		r.t.Errorf("%s: %d redeliveries counted, more than the %d duplicates", r.mode, re, dup)
	}
}

func (r *rmqProgressRun) handler(ctx context.Context, _ pgx.Tx, _ *dedup.Message) error {
	r.handled.Add(1)
	if r.delay > 0 {
		select {
		case <-time.After(r.delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (r *rmqProgressRun) consumerConfig() consumer.Config {
	return consumer.Config{Scope: r.group, Store: r.e.store, Handler: r.handler, ShutdownGrace: 20 * time.Second, Metrics: r.metrics}
}

func (r *rmqProgressRun) start(name string) *rmqMember {
	r.t.Helper()
	ns, _ := rmqEndpoints(r.t)
	switch r.mode {
	case "push":
		c, err := consumer.New(r.consumerConfig())
		if err != nil {
			r.t.Fatal(err)
		}
		pc, err := rocketmqadapter.NewPushConsumer(c, rocketmqadapter.Config{
			NameServers: ns, Group: r.group, Topic: r.topic,
			InstanceName: rocketmqadapter.InstanceName("it-" + name),
			ClientOptions: []rmqconsumer.Option{rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset),
				rmqconsumer.WithStrategy(r.alloc.strategy(name, r.topic))},
		})
		if err != nil {
			r.t.Fatal(err)
		}
		if err := pc.Start(); err != nil {
			r.t.Fatal(err)
		}
		var once sync.Once
		stop := func() {
			once.Do(func() {
				if err := pc.Shutdown(); err != nil {
					r.t.Errorf("%s: shutdown: %v", name, err)
				}
			})
		}
		r.t.Cleanup(stop)
		return &rmqMember{name: name, stop: stop}
	case "pull":
		src, err := rocketmqadapter.NewSource(rocketmqadapter.SourceConfig{
			NameServers: ns, Group: r.group, Topic: r.topic, InstanceName: rocketmqadapter.InstanceName("it-" + name),
			ClientOptions: []rmqconsumer.Option{rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset)},
			Strategy:      r.alloc.strategy(name, r.topic),
		})
		if err != nil {
			r.t.Fatal(err)
		}
		c, err := consumer.New(r.consumerConfig())
		if err != nil {
			r.t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() { ran <- c.Run(ctx, &rmqCountingSource{Source: src, n: &r.fetched}) }()
		var once sync.Once
		stop := func() {
			once.Do(func() {
				cancel()
				if err := <-ran; err != nil {
					r.t.Errorf("%s: run: %v", name, err)
				}
			})
		}
		r.t.Cleanup(stop)
		acked := func() map[int]int64 {
			out := map[int]int64{}
			for mq, off := range src.Offsets() {
				if mq.Topic == r.topic {
					out[mq.QueueId] = off
				}
			}
			return out
		}
		return &rmqMember{name: name, stop: stop, acked: acked}
	default:
		r.t.Fatalf("unknown mode %q", r.mode)
		return nil
	}
}

// rmqCountingSource counts the deliveries a Source hands to consumer.Run.
type rmqCountingSource struct {
	*rocketmqadapter.Source
	n *atomic.Int64
}

func (s *rmqCountingSource) Fetch(ctx context.Context) (consumer.Delivery, error) {
	d, err := s.Source.Fetch(ctx)
	if err == nil {
		s.n.Add(1)
	}
	return d, err
}

// done is the number of messages with a SUCCEEDED record.
func (r *rmqProgressRun) done() int {
	return r.e.count(`select count(*) from ` + r.e.table("consumption_records") + ` where status = 'SUCCEEDED'`)
}

// owns reports whether name was allocated at least lo and at most hi
// queues of the topic by its last rebalance.
func (r *rmqProgressRun) owns(name string, lo, hi int) bool {
	n := len(r.alloc.of(name))
	return n >= lo && n <= hi
}

// stopAll stops the members at once (both SIGTERMed together).
func stopAll(ms ...*rmqMember) {
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Add(1)
		go func() { defer wg.Done(); m.stop() }()
	}
	wg.Wait()
}

// settle waits until no delivery arrived for quiet (late copies of a
// rebalance), at most limit.
func (r *rmqProgressRun) settle(quiet, limit time.Duration) {
	deadline := time.Now().Add(limit)
	last, since := r.deliveries.Load(), time.Now()
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		if n := r.deliveries.Load(); n != last {
			last, since = n, time.Now()
		} else if time.Since(since) >= quiet {
			return
		}
	}
}

// TestRocketMQRebalanceKeepsProgress: consumer A alone consumes and acks
// messages on every queue; B joins (a rebalance moves two queues to B); once
// B owns its queues both stop gracefully. With the pull Source the broker's
// committed offsets then cover every message (lag 0) and nothing was
// delivered twice: nothing was in flight at the rebalance. The push consumer
// runs the same steps and reports its loss (a documented limitation of the
// client) in the per-queue metrics, which the test checks in both modes.
func TestRocketMQRebalanceKeepsProgress(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"push", "pull"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testRebalanceKeepsProgress(t, mode)
		})
	}
}

func testRebalanceKeepsProgress(t *testing.T, mode string) {
	r := newProgressRun(t, mode, "it-rb-", 0)
	group := r.group
	var sent rmqSentLog
	p := rmqProducer(t)

	a := r.start("a")
	eventually(t, 60*time.Second, "a to own the 4 queues", func() bool { return r.owns("a", 4, 4) })
	const messages = 8
	for i := range messages {
		sent.send(t, p, r.topic, []byte("x"), fmt.Sprintf("rb-%d", i))
	}
	if q := sent.queues(); len(q) != 4 {
		t.Fatalf("messages landed on queues %v, want all 4", q)
	}
	eventually(t, 60*time.Second, "a to process every message", func() bool { return r.done() == messages })
	if a.acked != nil {
		eventually(t, 30*time.Second, "a to commit every message", func() bool {
			acked := a.acked()
			for q, end := range sent.queues() {
				if acked[q] != end {
					return false
				}
			}
			return true
		})
	}
	inFlight := r.deliveries.Load() - messages // 0: every delivery so far processed a new message

	b := r.start("b")
	eventually(t, 90*time.Second, "b to own queues and a to give them up", func() bool { return r.owns("b", 1, 3) && r.owns("a", 1, 3) })
	r.settle(3*time.Second, 30*time.Second)
	stopAll(a, b)

	lag, committed := rmqGroupLag(t, group, r.topic, &sent)
	redelivered := r.deliveries.Load() - messages
	t.Logf("%s: %d deliveries for %d messages (%d redelivered, %d in flight at the rebalance); lag after stop %d (committed %v, written %v); a owned %v, b %v",
		mode, r.deliveries.Load(), messages, redelivered, inFlight, lag, committed, sent.queues(), r.alloc.of("a"), r.alloc.of("b"))
	r.checkMetrics(messages)
	if r.handled.Load() != messages {
		t.Errorf("%s: %d handler runs for %d messages", mode, r.handled.Load(), messages)
	}
	if mode == "push" {
		// The push consumer's offsets are the client's: the loss is a
		// documented limitation (package doc, "Progress across
		// rebalances"), measured here and visible in the metrics checked
		// above, not a guarantee.
		t.Logf("push (documented limitation): lag %d, %d redelivered", lag, redelivered)
		return
	}
	if lag != 0 {
		t.Errorf("%s: broker lag after a graceful stop = %d, want 0 (committed %v, written %v)", mode, lag, committed, sent.queues())
	}
	if redelivered > inFlight {
		t.Errorf("%s: %d messages redelivered after the rebalance, want at most the %d in flight", mode, redelivered, inFlight)
	}
}

// TestRocketMQBacklogRebalanceDeliveries: N messages are written first, then
// consumed by A and B; C joins a quarter of the way, A leaves gracefully half
// way. With the pull Source deliveries stay within 1.2 × N, and after B and C
// stop gracefully the broker lag is 0. The push consumer's numbers are
// measured and logged (documented limitation); in both modes every message
// runs its handler once and the per-queue metrics count every duplicate.
func TestRocketMQBacklogRebalanceDeliveries(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"push", "pull"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testBacklogRebalance(t, mode)
		})
	}
}

func testBacklogRebalance(t *testing.T, mode string) {
	r := newProgressRun(t, mode, "it-bl-", 10*time.Millisecond)
	group := r.group
	var sent rmqSentLog
	p := rmqProducer(t)
	const messages = 3000
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < messages; i += 4 {
				sent.send(t, p, r.topic, []byte("backlog"), fmt.Sprintf("bl-%d", i))
			}
		}()
	}
	wg.Wait()

	started := time.Now()
	a, b := r.start("a"), r.start("b")
	eventually(t, 120*time.Second, "a quarter of the backlog", func() bool { return r.done() >= messages/4 })
	c := r.start("c")
	eventually(t, 90*time.Second, "c to own queues", func() bool { return r.owns("c", 1, 2) })
	eventually(t, 120*time.Second, "half of the backlog", func() bool { return r.done() >= messages/2 })
	a.stop()
	eventually(t, 180*time.Second, "every message processed", func() bool { return r.done() == messages })
	r.settle(3*time.Second, 30*time.Second)
	stopAll(b, c)
	took := time.Since(started)

	lag, committed := rmqGroupLag(t, group, r.topic, &sent)
	d := r.deliveries.Load()
	t.Logf("%s: %d deliveries for %d messages (%.2f per message, %d handler runs, %d fetched) in %s; lag after stop %d (committed %v, written %v)",
		mode, d, messages, float64(d)/messages, r.handled.Load(), r.fetched.Load(), took.Round(time.Millisecond), lag, committed, sent.queues())
	r.checkMetrics(messages)
	if h := r.handled.Load(); h != messages {
		t.Errorf("%s: %d handler runs for %d messages", mode, h, messages)
	}
	if mode == "push" {
		t.Logf("push (documented limitation): %.2f deliveries per message, lag %d", float64(d)/messages, lag)
		return
	}
	if limit := int64(messages * 12 / 10); d > limit {
		t.Errorf("%s: %d deliveries for %d messages, want at most %d (1.2 per message)", mode, d, messages, limit)
	}
	if lag != 0 {
		t.Errorf("%s: broker lag after a graceful stop = %d, want 0", mode, lag)
	}
}
