package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// outagePub is a ChainPublisher on the fake clock of a synctest bubble: until
// `until` every publish fails with a refused connection (the broker is down);
// after it, rows acknowledge in order, except the rows whose payload is in
// tooLarge, which fail with a row error every time. It records the
// acknowledged rows per key, in order, and counts the calls.
type outagePub struct {
	until    time.Time
	tooLarge map[string]bool

	mu           sync.Mutex
	acked        map[string][]string // key → payloads in the order acknowledged
	calls, downs int
}

func (p *outagePub) Publish(context.Context, []Envelope) error {
	return errors.New("outagePub: PublishChains only")
}

func (p *outagePub) PublishChains(_ context.Context, chains [][]Envelope) []ChainResult {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	out := make([]ChainResult, len(chains))
	if time.Now().Before(p.until) {
		p.downs++
		for i := range out {
			out[i].Err = Unavailable(errors.New("dial tcp 127.0.0.1:9092: connect: connection refused"))
		}
		return out
	}
	for i, c := range chains {
		for _, e := range c {
			if p.tooLarge[string(e.Payload)] {
				out[i].Err = errors.New("record larger than BatchBytes")
				break
			}
			p.acked[string(e.Key)] = append(p.acked[string(e.Key)], string(e.Payload))
			out[i].Acked++
		}
	}
	return out
}

// outageRelay returns, inside the synctest bubble, a relay on ob's table
// (a pool of its own, made in the bubble) publishing through pub.
func outageRelay(t *testing.T, ob *Outbox, pub Publisher, cfg RelayConfig) *Relay {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), os.Getenv("TEST_POSTGRES_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	inBubble, err := New(pool, ob.cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DisableListen, cfg.DisablePurge, cfg.Logger = true, true, slog.New(slog.DiscardHandler)
	r, err := NewRelay(inBubble, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// runInBubble starts r.Run and returns stop, which ends it and returns
// Run's error; stop also runs when the test ends (a failed test must end
// the relay too, or the bubble would not exit).
func runInBubble(t *testing.T, r *Relay) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stop = sync.OnceValue(func() error { cancel(); return <-done })
	t.Cleanup(func() { _ = stop() })
	return stop
}

// checkOrder fails unless every key's acknowledged payloads are that key's
// rows, each once, in seq (numeric) order, and n rows in all.
func checkOrder(t *testing.T, acked map[string][]string, n, keys int) {
	t.Helper()
	total := 0
	for k, ps := range acked {
		total += len(ps)
		for i, p := range ps {
			v, err := strconv.Atoi(p)
			if err != nil {
				t.Fatal(err)
			}
			if want := fmt.Sprintf("k%d", v%keys); want != k {
				t.Fatalf("payload %s acknowledged under key %s, want %s", p, k, want)
			}
			if i > 0 {
				prev, _ := strconv.Atoi(ps[i-1])
				if v != prev+keys {
					t.Fatalf("key %s: acknowledged %v, want each row once in seq order", k, ps)
				}
			}
		}
	}
	if total != n {
		t.Fatalf("%d rows acknowledged, want %d", total, n)
	}
}

// A broker outage of two hours (fake clock, testing/synctest; the rows live
// in the real Postgres) parks nothing and counts no attempt, although
// MaxAttempts is 3 and the retry delays are a millisecond: the relay pauses
// publishing (the breaker is open; one outage, probes with backoff doubling
// to OutageBackoffMax) and, once the broker is back, drains every row in
// per-key order, each once. Without the classification, the rows would be
// parked after three failed publishes.
func TestRelayTwoHourOutageParksNothing(t *testing.T) {
	ob, ctx := pgOutbox(t)
	const n, keys = 300, 12
	addKeyed(t, ctx, ob, n, keys)
	synctest.Test(t, func(t *testing.T) {
		pub := &outagePub{until: time.Now().Add(2 * time.Hour), acked: map[string][]string{}}
		r := outageRelay(t, ob, pub, RelayConfig{BatchSize: 50, MaxKeys: 6, MaxAttempts: 3,
			RetryInitial: time.Millisecond, RetryMax: time.Millisecond, PollInterval: time.Second,
			OutageBackoffInitial: time.Second, OutageBackoffMax: time.Minute})
		stop := runInBubble(t, r)

		time.Sleep(2*time.Hour - time.Minute) // fake clock: deep in the outage
		synctest.Wait()
		st, err := r.ob.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rs := r.Stats()
		if st.Parked != 0 || st.Failing != 0 || st.Published != 0 || st.Pending != n {
			t.Fatalf("after 1h59m of outage: outbox %+v; want all %d rows pending, none failing or parked", st, n)
		}
		if !rs.BreakerOpen || rs.Outages != 1 || rs.Failed != 0 || rs.Parked != 0 || rs.Unavailable == 0 {
			t.Fatalf("after 1h59m of outage: relay %+v; want the breaker open, 1 outage, no failed or parked rows", rs)
		}
		rows, err := r.ob.List(ctx, ListOptions{Limit: n})
		if err != nil {
			t.Fatal(err)
		}
		for _, row := range rows {
			if row.Attempts != 0 || row.LastError != "" {
				t.Fatalf("row %d: attempts %d, last error %q; an outage must not count", row.Seq, row.Attempts, row.LastError)
			}
		}
		pub.mu.Lock()
		downs := pub.downs
		pub.mu.Unlock()
		// Probes: 1s doubling to 1m (±20%) over 2h is about 130; one
		// worker, so one batch per probe.
		if downs < 60 || downs > 200 {
			t.Fatalf("%d publishes during the outage, want the probes of a backoff from 1s to 1m (about 130)", downs)
		}

		// The broker is back at 2h; the next probe (≤ 1m12s later) drains.
		for i := 0; i < 120; i++ {
			if st, err = r.ob.Stats(ctx); err != nil {
				t.Fatal(err)
			}
			if st.Published == n {
				break
			}
			time.Sleep(5 * time.Second)
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		rs = r.Stats()
		if st.Published != n || st.Parked != 0 || rs.Parked != 0 || rs.Failed != 0 || rs.BreakerOpen || rs.Outages != 1 {
			t.Fatalf("after the outage: outbox %+v, relay %+v; want all %d published, none parked, the breaker closed", st, rs, n)
		}
		pub.mu.Lock()
		defer pub.mu.Unlock()
		checkOrder(t, pub.acked, n, keys)
	})
}

// Row errors still park: with the broker up, a row too large fails every
// time and is parked after MaxAttempts (its key's later rows wait behind it,
// pending), while every other key drains in order; the breaker never opens.
func TestRelayRowErrorStillParks(t *testing.T) {
	ob, ctx := pgOutbox(t)
	const n, keys = 60, 6
	addKeyed(t, ctx, ob, n, keys)
	synctest.Test(t, func(t *testing.T) {
		// Row "13" (key k1) is too large; k1's rows 19, 25, … wait behind it.
		pub := &outagePub{tooLarge: map[string]bool{"13": true}, acked: map[string][]string{}}
		r := outageRelay(t, ob, pub, RelayConfig{BatchSize: 20, MaxAttempts: 3,
			RetryInitial: time.Millisecond, RetryMax: time.Millisecond, PollInterval: 100 * time.Millisecond})
		stop := runInBubble(t, r)
		want := int64(n - (n/keys - 2)) // every row but k1's from 13 on
		var st Stats
		for i := 0; i < 600; i++ {
			var err error
			if st, err = r.ob.Stats(ctx); err != nil {
				t.Fatal(err)
			}
			if st.Parked == 1 && st.Published == want {
				break
			}
			// The retry time is the database's (real) clock: let 2ms of it
			// pass, and 100ms of the fake one.
			if _, err := r.ob.pool.Exec(ctx, "select pg_sleep(0.002)"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		parked, err := r.ob.Parked(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(parked) != 1 || string(parked[0].Payload) != "13" || parked[0].Attempts != 3 {
			t.Fatalf("parked %+v; want only row 13, after 3 attempts", parked)
		}
		rs := r.Stats()
		if rs.Parked != 1 || rs.Failed != 3 || rs.Outages != 0 || rs.BreakerOpen || rs.Unavailable != 0 {
			t.Fatalf("relay %+v; want 1 parked after 3 failures, no outage", rs)
		}
		if st.Published != want {
			t.Fatalf("published %d, want %d: every row but k1's from 13 on", st.Published, want)
		}
	})
}
