package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/segmentio/kafka-go"
)

// Generation-fenced commits: consumer A holds deliveries of every partition
// (one in hand, blocked before its claim, the rest fetched and waiting in its
// lanes) when consumer B joins the group. The rebalance hands some of A's
// partitions to B, which processes them to the end and commits. Then A's
// deliveries complete and A stops. A must not commit a partition it lost
// (with the old kafka-go Reader it did, under the new generation, moving the
// group offset back to where A had stopped), the group's committed offset of
// every partition never decreases (read with the admin API after every
// commit and every 5ms in between), every message is applied once, and the
// replays are bounded by what A held in hand: A commits its completed
// offsets when its generation ends (it commits at no other time before it
// stops), so B starts after them, and A's waiting deliveries of a revoked
// partition are dropped, not handled. Run in every mode of the runtime:
// atomic, batched, lease on Postgres, lease on the Redis-only store.
func TestKafkaGenerationFencedCommits(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"atomic", "batched", "lease", "redis-lease"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testGenerationFence(t, mode)
		})
	}
}

func testGenerationFence(t *testing.T, mode string) {
	const partitions, perPartition, before = 4, 40, 5
	e := setup(t, nil)
	topic, group := newTopic(t, partitions), randomName("g-")
	var msgs []kmsg
	for i := range partitions * perPartition {
		msgs = append(msgs, kmsg{id: fmt.Sprintf("m-%03d", i), payload: fmt.Sprint(i)})
	}
	produce(t, topic, msgs...)
	ends := partitionEnds(t, topic, partitions)

	w := newOffsetWatch(t, group, topic, partitions)
	stopPolling := w.poll()
	defer stopPolling()

	a := newApplier(e.appliesTable())
	var store consumer.Store = e.store
	if mode == "redis-lease" {
		store = newRedisStore(t, nil) // shared by A and B
	}
	batch := 1
	config := func(bk consumer.BusinessKeyFunc, m consumer.Metrics) consumer.Config {
		cfg := consumer.Config{Scope: group, Store: store, BusinessKey: bk, Metrics: m, Handler: a.handler()}
		switch mode {
		case "batched":
			batch = 4
			cfg.BatchSize, cfg.BatchWait = batch, 20*time.Millisecond
		case "lease", "redis-lease":
			cfg.Handler = nil
			cfg.LeaseHandler = func(_ context.Context, m *dedup.Message) error {
				a.mu.Lock()
				defer a.mu.Unlock()
				a.calls[m.Identity.MessageID]++
				return nil
			}
		}
		return cfg
	}

	// A lets `before` deliveries of each partition through, then holds the
	// next one in hand (in its business-key extractor: before any claim, so
	// B is not blocked by a row lock or a lease) until release. A commits
	// only when a generation ends and when it stops: what B starts from is
	// what A's flush on revoke committed.
	release := make(chan struct{})
	var held atomic.Int32
	var seen, last [partitions]atomic.Int64
	gate := func(m *dedup.Message) (string, error) {
		if m.Offset > last[m.Partition].Load() {
			last[m.Partition].Store(m.Offset)
		}
		if seen[m.Partition].Add(1) > before {
			held.Add(1)
			<-release
		}
		return "", nil
	}
	var countersA, countersB consumer.Counters
	srcA := &countingSource{inner: fenceSource(t, group, topic, "idemq-a", w)}
	cfgA := config(gate, &countersA)
	cfgA.CommitEvery, cfgA.CommitInterval = 1_000_000, time.Hour
	rA := startConsumer(t, cfgA, srcA)
	eventually(t, 60*time.Second, "A to hold a delivery of every partition and to have fetched the rest", func() bool {
		return held.Load() >= partitions && srcA.fetchedAll(ends)
	})

	// B joins: the group rebalances while A holds them.
	rB := startConsumer(t, config(nil, &countersB), fenceSource(t, group, topic, "idemq-b", w))
	var lost []int
	eventually(t, 90*time.Second, "the rebalance to give B partitions", func() bool {
		lost = assignedTo(t, group, topic, "idemq-b")
		return len(lost) > 0 && len(lost) < partitions && len(assignedTo(t, group, topic, "idemq-a")) == partitions-len(lost)
	})
	eventually(t, 90*time.Second, fmt.Sprintf("B to commit its partitions %v to the end", lost), func() bool {
		offs := committedOffsets(t, group, topic, partitions)
		for _, p := range lost {
			if offs[p] != ends[p] {
				return false
			}
		}
		return true
	})
	w.lost("idemq-a", lost)

	// A's deliveries complete now, those of the partitions it lost included;
	// A reads its own partitions to the end, then stops (its last flush).
	close(release)
	eventually(t, 90*time.Second, "every message to be applied and A to reach the end of its partitions", func() bool {
		a.mu.Lock()
		n := len(a.calls)
		a.mu.Unlock()
		for p, end := range ends {
			if !slices.Contains(lost, p) && last[p].Load() < end-1 {
				return false
			}
		}
		return n == len(msgs)
	})
	rA.stop(t)
	waitCaughtUp(t, group, topic)
	rB.stop(t)
	stopPolling()

	v, history, hooks := w.result()
	if len(v) > 0 {
		t.Errorf("the group's committed offsets went backwards or a lost partition was committed:\n  %s\nhistory per partition: %v",
			strings.Join(v, "\n  "), history)
	}
	if hooks == 0 {
		t.Error("no commit was observed through the kafka-go logger: the observation hook is broken")
	}
	// Every message applied exactly once.
	a.mu.Lock()
	for _, m := range msgs {
		if n := a.calls[m.id]; n != 1 {
			t.Errorf("message %s applied %d times, want 1", m.id, n)
		}
	}
	a.mu.Unlock()
	if mode == "atomic" || mode == "batched" {
		if n := e.count(`select count(distinct message_id) from ` + a.table + ` where message_id like 'm-%'`); n != len(msgs) || e.count(`select count(*) from `+a.table) != len(msgs) {
			t.Errorf("applied rows: %d distinct of %d rows, want %d each", n, e.count(`select count(*) from `+a.table), len(msgs))
		}
	}
	// Replays: only what A held in hand (one delivery, or one batch, per
	// partition) is handled twice: the fetched deliveries waiting in A's
	// lanes of the partitions it lost are dropped.
	dups := countersA.Get("duplicate") + countersB.Get("duplicate")
	if limit := int64(partitions * batch); dups > limit {
		t.Errorf("duplicates = %d (A %v, B %v), want at most %d (one hand per partition)", dups, countersA.Snapshot(), countersB.Snapshot(), limit)
	}
	t.Logf("%s: B took %v; duplicates %d; A %v; B %v; %d commits observed; offsets seen %v", mode, lost, dups,
		countersA.Snapshot(), countersB.Snapshot(), hooks, history)
}

// fenceSource is a Kafka source whose kafka-go logger reports each offset
// commit to w, which then reads the group's offsets.
func fenceSource(t testing.TB, group, topic, clientID string, w *offsetWatch) *kafkaadapter.Source {
	t.Helper()
	rc := readerConfig(t, group, topic)
	rc.Dialer = &kafka.Dialer{ClientID: clientID, Timeout: 10 * time.Second, DualStack: true}
	rc.Logger = kafka.LoggerFunc(func(msg string, args ...any) {
		// kafka-go's Generation.CommitOffsets logs each successful commit.
		if !strings.HasPrefix(msg, "committed offsets for group") || len(args) != 2 {
			return
		}
		report, _ := args[1].(string)
		var parts []int
		for _, line := range strings.Split(report, "\n") {
			var p int
			var off int64
			if n, _ := fmt.Sscanf(strings.TrimSpace(line), "partition %d: %d", &p, &off); n == 2 {
				parts = append(parts, p)
			}
		}
		w.committed(clientID, parts)
	})
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{Reader: rc})
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// countingSource counts the deliveries fetched per partition. It passes the
// optional interfaces of the source it wraps through.
type countingSource struct {
	inner   *kafkaadapter.Source
	mu      sync.Mutex
	fetched map[int]int64 // partition -> highest offset fetched + 1
}

func (c *countingSource) Fetch(ctx context.Context) (consumer.Delivery, error) {
	d, err := c.inner.Fetch(ctx)
	if err == nil {
		c.mu.Lock()
		if c.fetched == nil {
			c.fetched = map[int]int64{}
		}
		c.fetched[d.Message.Partition] = max(c.fetched[d.Message.Partition], d.Offset+1)
		c.mu.Unlock()
	}
	return d, err
}

func (c *countingSource) Commit(ctx context.Context, done []consumer.Delivery) error {
	return c.inner.Commit(ctx, done)
}

func (c *countingSource) Close() error { return c.inner.Close() }

func (c *countingSource) RedeliveryHorizon(ctx context.Context) (time.Duration, error) {
	return c.inner.RedeliveryHorizon(ctx)
}

// revocable is consumer.Revocable, spelled out so that this file also
// builds against a source without it.
type revocable interface {
	LaneContext(d consumer.Delivery) context.Context
	OnRevoke(flush func(ctx context.Context))
}

func (c *countingSource) LaneContext(d consumer.Delivery) context.Context {
	if r, ok := any(c.inner).(revocable); ok {
		return r.LaneContext(d)
	}
	return nil
}

func (c *countingSource) OnRevoke(flush func(ctx context.Context)) {
	if r, ok := any(c.inner).(revocable); ok {
		r.OnRevoke(flush)
	}
}

func (c *countingSource) fetchedAll(ends map[int]int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p, end := range ends {
		if c.fetched[p] < end {
			return false
		}
	}
	return true
}

// partitionEnds returns the end offset of each partition of topic.
func partitionEnds(t testing.TB, topic string, partitions int) map[int]int64 {
	t.Helper()
	cl := &kafka.Client{Addr: kafka.TCP(kafkaBrokers(t)...), Timeout: 10 * time.Second}
	var reqs []kafka.OffsetRequest
	for p := range partitions {
		reqs = append(reqs, kafka.LastOffsetOf(p))
	}
	resp, err := cl.ListOffsets(context.Background(), &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		t.Fatal(err)
	}
	ends := map[int]int64{}
	for _, po := range resp.Topics[topic] {
		if po.Error != nil {
			t.Fatal(po.Error)
		}
		ends[po.Partition] = po.LastOffset
	}
	if len(ends) != partitions {
		t.Fatalf("end offsets of %d partitions, want %d", len(ends), partitions)
	}
	return ends
}

// assignedTo returns the partitions of topic that the group's member with
// clientID owns in the group's stable generation (nil while it rebalances).
func assignedTo(t testing.TB, group, topic, clientID string) []int {
	t.Helper()
	cl := &kafka.Client{Addr: kafka.TCP(kafkaBrokers(t)...), Timeout: 10 * time.Second}
	resp, err := cl.DescribeGroups(context.Background(), &kafka.DescribeGroupsRequest{GroupIDs: []string{group}})
	if err != nil || len(resp.Groups) != 1 || resp.Groups[0].Error != nil || resp.Groups[0].GroupState != "Stable" {
		return nil
	}
	var out []int
	for _, m := range resp.Groups[0].Members {
		if m.ClientID != clientID {
			continue
		}
		for _, at := range m.MemberAssignments.Topics {
			if at.Topic == topic {
				out = append(out, at.Partitions...)
			}
		}
	}
	slices.Sort(out)
	return out
}

// offsetWatch records every committed offset of a group's partitions it
// reads (after each commit, and every 5ms), and flags a decrease, or a
// commit by a member of a partition it lost.
type offsetWatch struct {
	t            testing.TB
	cl           *kafka.Client
	group, topic string
	parts        []int

	mu         sync.Mutex // held across each read, so reads are recorded in order
	last       map[int]int64
	history    map[int][]int64
	violations []string
	hooks      int
	lostBy     map[string][]int // client ID -> partitions it lost
}

func newOffsetWatch(t testing.TB, group, topic string, partitions int) *offsetWatch {
	w := &offsetWatch{t: t, cl: &kafka.Client{Addr: kafka.TCP(kafkaBrokers(t)...), Timeout: 10 * time.Second},
		group: group, topic: topic, last: map[int]int64{}, history: map[int][]int64{}, lostBy: map[string][]int{}}
	for p := range partitions {
		w.parts = append(w.parts, p)
	}
	return w
}

// read reads the group's committed offsets and records them; w.mu held.
func (w *offsetWatch) read(why string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := w.cl.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: w.group, Topics: map[string][]int{w.topic: w.parts}})
	if err != nil || resp.Error != nil {
		return // a read that failed observes nothing
	}
	for _, p := range resp.Topics[w.topic] {
		off := p.CommittedOffset
		if p.Error != nil || off < 0 {
			continue
		}
		prev, ok := w.last[p.Partition]
		if ok && off < prev {
			w.violations = append(w.violations, fmt.Sprintf("partition %d: committed offset %d after %d (read %s)", p.Partition, off, prev, why))
		}
		if !ok || off != prev {
			w.history[p.Partition] = append(w.history[p.Partition], off)
		}
		w.last[p.Partition] = off
	}
}

// committed is called after each commit by clientID of parts.
func (w *offsetWatch) committed(clientID string, parts []int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.hooks++
	for _, p := range parts {
		if slices.Contains(w.lostBy[clientID], p) {
			w.violations = append(w.violations, fmt.Sprintf("%s committed partition %d after the rebalance gave it to another member", clientID, p))
		}
	}
	w.read("after a commit by " + clientID)
}

// lost records that clientID no longer owns parts.
func (w *offsetWatch) lost(clientID string, parts []int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lostBy[clientID] = parts
}

// poll reads the offsets every 5ms until the returned stop is called.
func (w *offsetWatch) poll() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				w.mu.Lock()
				w.read("by the poller")
				w.mu.Unlock()
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { cancel(); <-done }) }
}

func (w *offsetWatch) result() (violations []string, history map[int][]int64, hooks int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.violations...), w.history, w.hooks
}
