package outbox

import (
	"context"
	"errors"
	"testing"
	"time"
)

// UnparkMatching unparks exactly the parked rows its filter selects (by
// topic, by key, all), CountParked counts the same rows without changing
// them, and neither touches an unparked or published row.
func TestUnparkMatching(t *testing.T) {
	ob, ctx := pgOutbox(t)
	tx, err := ob.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.AddBatch(ctx, tx, []Message{
		{Topic: "a", Key: []byte("k1"), Payload: []byte("1")},
		{Topic: "a", Key: []byte("k2"), Payload: []byte("2")},
		{Topic: "b", Key: []byte("k1"), Payload: []byte("3")},
		{Topic: "b", Payload: []byte("4")},
		{Topic: "c", Key: []byte("k9"), Payload: []byte("5")}, // stays unparked
	}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	park := func() {
		t.Helper()
		if _, err := ob.pool.Exec(ctx, `update `+ob.q.table+` set parked_at = now(), attempts = 25 where topic <> 'c'`); err != nil {
			t.Fatal(err)
		}
	}
	count := func(f ParkedFilter) int64 {
		t.Helper()
		n, err := ob.CountParked(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	park()
	for _, c := range []struct {
		name string
		f    ParkedFilter
		want int64
	}{
		{"all", ParkedFilter{}, 4},
		{"topic", ParkedFilter{Topic: "a"}, 2},
		{"key", ParkedFilter{Key: []byte("k1")}, 2},
		{"topic and key", ParkedFilter{Topic: "b", Key: []byte("k1")}, 1},
		{"no match", ParkedFilter{Topic: "c"}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			park()
			if n := count(c.f); n != c.want {
				t.Fatalf("CountParked = %d, want %d", n, c.want)
			}
			if n := count(ParkedFilter{}); n != 4 {
				t.Fatalf("CountParked changed rows: %d parked, want 4", n)
			}
			n, err := ob.UnparkMatching(ctx, c.f)
			if err != nil || n != c.want {
				t.Fatalf("UnparkMatching = %d, %v; want %d", n, err, c.want)
			}
			if left := count(ParkedFilter{}); left != 4-c.want {
				t.Fatalf("%d rows parked after unparking %d of 4", left, c.want)
			}
			if left := count(c.f); left != 0 {
				t.Fatalf("%d selected rows still parked", left)
			}
		})
	}
	var attempts int
	if err := ob.pool.QueryRow(ctx, `select attempts from `+ob.q.table+` where topic = 'c'`).Scan(&attempts); err != nil || attempts != 0 {
		t.Fatalf("the unparked row of topic c: attempts %d, %v", attempts, err)
	}
	if _, err := (&Outbox{}).UnparkMatching(ctx, ParkedFilter{}); !errors.Is(err, ErrNoPool) {
		t.Fatalf("UnparkMatching without a pool: %v", err)
	}
}

// Ready is ErrRelayNotRunning before Run and after it returns, nil while it
// runs.
func TestRelayReady(t *testing.T) {
	ob, ctx := pgOutbox(t)
	r, err := NewRelay(ob, ackAll{}, RelayConfig{Name: "ready", DisablePurge: true, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Ready(ctx); !errors.Is(err, ErrRelayNotRunning) {
		t.Fatalf("Ready before Run: %v", err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	deadline := time.Now().Add(10 * time.Second)
	for r.Ready(ctx) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("Ready while running: %v", r.Ready(ctx))
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := r.Ready(ctx); !errors.Is(err, ErrRelayNotRunning) {
		t.Fatalf("Ready after Run: %v", err)
	}
}

// PurgeWithProgress reports each statement's running total, and when ctx
// ends it finishes the statement in flight, stops and returns ctx's error
// with exactly the rows that left the table.
func TestPurgeWithProgressStopsExactly(t *testing.T) {
	ob, ctx := pgOutbox(t)
	if _, err := ob.pool.Exec(ctx, `insert into `+ob.q.table+` (id, topic, payload, created_at, published_at, published_by)
		select gen_random_uuid(), 't', '\x00', now() - interval '3 days', now() - interval '2 days', 'old' from generate_series(1, 50)`); err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithCancel(ctx)
	var seen []int64
	n, err := ob.PurgeWithProgress(pctx, 24*time.Hour, 10, func(deleted int64) {
		seen = append(seen, deleted)
		if deleted == 20 {
			cancel()
		}
	})
	var left int64
	if qerr := ob.pool.QueryRow(ctx, `select count(*) from `+ob.q.table).Scan(&left); qerr != nil {
		t.Fatal(qerr)
	}
	if !errors.Is(err, context.Canceled) || n != 20 || left != 30 || len(seen) != 2 || seen[0] != 10 {
		t.Fatalf("PurgeWithProgress = %d, %v; progress %v; %d rows left, want 20 deleted and 30 left", n, err, seen, left)
	}
	n, err = ob.PurgeWithProgress(ctx, 24*time.Hour, 10, nil)
	if err != nil || n != 30 {
		t.Fatalf("second purge = %d, %v; want the 30 left", n, err)
	}
}
