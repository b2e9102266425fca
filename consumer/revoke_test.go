package consumer

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
)

// revocableSource hands out scripted deliveries of lane "t/0"; each
// delivery's Ack names the claim (a context) it was fetched for.
type revocableSource struct {
	fakeSource
	feed  chan Delivery
	flush func(context.Context)
}

func (r *revocableSource) Fetch(ctx context.Context) (Delivery, error) {
	select {
	case d := <-r.feed:
		return d, nil
	case <-ctx.Done():
		return Delivery{}, ctx.Err()
	}
}

func (r *revocableSource) LaneContext(d Delivery) context.Context {
	if c, ok := d.Ack.(context.Context); ok {
		return c
	}
	return nil
}

func (r *revocableSource) OnRevoke(flush func(context.Context)) { r.flush = flush }

func delivery(claim context.Context, off int64) Delivery {
	id := "m-" + strconv.FormatInt(off, 10)
	return Delivery{Message: &dedup.Message{Topic: "t", Offset: off}, MessageID: id, Position: "t/0/" + id, Lane: "t/0", Offset: off, Ack: claim}
}

// txStore is a TxStore that runs handlers without a database: nil tx; a
// handler error is a retry.
type txStore struct {
	mu      sync.Mutex
	handled []string
}

func (s *txStore) Process(ctx context.Context, msg *dedup.Message, h pgstore.Handler) (dedup.Result, error) {
	s.mu.Lock()
	s.handled = append(s.handled, msg.Identity.MessageID)
	s.mu.Unlock()
	if err := h(ctx, nil, msg); err != nil {
		return dedup.Result{Outcome: dedup.OutcomeRetry, Err: err}, nil
	}
	return dedup.Result{Outcome: dedup.OutcomeProcessed}, nil
}

func (s *txStore) ProcessBatch(ctx context.Context, msgs []*dedup.Message, h pgstore.Handler) ([]dedup.Result, error) {
	out := make([]dedup.Result, len(msgs))
	for i, m := range msgs {
		out[i], _ = s.Process(ctx, m, h)
	}
	return out, nil
}

func (s *txStore) ProcessLeased(context.Context, *dedup.Message, dedup.LeaseHandler, dedup.LeaseOptions) (dedup.Result, error) {
	return dedup.Result{}, errors.New("not used")
}

func (s *txStore) Reject(context.Context, *dedup.Message, string, error) (dedup.Result, error) {
	return dedup.Result{}, errors.New("not used")
}
func (s *txStore) ValidateRetention(time.Duration) error { return nil }
func (s *txStore) MaxAttempts() int                      { return 5 }
func (s *txStore) SucceededRetention() time.Duration     { return 7 * 24 * time.Hour }

func (s *txStore) ids() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.handled)
}

func runRevocable(t *testing.T, cfg Config, src *revocableSource) (stop func()) {
	t.Helper()
	cfg.Scope = "s"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.RetryInitial, cfg.RetryMax = time.Millisecond, 5*time.Millisecond
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, src) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// waitFor waits until cond holds, for at most 10s of the fake clock: it
// must run inside a synctest bubble (synctest.Test). Each round lets every
// goroutine of the bubble run until it blocks (synctest.Wait), then moves
// the fake clock on by a millisecond, so that backoffs and tickers fire
// without a wall-clock wait.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for synctest.Wait(); !cond(); synctest.Wait() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond) // the fake clock: no wall-clock wait
	}
}

// Deliveries waiting in a lane when it is revoked are dropped unhandled and
// uncommitted; the lane goes on with the deliveries of its next claim, and
// the source's flush commits what was completed at once.
func TestRunDropsRevokedDeliveries(t *testing.T) {
	for _, batch := range []int{1, 3} {
		t.Run("batch="+strconv.Itoa(batch), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := &txStore{}
				src := &revocableSource{feed: make(chan Delivery, 16)}
				old, revoke := context.WithCancel(context.Background())
				inHand := make(chan struct{})
				resume := make(chan struct{})
				h := func(_ context.Context, _ pgx.Tx, m *dedup.Message) error {
					if m.Identity.MessageID == "m-1" {
						close(inHand)
						<-resume
					}
					return nil
				}
				stop := runRevocable(t, Config{Store: st, Handler: h, BatchSize: batch, BatchWait: time.Millisecond,
					CommitEvery: 1000, CommitInterval: time.Hour}, src)
				defer stop()
				for off := range int64(5) {
					src.feed <- delivery(old, off+1)
				}
				<-inHand
				waitFor(t, "the waiting deliveries to be fetched", func() bool { return len(src.feed) == 0 })
				revoke() // a rebalance takes the lane while m-1 is in hand
				src.flush(context.Background())
				close(resume)
				// The lane's next claim starts again at 2.
				src.feed <- delivery(context.Background(), 2)
				src.feed <- delivery(context.Background(), 3)
				waitFor(t, "the new claim's deliveries", func() bool { return slices.Contains(st.ids(), "m-3") })
				src.flush(context.Background())
				got := st.ids()
				if batch == 1 && !slices.Equal(got, []string{"m-1", "m-2", "m-3"}) {
					t.Fatalf("handled %v, want m-1 (in hand), then the new claim's m-2 and m-3", got)
				}
				for _, id := range []string{"m-4", "m-5"} {
					if slices.Contains(got, id) {
						t.Fatalf("handled %v: %s of the revoked claim ran", got, id)
					}
				}
				if offs := src.committed()["t/0"]; len(offs) == 0 || offs[len(offs)-1] != 3 {
					t.Fatalf("commits %v, want the flush to commit 3", offs)
				}
			})
		})
	}
}

// A delivery retried in place is not retried again once its lane is
// revoked; the lane moves on.
func TestRunStopsRetryingRevokedDelivery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &txStore{}
		src := &revocableSource{feed: make(chan Delivery, 4)}
		old, revoke := context.WithCancel(context.Background())
		var mu sync.Mutex
		attempts := 0
		h := func(_ context.Context, _ pgx.Tx, m *dedup.Message) error {
			if m.Identity.MessageID != "m-1" {
				return nil
			}
			mu.Lock()
			defer mu.Unlock()
			if attempts++; attempts == 3 {
				revoke()
			}
			return errors.New("still failing")
		}
		stop := runRevocable(t, Config{Store: st, Handler: h, CommitEvery: 1, CommitInterval: time.Millisecond}, src)
		defer stop()
		src.feed <- delivery(old, 1)
		src.feed <- delivery(context.Background(), 2)
		waitFor(t, "the lane to move on", func() bool { return slices.Contains(st.ids(), "m-2") })
		mu.Lock()
		defer mu.Unlock()
		// The revocation ends the retry context asynchronously (context.AfterFunc):
		// one more attempt may start before it is seen, never more.
		if attempts < 3 || attempts > 4 {
			t.Fatalf("m-1 tried %d times, want 3 (or 4), then no retry after the revocation", attempts)
		}
		for _, off := range src.committed()["t/0"] {
			if off == 1 {
				t.Fatal("the revoked, never acked m-1 was committed")
			}
		}
	})
}

// flushNow returns at once when the committer has stopped.
func TestFlushNowAfterStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &revocableSource{}
		c := newCommitter(src, 1, time.Hour, slog.Default())
		if src.flush == nil {
			t.Fatal("the committer did not register its flush with the Revocable source")
		}
		done := make(chan struct{})
		go func() { defer close(done); c.loop() }()
		c.close()
		<-done
		returned := make(chan struct{})
		go func() { src.flush(context.Background()); close(returned) }()
		select {
		case <-returned:
		case <-time.After(time.Minute):
			t.Fatal("flush blocked after the committer stopped (a minute)")
		}
	})
}
