package outbox

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// dialLog is a pgx DialFunc that refuses every connection, as a database
// that is down does, and records when (fake clock) each one was tried:
// every relay round trip to the database starts with one.
type dialLog struct {
	mu    sync.Mutex
	start time.Time
	at    []time.Duration
}

func (d *dialLog) dial(context.Context, string, string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.at = append(d.at, time.Since(d.start))
	return nil, errors.New("connect: connection refused")
}

func (d *dialLog) dials() []time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.at)
}

// downRelay returns a relay whose database refuses every connection, and
// the log of its connection attempts. Call it inside the synctest bubble;
// the pool is closed when the test ends.
func downRelay(t *testing.T, cfg RelayConfig) (*Relay, *dialLog) {
	t.Helper()
	pc, err := pgxpool.ParseConfig("postgres://idemq@127.0.0.1:1/idemq?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	d := &dialLog{start: time.Now()}
	pc.ConnConfig.DialFunc = d.dial
	pc.ConnConfig.LookupFunc = func(_ context.Context, host string) ([]string, error) { return []string{host}, nil }
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ob, err := New(pool, Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	r, err := NewRelay(ob, &recorder{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r, d
}

// checkBackoff fails unless the gaps between the times in at follow
// nominal (the last entry repeating once reached) within ±jitter.
func checkBackoff(t *testing.T, what string, at []time.Duration, nominal []time.Duration, jitter float64) {
	t.Helper()
	for i := 1; i < len(at); i++ {
		n := nominal[min(i-1, len(nominal)-1)]
		lo, hi := time.Duration(float64(n)*(1-jitter)), time.Duration(float64(n)*(1+jitter))
		if gap := at[i] - at[i-1]; gap < lo || gap > hi {
			t.Fatalf("%s: gap %d = %s, want %s ±%.0f%% (tries at %v)", what, i, gap, n, jitter*100, at)
		}
	}
}

func ms(n ...int) []time.Duration {
	out := make([]time.Duration, len(n))
	for i, v := range n {
		out[i] = time.Duration(v) * time.Millisecond
	}
	return out
}

// A worker whose batches fail on the database backs off on the fake clock
// (testing/synctest): 100ms, doubling, capped at 5s, each ±20%, however
// short PollInterval is; every failed batch counts in Stats.DBErrors.
func TestRelayWorkerBacksOffOnDatabaseErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, d := downRelay(t, RelayConfig{DisableListen: true, PollInterval: 10 * time.Millisecond})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		r.worker(ctx, ctx, make(chan struct{}))
		at := d.dials()
		if len(at) < 25 || at[0] != 0 {
			t.Fatalf("batches tried at %v, want the first at once and at least 25 in 2m", at)
		}
		checkBackoff(t, "worker", at, ms(100, 200, 400, 800, 1600, 3200, 5000), 0.2)
		if got := r.Stats().DBErrors; got != int64(len(at)) {
			t.Fatalf("DBErrors = %d, want one per failed batch (%d)", got, len(at))
		}
	})
}

// A wake-up (a notification, Relay.Wake) ends a worker's wait at once, also
// a wait after a database error.
func TestRelayWorkerWakeEndsTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, d := downRelay(t, RelayConfig{DisableListen: true, PollInterval: time.Minute})
		ctx, cancel := context.WithCancel(context.Background())
		wake := make(chan struct{}, 1)
		done := make(chan struct{})
		go func() { defer close(done); r.worker(ctx, ctx, wake) }()
		time.Sleep(50 * time.Millisecond) // fake clock: within the first backoff (≥80ms)
		wake <- struct{}{}
		synctest.Wait()
		cancel()
		<-done
		if got := d.dials(); !slices.Equal(got, ms(0, 50)) {
			t.Fatalf("batches tried at %v, want [0s 50ms]: the wake-up ends the wait", got)
		}
	})
}

// The LISTEN connection that cannot be made is tried again with backoff on
// the fake clock: 200ms, doubling, capped at 10s, each ±20%; the loss
// counts once in Stats.ListenLost however many reconnects fail, and the
// workers fall back to FallbackPollInterval meanwhile.
func TestRelayListenReconnectBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, d := downRelay(t, RelayConfig{PollInterval: time.Minute, FallbackPollInterval: 50 * time.Millisecond})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		r.listen(ctx)
		at := d.dials()
		if len(at) < 30 || at[0] != 0 {
			t.Fatalf("LISTEN tried at %v, want the first at once and at least 30 in 5m", at)
		}
		checkBackoff(t, "listen", at, ms(200, 400, 800, 1600, 3200, 6400, 10000), 0.2)
		if got := r.Stats().ListenLost; got != 1 {
			t.Fatalf("ListenLost = %d, want 1 (one loss, however many failed reconnects)", got)
		}
		if got := r.idleWait(); got != 50*time.Millisecond {
			t.Fatalf("idle wait without LISTEN = %s, want FallbackPollInterval 50ms", got)
		}
	})
}

// The purge runs every PurgeInterval on the fake clock, from the start; a
// failed purge waits for the next tick.
func TestRelayPurgeEveryPurgeInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, d := downRelay(t, RelayConfig{PurgeInterval: 90 * time.Second})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		r.purgeLoop(ctx)
		if got, want := d.dials(), ms(90_000, 180_000, 270_000); !slices.Equal(got, want) {
			t.Fatalf("purges at %v, want %v", got, want)
		}
	})
}
