package consumer

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
)

// The committer flushes every CommitInterval on the fake clock
// (testing/synctest): what completed by a tick is committed at that tick,
// not before, and an idle tick commits nothing.
func TestCommitterFlushesEveryCommitInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &fakeSource{}
		c := newCommitter(src, 1000, time.Second, slog.New(slog.DiscardHandler))
		done := make(chan struct{})
		go func() { defer close(done); c.loop() }()
		defer func() { c.close(); <-done }()
		commits := func() int {
			src.mu.Lock()
			defer src.mu.Unlock()
			return len(src.commits)
		}
		c.done(Delivery{Lane: "t/0", Offset: 1})
		time.Sleep(999 * time.Millisecond) // fake clock
		synctest.Wait()
		if n := commits(); n != 0 {
			t.Fatalf("%d commits before the first CommitInterval, want 0", n)
		}
		time.Sleep(time.Millisecond) // 1s: the tick
		synctest.Wait()
		if got := src.committed()["t/0"]; !slices.Equal(got, []int64{1}) {
			t.Fatalf("commits %v at 1s, want [1]", got)
		}
		time.Sleep(time.Second) // 2s: an idle tick
		synctest.Wait()
		c.done(Delivery{Lane: "t/0", Offset: 2})
		time.Sleep(999 * time.Millisecond)
		synctest.Wait()
		if n := commits(); n != 1 {
			t.Fatalf("%d commits before 3s, want 1 (an idle tick commits nothing)", n)
		}
		time.Sleep(time.Millisecond) // 3s
		synctest.Wait()
		if got := src.committed()["t/0"]; !slices.Equal(got, []int64{1, 2}) {
			t.Fatalf("commits %v at 3s, want [1 2]", got)
		}
	})
}

// HandleInPlace retries a failing delivery with exponential backoff on the
// fake clock: the nominal delay starts at RetryInitial, doubles and is
// capped at RetryMax, each delay jittered by ±20%; it stops once the
// outcome may be acked, and when ctx ends during a delay it returns then.
func TestHandleInPlaceBackoffDoublesAndCaps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var at []time.Duration
		start := time.Now()
		h := func(context.Context, pgx.Tx, *dedup.Message) error {
			mu.Lock()
			defer mu.Unlock()
			at = append(at, time.Since(start))
			if len(at) < 20 {
				return errors.New("still failing")
			}
			return nil
		}
		c, err := New(Config{Scope: "s", Store: &txStore{}, Handler: h, Logger: slog.New(slog.DiscardHandler),
			RetryInitial: 100 * time.Millisecond, RetryMax: 400 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.HandleInPlace(context.Background(), delivery(context.Background(), 1))
		if err != nil || res.Outcome != dedup.OutcomeProcessed {
			t.Fatalf("HandleInPlace = %+v, %v; want processed", res, err)
		}
		if len(at) != 20 || at[0] != 0 {
			t.Fatalf("handler ran at %v, want 20 runs, the first at once", at)
		}
		for i := range 19 {
			n := []time.Duration{100, 200, 400}[min(i, 2)] * time.Millisecond
			if gap := at[i+1] - at[i]; gap < n*8/10 || gap > n*12/10 {
				t.Fatalf("delay before retry %d = %s, want %s ±20%% (runs at %v)", i+1, gap, n, at)
			}
		}

		// ctx ends in the middle of a delay: HandleInPlace returns then.
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		start = time.Now()
		c2, err := New(Config{Scope: "s", Store: &txStore{}, Logger: slog.New(slog.DiscardHandler),
			Handler:      func(context.Context, pgx.Tx, *dedup.Message) error { return errors.New("down") },
			RetryInitial: time.Minute, RetryMax: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c2.HandleInPlace(ctx, delivery(context.Background(), 2)); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != 50*time.Millisecond {
			t.Fatalf("HandleInPlace = %v after %s; want ctx's error at 50ms", err, time.Since(start))
		}
	})
}

// batchTimes is a txStore recording when (fake clock) each batch reached
// the store, and its size.
type batchTimes struct {
	txStore
	mu    sync.Mutex
	start time.Time
	at    []time.Duration
	sizes []int
}

func (b *batchTimes) ProcessBatch(ctx context.Context, msgs []*dedup.Message, h pgstore.Handler) ([]dedup.Result, error) {
	b.mu.Lock()
	b.at = append(b.at, time.Since(b.start))
	b.sizes = append(b.sizes, len(msgs))
	b.mu.Unlock()
	return b.txStore.ProcessBatch(ctx, msgs, h)
}

func (b *batchTimes) batches() ([]time.Duration, []int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.at), slices.Clone(b.sizes)
}

// Batched mode on the fake clock: a lane gathers deliveries for at most
// BatchWait after the first, and runs a full batch (BatchSize) at once.
func TestBatchLaneWaitsBatchWaitOrBatchSize(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &batchTimes{start: time.Now()}
		src := &revocableSource{feed: make(chan Delivery, 16)}
		h := func(context.Context, pgx.Tx, *dedup.Message) error { return nil }
		stop := runRevocable(t, Config{Store: st, Handler: h, BatchSize: 3, BatchWait: 50 * time.Millisecond,
			CommitEvery: 1000, CommitInterval: time.Hour}, src)
		defer stop()
		src.feed <- delivery(context.Background(), 1) // alone: waits out BatchWait
		time.Sleep(time.Second)
		for off := range int64(3) { // three at once: a full batch, no wait
			src.feed <- delivery(context.Background(), off+2)
		}
		synctest.Wait()
		at, sizes := st.batches()
		if !slices.Equal(at, []time.Duration{50 * time.Millisecond, time.Second}) || !slices.Equal(sizes, []int{1, 3}) {
			t.Fatalf("batches at %v of sizes %v, want [50ms 1s] of [1 3]", at, sizes)
		}
	})
}
