package kafkaadapter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/segmentio/kafka-go"
)

// fakeItem is what a fakeReader's FetchMessage returns: the message at
// offset off, or err; available at `at` on the fake clock, counted from the
// reader's creation (kafka-go's reader queues what it read until
// FetchMessage takes it).
type fakeItem struct {
	at  time.Duration
	off int64
	err error
}

// fakeReader stands in for a partition's *kafka.Reader: FetchMessage
// returns its items in order, each once it is due, and, like kafka-go's,
// leaves an item queued when ctx ends first.
type fakeReader struct {
	tp    topicPartition
	start time.Time
	items []fakeItem

	mu sync.Mutex
	n  int
}

func (r *fakeReader) SetOffset(int64) error    { return nil }
func (r *fakeReader) Stats() kafka.ReaderStats { return kafka.ReaderStats{} }
func (r *fakeReader) Close() error             { return nil }

func (r *fakeReader) FetchMessage(ctx context.Context) (kafka.Message, error) {
	r.mu.Lock()
	n := r.n
	r.mu.Unlock()
	if n == len(r.items) {
		<-ctx.Done()
		return kafka.Message{}, ctx.Err()
	}
	it := r.items[n]
	t := time.NewTimer(time.Until(r.start.Add(it.at)))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return kafka.Message{}, ctx.Err()
	case <-t.C:
	}
	r.mu.Lock()
	r.n++
	r.mu.Unlock()
	if it.err != nil {
		return kafka.Message{}, it.err
	}
	return kafka.Message{Topic: r.tp.topic, Partition: r.tp.partition, Offset: it.off}, nil
}

// warnings records the Warn lines of a Source's logger.
type warnings struct {
	mu   sync.Mutex
	recs []map[string]any
}

func (w *warnings) Enabled(context.Context, slog.Level) bool { return true }
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler       { return w }
func (w *warnings) WithGroup(string) slog.Handler            { return w }

func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	if r.Level != slog.LevelWarn {
		return nil
	}
	m := map[string]any{"msg": r.Message}
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.Any()
		return true
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	w.recs = append(w.recs, m)
	return nil
}

func (w *warnings) all() []map[string]any {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]map[string]any(nil), w.recs...)
}

// backoffSource is a Source with the default FetchRetryMax (30s) that
// never joins a group; its partition readers are fakeReaders of topic "t"
// with the given items, per partition.
func backoffSource(t *testing.T, w *warnings, items map[int][]fakeItem) *Source {
	t.Helper()
	s, err := NewSource(Config{Reader: kafka.ReaderConfig{Brokers: []string{"127.0.0.1:1"}, GroupID: "g", Topic: "t"},
		Logger: slog.New(w), IgnorePartitionChanges: true})
	if err != nil {
		t.Fatal(err)
	}
	s.started = true
	s.newReader = func(rc kafka.ReaderConfig) partitionReader {
		return &fakeReader{tp: topicPartition{rc.Topic, rc.Partition}, start: time.Now(), items: items[rc.Partition]}
	}
	return s
}

// readFrom starts the partition reader of claim p.
func readFrom(s *Source, claims []*claim, p int) {
	s.wg.Add(1)
	go s.readPartition(claimOf(claims, p))
}

// retryIns returns the retry_in of each warning, and whether each names
// partition p.
func retryIns(recs []map[string]any, p int) ([]time.Duration, []bool) {
	var waits []time.Duration
	var named []bool
	for _, r := range recs {
		d, _ := r["retry_in"].(time.Duration)
		waits = append(waits, d)
		named = append(named, fmt.Sprint(r["partition"]) == fmt.Sprint(p))
	}
	return waits, named
}

// checkWaits fails unless each wait is its nominal value within the ±20%
// jitter.
func checkWaits(t *testing.T, got, nominal []time.Duration) {
	t.Helper()
	for i, want := range nominal {
		if i >= len(got) {
			t.Fatalf("%d warnings %v, want %d with nominal waits %v", len(got), got, len(nominal), nominal)
		}
		if got[i] < want*8/10 || got[i] > want*12/10 {
			t.Fatalf("warning %d: retry_in %s, want %s ±20%% (all: %v, nominal %v)", i, got[i], want, got, nominal)
		}
	}
	if len(got) != len(nominal) {
		t.Fatalf("%d warnings %v, want %d with nominal waits %v", len(got), got, len(nominal), nominal)
	}
}

// A partition whose leader is gone reports errors (LeaderNotAvailable at
// once, then every 50ms); the member's other partition is read at the same
// time: its messages reach Fetch without waiting for the failing
// partition's backoff (on the fake clock, at once).
func TestPartitionErrorsDoNotDelayOtherPartitions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var failing []fakeItem
		for i := range 2000 { // 100s of errors
			failing = append(failing, fakeItem{at: time.Duration(i) * 50 * time.Millisecond, err: kafka.LeaderNotAvailable})
		}
		var healthy []fakeItem
		for i := range 20 {
			healthy = append(healthy, fakeItem{off: int64(i)})
		}
		w := &warnings{}
		s := backoffSource(t, w, map[int][]fakeItem{0: failing, 1: healthy})
		defer s.Close()
		_, claims, _ := join(s, 1, &commitLog{}, map[int]int64{0: kafka.FirstOffset, 1: kafka.FirstOffset})
		start := time.Now()
		readFrom(s, claims, 0) // its first error is read first
		synctest.Wait()
		readFrom(s, claims, 1)
		for i := range 20 {
			d, err := s.Fetch(t.Context())
			if err != nil || d.Message.Partition != 1 || d.Offset != int64(i) {
				t.Fatalf("Fetch %d = %+v, %v; want offset %d of partition 1", i, d, err, i)
			}
		}
		if held := time.Since(start); held != 0 {
			t.Fatalf("partition 1's 20 messages were fetched after %s on the fake clock, want 0: partition 0's errors held them up", held)
		}
		waits, named := retryIns(w.all(), 0)
		if len(waits) == 0 || !named[0] || waits[0] < 80*time.Millisecond || waits[0] > 120*time.Millisecond {
			t.Fatalf("warnings %v (naming partition 0: %v), want the first with retry_in 100ms ±20%% naming partition 0", waits, named)
		}
	})
}

// A partition reader's backoff doubles while its errors go on, and starts
// again at 100ms after a message was read: an error after an outage is not
// waited on as if the outage had never ended.
func TestPartitionBackoffRestartsAfterMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dial := fmt.Errorf("failed to dial: %w", kafka.LeaderNotAvailable)
		items := []fakeItem{{at: 0, err: dial}, {at: time.Second, err: dial}, {at: 2 * time.Second, err: dial},
			{at: 3 * time.Second, err: dial}, {at: 4 * time.Second, off: 0}, {at: 5 * time.Second, err: dial}, {at: 6 * time.Second, err: dial}}
		w := &warnings{}
		s := backoffSource(t, w, map[int][]fakeItem{0: items})
		defer s.Close()
		_, claims, _ := join(s, 1, &commitLog{}, map[int]int64{0: kafka.FirstOffset})
		ctx, cancel := context.WithCancel(t.Context())
		fetched := make(chan int64, 10)
		go func() {
			for {
				d, err := s.Fetch(ctx)
				if err != nil {
					return
				}
				fetched <- d.Offset
			}
		}()
		readFrom(s, claims, 0)
		time.Sleep(7 * time.Second)
		synctest.Wait()
		cancel()
		if len(fetched) != 1 {
			t.Fatalf("%d messages fetched, want 1", len(fetched))
		}
		waits, named := retryIns(w.all(), 0)
		checkWaits(t, waits, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond,
			800 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond})
		for i, ok := range named {
			if !ok {
				t.Fatalf("warning %d does not name partition 0: %v", i, w.all()[i])
			}
		}
	})
}

// kafka-go's reader keeps retrying while a broker is down and queues an
// error per failed attempt; once the partition has a leader again, the
// message read behind those queued errors is fetched at once: the errors
// queued during a backoff do not each wait one.
func TestPartitionQueuedErrorsDoNotDelayMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var items []fakeItem
		for range 10 {
			items = append(items, fakeItem{err: kafka.NotLeaderForPartition})
		}
		items = append(items, fakeItem{off: 41})
		w := &warnings{}
		s := backoffSource(t, w, map[int][]fakeItem{3: items})
		defer s.Close()
		_, claims, _ := join(s, 1, &commitLog{}, map[int]int64{3: kafka.FirstOffset})
		start := time.Now()
		readFrom(s, claims, 3)
		d, err := s.Fetch(t.Context())
		if err != nil || d.Offset != 41 {
			t.Fatalf("Fetch = %+v, %v; want offset 41", d, err)
		}
		if held := time.Since(start); held != 0 {
			t.Fatalf("the message behind 10 queued errors was fetched after %s on the fake clock, want 0", held)
		}
		if n := len(w.all()); n != 1 {
			t.Fatalf("%d warnings, want 1 (the errors read during its backoff are counted, not logged)", n)
		}
	})
}

// Fetch's own backoff, for the errors that still reach it (the group's),
// starts again at 100ms after a message was read, also when Fetch drops
// that message (here: an offset Commit was given already, as after a
// rebalance) and waits on in the same call.
func TestFetchBackoffRestartsAfterMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := groupError(kafka.GroupCoordinatorNotAvailable)
		script := []fetched{{err: coord}, {err: coord}, {err: coord}, {m: kafka.Message{Topic: "t", Offset: 5}},
			{err: coord}, {m: kafka.Message{Topic: "t", Offset: 11}}}
		n := 0
		w := &warnings{}
		s := backoffSource(t, w, nil)
		defer s.Close()
		s.completed[topicPartition{"t", 0}] = 10 // offset 5 is done: dropped
		s.fetch = func(context.Context) (kafka.Message, *claim, error) {
			f := script[n]
			n++
			return f.m, nil, f.err
		}
		if d, err := s.Fetch(t.Context()); err != nil || d.Offset != 11 {
			t.Fatalf("Fetch = %+v, %v; want offset 11", d, err)
		}
		waits, _ := retryIns(w.all(), 0)
		checkWaits(t, waits, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond,
			100 * time.Millisecond})
	})
}

// An error of a partition reader that a retry cannot fix still ends Fetch,
// at once.
func TestPartitionFinalErrorReachesFetch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		items := []fakeItem{{err: kafka.LeaderNotAvailable}, {err: kafka.TopicAuthorizationFailed}}
		s := backoffSource(t, &warnings{}, map[int][]fakeItem{0: items})
		defer s.Close()
		_, claims, _ := join(s, 1, &commitLog{}, map[int]int64{0: kafka.FirstOffset})
		readFrom(s, claims, 0)
		if _, err := s.Fetch(t.Context()); !errors.Is(err, kafka.TopicAuthorizationFailed) {
			t.Fatalf("Fetch = %v, want TopicAuthorizationFailed", err)
		}
	})
}
