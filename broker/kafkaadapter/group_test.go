package kafkaadapter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/segmentio/kafka-go"
)

// recordingCommitter stands in for a kafka.Generation: it records each
// CommitOffsets request with its generation ID and can fail them.
type recordingCommitter struct {
	id   int32
	log  *commitLog
	fail error
}

type commitLog struct {
	mu      sync.Mutex
	commits []sentCommit
}

type sentCommit struct {
	gen     int32
	offsets map[string]map[int]int64
}

func (r *recordingCommitter) CommitOffsets(offsets map[string]map[int]int64) error {
	if r.fail != nil {
		return r.fail
	}
	r.log.mu.Lock()
	defer r.log.mu.Unlock()
	cp := map[string]map[int]int64{}
	for t, ps := range offsets {
		cp[t] = maps.Clone(ps)
	}
	r.log.commits = append(r.log.commits, sentCommit{gen: r.id, offsets: cp})
	return nil
}

func (l *commitLog) all() []sentCommit {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]sentCommit(nil), l.commits...)
}

// join makes s own the partitions of topic "t" in generation id, with the
// group's committed offsets (kafka.FirstOffset: none).
func join(s *Source, id int32, log *commitLog, committed map[int]int64) (*generation, []*claim, *recordingCommitter) {
	rc := &recordingCommitter{id: id, log: log}
	g := &generation{id: id, commit: rc}
	var pas []kafka.PartitionAssignment
	for p, off := range committed {
		pas = append(pas, kafka.PartitionAssignment{ID: p, Offset: off})
	}
	return g, s.claim(g, map[string][]kafka.PartitionAssignment{"t": pas}), rc
}

// fetch returns the delivery of offset off of partition p, read for c.
func fetchFor(t *testing.T, s *Source, c *claim, p int, off int64) consumer.Delivery {
	t.Helper()
	d, ok := s.deliver(kafka.Message{Topic: "t", Partition: p, Offset: off}, c)
	if !ok {
		t.Fatalf("offset %d of partition %d was not delivered", off, p)
	}
	return d
}

func claimOf(claims []*claim, p int) *claim {
	for _, c := range claims {
		if c.tp.partition == p {
			return c
		}
	}
	return nil
}

// Commits carry the generation that owns the partition, go only forward,
// and skip what is committed already.
func TestCommitWithOwningGenerationNeverBackwards(t *testing.T) {
	s, log := testSource(nil), &commitLog{}
	_, claims, _ := join(s, 5, log, map[int]int64{0: 10, 1: kafka.FirstOffset})
	c0, c1 := claimOf(claims, 0), claimOf(claims, 1)
	if c0.start != 10 || c1.start != kafka.FirstOffset {
		t.Fatalf("starts = %d, %d; want 10 and FirstOffset", c0.start, c1.start)
	}
	ctx := context.Background()
	d11 := fetchFor(t, s, c0, 0, 11)
	if err := s.Commit(ctx, []consumer.Delivery{fetchFor(t, s, c0, 0, 12), fetchFor(t, s, c1, 1, 3)}); err != nil {
		t.Fatal(err)
	}
	// Lower or equal offsets: nothing is sent.
	if err := s.Commit(ctx, []consumer.Delivery{d11}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, []consumer.Delivery{ToDelivery(kafka.Message{Topic: "t", Partition: 0, Offset: 12}, "")}); err != nil {
		t.Fatal(err)
	}
	got := log.all()
	if len(got) != 1 || got[0].gen != 5 || got[0].offsets["t"][0] != 13 || got[0].offsets["t"][1] != 4 {
		t.Fatalf("commits = %+v, want one with generation 5: t/0→13, t/1→4", got)
	}
	if err := s.Commit(ctx, []consumer.Delivery{{Position: "x", Ack: "not kafka"}}); err == nil {
		t.Fatal("a foreign delivery was accepted")
	}
}

// When a generation ends, its claims' lane contexts end, Run's flush commits
// with the ending generation, and afterwards nothing of it is committed:
// not with it, and not with any later generation that does not own the
// partition.
func TestRevokeFlushesThenFencesTheGeneration(t *testing.T) {
	s, log := testSource(nil), &commitLog{}
	g5, claims, _ := join(s, 5, log, map[int]int64{0: 10, 1: 20})
	c0 := claimOf(claims, 0)
	d10, d11, d12 := fetchFor(t, s, c0, 0, 10), fetchFor(t, s, c0, 0, 11), fetchFor(t, s, c0, 0, 12)
	lc := s.LaneContext(d12)
	if lc == nil || lc.Err() != nil {
		t.Fatal("a live claim's lane context must be live")
	}
	flushed := false
	s.OnRevoke(func(context.Context) {
		// Run's flush: 10 was completed before the revocation.
		flushed = true
		if lc.Err() == nil {
			t.Error("flush ran before the lanes were revoked")
		}
		if err := s.Commit(context.Background(), []consumer.Delivery{d10}); err != nil {
			t.Error(err)
		}
	})
	s.revoke(g5, claims)
	if !flushed || lc.Err() == nil {
		t.Fatalf("flushed %v, lane context %v; want a flush and an ended context", flushed, lc.Err())
	}
	// Buffered after the revocation: dropped, never delivered.
	if _, ok := s.deliver(kafka.Message{Topic: "t", Partition: 0, Offset: 13}, c0); ok {
		t.Fatal("a message of a revoked claim was delivered")
	}
	// Partition 0 moved to another member; this one owns partition 1 in
	// generation 6. 11 completes late (it was in hand): not committed.
	_, claims6, _ := join(s, 6, log, map[int]int64{1: 20})
	if err := s.Commit(context.Background(), []consumer.Delivery{d11, fetchFor(t, s, claimOf(claims6, 1), 1, 25)}); err != nil {
		t.Fatal(err)
	}
	got := log.all()
	if len(got) != 2 || got[0].gen != 5 || got[0].offsets["t"][0] != 11 || len(got[0].offsets["t"]) != 1 ||
		got[1].gen != 6 || got[1].offsets["t"][1] != 26 || len(got[1].offsets["t"]) != 1 {
		t.Fatalf("commits = %+v, want t/0→11 with generation 5 (the flush), then only t/1→26 with generation 6", got)
	}
	if st := s.Stats(); st.DroppedCommits != 1 || st.DroppedDeliveries != 1 || st.Generation != 6 || len(st.Assigned["t"]) != 1 || st.Generations != 2 {
		t.Fatalf("stats = %+v", st)
	}
	// A commit racing the close of its generation is dropped too.
	if err := s.commitGen(g5, map[topicPartition]int64{{"t", 0}: 13}); err != nil || len(log.all()) != 2 {
		t.Fatalf("commit with a closed generation: %v, %d commits", err, len(log.all()))
	}
}

// A member that owns a partition again commits what it completed under an
// earlier generation with the current one, never below the group's
// committed offset, and reads on after it instead of from the group's
// offset.
func TestReownedPartitionContinuesAfterCompleted(t *testing.T) {
	s, log := testSource(nil), &commitLog{}
	g5, claims, _ := join(s, 5, log, map[int]int64{0: 10})
	c0 := claimOf(claims, 0)
	d14, d30 := fetchFor(t, s, c0, 0, 14), fetchFor(t, s, c0, 0, 30)
	s.revoke(g5, claims)
	// 14 completes while nobody owns the partition: dropped, remembered.
	if err := s.Commit(context.Background(), []consumer.Delivery{d14}); err != nil || len(log.all()) != 0 {
		t.Fatalf("commit without owner: %v, %v", err, log.all())
	}
	// Generation 7: the group's offset is still 10; this member reads from 15.
	_, claims7, _ := join(s, 7, log, map[int]int64{0: 10})
	c7 := claimOf(claims7, 0)
	if c7.start != 15 || c7.next != 10 {
		t.Fatalf("claim start %d next %d, want 15 and 10", c7.start, c7.next)
	}
	if _, ok := s.deliver(kafka.Message{Topic: "t", Partition: 0, Offset: 13}, c7); ok {
		t.Fatal("an offset completed already was delivered again")
	}
	// Generation 8, after another member committed 25: the late 30 (from
	// generation 5) is above it and commits with generation 8; a late 20
	// would go backwards and is not sent.
	_, claims8, _ := join(s, 8, log, map[int]int64{0: 25})
	if c := claimOf(claims8, 0); c.start != 25 {
		t.Fatalf("claim start %d, want the group's 25", c.start)
	}
	if err := s.Commit(context.Background(), []consumer.Delivery{ToDelivery(kafka.Message{Topic: "t", Partition: 0, Offset: 20}, "")}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(context.Background(), []consumer.Delivery{d30}); err != nil {
		t.Fatal(err)
	}
	got := log.all()
	if len(got) != 1 || got[0].gen != 8 || got[0].offsets["t"][0] != 31 {
		t.Fatalf("commits = %+v, want only t/0→31 with generation 8", got)
	}
}

// A commit the broker refuses because the group moved on is dropped and
// fences the generation; other errors are returned for a retry.
func TestCommitRefusedByBrokerFencesGeneration(t *testing.T) {
	for _, refusal := range []error{kafka.IllegalGeneration, kafka.UnknownMemberId, kafka.RebalanceInProgress} {
		s, log := testSource(nil), &commitLog{}
		g, claims, rc := join(s, 3, log, map[int]int64{0: 0})
		rc.fail = refusal
		d := fetchFor(t, s, claimOf(claims, 0), 0, 5)
		if err := s.Commit(context.Background(), []consumer.Delivery{d}); err != nil {
			t.Fatalf("%v: Commit = %v, want nil (dropped)", refusal, err)
		}
		if !g.fenced.Load() || s.Stats().DroppedCommits != 1 {
			t.Fatalf("%v: fenced %v, stats %+v", refusal, g.fenced.Load(), s.Stats())
		}
		rc.fail = nil
		if err := s.Commit(context.Background(), []consumer.Delivery{fetchFor(t, s, claimOf(claims, 0), 0, 6)}); err != nil || len(log.all()) != 0 {
			t.Fatalf("%v: commit after the refusal: %v, %v", refusal, err, log.all())
		}
	}
	s, log := testSource(nil), &commitLog{}
	g, claims, rc := join(s, 3, log, map[int]int64{0: 0})
	rc.fail = &net.OpError{Op: "write", Err: errors.New("broken pipe")}
	d := fetchFor(t, s, claimOf(claims, 0), 0, 5)
	if err := s.Commit(context.Background(), []consumer.Delivery{d}); err == nil || g.fenced.Load() {
		t.Fatalf("network error: Commit = %v, fenced %v; want the error, not fenced", err, g.fenced.Load())
	}
	rc.fail = nil
	if err := s.Commit(context.Background(), []consumer.Delivery{d}); err != nil || len(log.all()) != 1 {
		t.Fatalf("retry: %v, %v", err, log.all())
	}
}

// Closing gives the generation up without calling the flush (Run flushed
// before it closed the source).
func TestCloseSkipsFlush(t *testing.T) {
	s, log := testSource(nil), &commitLog{}
	g, claims, _ := join(s, 1, log, map[int]int64{0: 0})
	s.OnRevoke(func(context.Context) { t.Error("flush called while closing") })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s.revoke(g, claims)
	if _, err := s.Fetch(context.Background()); !errors.Is(err, io.EOF) {
		t.Fatalf("Fetch after Close = %v, want io.EOF", err)
	}
}

// Errors of the group reach Fetch: a closed coordinator connection is
// retried, a final Kafka error is not.
func TestGroupErrors(t *testing.T) {
	if err := groupError(fmt.Errorf("join: %w", io.EOF)); !fetchRetriable(err) || errors.Is(err, io.EOF) {
		t.Fatalf("closed coordinator connection: %v, retriable %v", err, fetchRetriable(err))
	}
	if err := groupError(kafka.RebalanceInProgress); !fetchRetriable(err) {
		t.Fatalf("rebalance in progress: %v not retriable", err)
	}
	if err := groupError(kafka.GroupAuthorizationFailed); fetchRetriable(err) || !errors.Is(err, kafka.GroupAuthorizationFailed) {
		t.Fatalf("authorization: %v", err)
	}
}

// The lag gauge is the newest fetched high watermark minus the committed
// offset, per partition owned in the generation in hand; a partition not
// fetched yet has none, and a revoked generation's partitions disappear.
func TestLagFollowsWatermarkAndCommits(t *testing.T) {
	s, log := testSource(nil), &commitLog{}
	g, claims, _ := join(s, 7, log, map[int]int64{0: 10, 1: kafka.FirstOffset})
	c0 := claimOf(claims, 0)
	if got := s.lags(); len(got) != 0 {
		t.Fatalf("lags before any fetch = %+v, want none", got)
	}
	d, ok := s.deliver(kafka.Message{Topic: "t", Partition: 0, Offset: 10, HighWaterMark: 30}, c0)
	if !ok {
		t.Fatal("offset 10 not delivered")
	}
	if got := s.lags(); len(got) != 1 || got[0].lag != 20 || got[0].partition != 0 {
		t.Fatalf("lags = %+v, want t/0: 30-10 = 20", got)
	}
	if err := s.Commit(context.Background(), []consumer.Delivery{d}); err != nil {
		t.Fatal(err)
	}
	if got := s.lags(); len(got) != 1 || got[0].lag != 19 {
		t.Fatalf("lags after committing offset 10 = %+v, want 30-11 = 19", got)
	}
	// An older message's watermark never lowers the known one.
	if _, ok := s.deliver(kafka.Message{Topic: "t", Partition: 0, Offset: 11, HighWaterMark: 25}, c0); !ok {
		t.Fatal("offset 11 not delivered")
	}
	if got := s.lags(); got[0].lag != 19 {
		t.Fatalf("lags after a stale watermark = %+v, want 19", got)
	}
	s.revoke(g, claims)
	if got := s.lags(); len(got) != 0 {
		t.Fatalf("lags after the generation ended = %+v, want none", got)
	}
}

// scriptedCounts returns the partition counts in order, the last one from
// then on.
func scriptedCounts(counts ...map[string]int) func(context.Context) (map[string]int, error) {
	var mu sync.Mutex
	return func(context.Context) (map[string]int, error) {
		mu.Lock()
		defer mu.Unlock()
		c := counts[0]
		if len(counts) > 1 {
			counts = counts[1:]
		}
		return c, nil
	}
}

// A partition added to a consumed topic ends the generation (S30): serve
// gives its partitions up and returns, so kafka-go rejoins and the new
// assignment includes the added partition. The counts read before the
// join are the baseline: a partition added between them and the
// generation's start is not missed.
func TestServeEndsGenerationWhenPartitionsChange(t *testing.T) {
	for _, tc := range []struct {
		name string
		base map[string]int // read before the join
		seq  []map[string]int
	}{
		{"added while the generation runs", map[string]int{"t": 1}, []map[string]int{{"t": 1}, {"t": 1}, {"t": 3}}},
		{"added before the generation started", map[string]int{"t": 1}, []map[string]int{{"t": 3}}},
		{"no baseline read before the join", nil, []map[string]int{{"t": 1}, {"t": 1}, {"t": 3}}},
		{"topic created", map[string]int{"t": 0}, []map[string]int{{"t": 0}, {"t": 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testSource(nil)
			s.watchEvery, s.counts, s.base = time.Millisecond, scriptedCounts(tc.seq...), tc.base
			log := &commitLog{}
			done := make(chan struct{})
			gctx, endGen := context.WithCancel(context.Background()) // never ended by the test
			defer endGen()
			go func() {
				defer close(done)
				s.serve(gctx, 7, &recordingCommitter{id: 7, log: log}, map[string][]kafka.PartitionAssignment{"t": {{ID: 0, Offset: 1}}})
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("serve did not end the generation 10s after the partition count changed")
			}
			if st := s.Stats(); st.Generation != -1 || len(st.Assigned) != 0 {
				t.Fatalf("after the change: generation %d, assigned %v; want the generation given up", st.Generation, st.Assigned)
			}
			if got := s.base; got["t"] != tc.seq[len(tc.seq)-1]["t"] {
				t.Fatalf("baseline for the next generation = %v, want the counts read after the change", got)
			}
			_ = s.Close()
		})
	}
}

// Without a change the generation goes on, and a missing topic is no
// change; with IgnorePartitionChanges nothing is watched.
func TestServeKeepsGenerationWithoutPartitionChange(t *testing.T) {
	for _, ignore := range []bool{false, true} {
		s := testSource(nil)
		reads := make(chan struct{}, 100)
		s.watch = !ignore
		s.watchEvery, s.base = time.Millisecond, map[string]int{"t": 0}
		s.counts = func(context.Context) (map[string]int, error) {
			select {
			case reads <- struct{}{}:
			default:
			}
			if ignore {
				return map[string]int{"t": 5}, nil
			}
			return map[string]int{"t": 0}, nil
		}
		done := make(chan struct{})
		gctx, endGen := context.WithCancel(context.Background())
		go func() {
			defer close(done)
			s.serve(gctx, 3, &recordingCommitter{id: 3, log: &commitLog{}}, map[string][]kafka.PartitionAssignment{"t": {{ID: 0, Offset: 1}}})
		}()
		if !ignore {
			for range 20 { // twenty reads with the same count
				select {
				case <-reads:
				case <-time.After(10 * time.Second):
					t.Fatal("the watch stopped reading the partition counts")
				}
			}
		}
		select {
		case <-done:
			t.Fatalf("ignore %v: serve ended the generation without a partition change", ignore)
		default:
		}
		endGen()
		<-done
		if ignore && len(reads) != 0 {
			t.Fatalf("IgnorePartitionChanges: %d partition reads, want 0", len(reads))
		}
		_ = s.Close()
	}
}
