package consumer

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// fakeSource records commits; fail makes the next n commits fail.
type fakeSource struct {
	mu      sync.Mutex
	commits [][]Delivery
	fail    int
}

func (f *fakeSource) Fetch(ctx context.Context) (Delivery, error) {
	<-ctx.Done()
	return Delivery{}, ctx.Err()
}
func (f *fakeSource) Close() error { return nil }
func (f *fakeSource) Commit(_ context.Context, done []Delivery) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail > 0 {
		f.fail--
		return errors.New("kafka: deadline exceeded")
	}
	f.commits = append(f.commits, append([]Delivery(nil), done...))
	return nil
}

func (f *fakeSource) committed() map[string][]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string][]int64{}
	for _, batch := range f.commits {
		for _, d := range batch {
			out[d.Lane] = append(out[d.Lane], d.Offset)
		}
	}
	return out
}

func TestCommitterBatchesMonotonicPerLane(t *testing.T) {
	src := &fakeSource{}
	c := newCommitter(src, 1000, time.Hour, slog.Default())
	for _, off := range []int64{10, 11, 12} {
		c.done(Delivery{Lane: "t/0", Offset: off})
	}
	c.done(Delivery{Lane: "t/1", Offset: 5})
	c.flush(context.Background())
	// A replay after a rebalance reports an older offset: never committed.
	c.done(Delivery{Lane: "t/0", Offset: 10})
	c.flush(context.Background())
	got := src.committed()
	if len(got["t/0"]) != 1 || got["t/0"][0] != 12 || len(got["t/1"]) != 1 || got["t/1"][0] != 5 {
		t.Fatalf("commits = %v, want t/0:[12] t/1:[5]", got)
	}
}

func TestCommitterRetriesFailedCommit(t *testing.T) {
	// S02: the commit after offset 20 fails although the database committed;
	// the offset stays pending and the next flush commits it (or a later one).
	src := &fakeSource{fail: 1}
	c := newCommitter(src, 1000, time.Hour, slog.Default())
	c.done(Delivery{Lane: "t/0", Offset: 20})
	c.flush(context.Background())
	if got := src.committed(); len(got) != 0 {
		t.Fatalf("failed commit recorded: %v", got)
	}
	c.flush(context.Background())
	if got := src.committed(); len(got["t/0"]) != 1 || got["t/0"][0] != 20 {
		t.Fatalf("commits = %v, want t/0:[20]", got)
	}
}

func TestCommitterFlushesOnCountAndClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &fakeSource{}
		c := newCommitter(src, 2, time.Hour, slog.Default())
		done := make(chan struct{})
		go func() { defer close(done); c.loop() }()
		c.done(Delivery{Lane: "t/0", Offset: 1})
		synctest.Wait()
		if got := src.committed(); len(got) != 0 {
			t.Fatalf("commits %v before CommitEvery deliveries", got)
		}
		c.done(Delivery{Lane: "t/0", Offset: 2}) // reaches CommitEvery: kicks a flush
		synctest.Wait()                          // no time passes: the kick, not the hourly tick
		if got := src.committed()["t/0"]; !slices.Equal(got, []int64{2}) {
			t.Fatalf("commits %v after CommitEvery deliveries, want [2] at once", got)
		}
		c.done(Delivery{Lane: "t/0", Offset: 3})
		c.close()
		<-done
		got := src.committed()["t/0"]
		if got[len(got)-1] != 3 {
			t.Fatalf("close did not flush: %v", got)
		}
	})
}

func TestConfigValidation(t *testing.T) {
	if _, err := New(Config{}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("empty config: %v", err)
	}
	cfg := Config{Scope: "payments", RetryInitial: time.Second, RetryMax: time.Millisecond}
	if err := cfg.withDefaults().validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("store/handler missing or bad backoff accepted: %v", err)
	}
	// A failed constructor's nil *pgstore.Store is refused by New, not
	// found by the first message as a nil-pointer panic.
	var st *pgstore.Store
	_, err := New(Config{Scope: "payments", Store: st, Handler: func(context.Context, pgx.Tx, *dedup.Message) error { return nil }})
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "nil *pgstore.Store") {
		t.Fatalf("nil *pgstore.Store: %v", err)
	}
}

func TestCounters(t *testing.T) {
	var c Counters
	c.Delivery("s", "duplicate", "business_key")
	c.Delivery("s", "processed", "")
	if c.Get("duplicate") != 1 || c.Get("duplicate:business_key") != 1 || c.Get("processed") != 1 || len(c.Snapshot()) != 3 {
		t.Fatalf("counters = %v", c.Snapshot())
	}
}

// errSource fails its first Fetch.
type errSource struct {
	fakeSource
	closed bool
}

func (e *errSource) Fetch(context.Context) (Delivery, error) {
	return Delivery{}, errors.New("broker gone")
}
func (e *errSource) Close() error { e.closed = true; return nil }

func TestRunReturnsFetchErrorAndCloses(t *testing.T) {
	fp, _ := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "k", Secret: []byte("0123456789abcdef")})
	st, err := pgstore.New(&pgxpool.Pool{}, pgstore.Config{Fingerprinter: fp})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{Scope: "s", Store: st, SkipSchemaCheck: true, Handler: func(context.Context, pgx.Tx, *dedup.Message) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	src := &errSource{}
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background(), src) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "broker gone") || !src.closed {
			t.Fatalf("Run = %v, closed %v; want the fetch error and a closed source", err, src.closed)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return after a fetch error (a minute)")
	}
}
