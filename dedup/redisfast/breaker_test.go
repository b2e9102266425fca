package redisfast

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/dedup"
)

// logRecorder is a slog.Handler keeping every record, at every level.
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec)
	return nil
}
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *logRecorder) WithGroup(string) slog.Handler      { return r }

// count returns how many records of level were logged.
func (r *logRecorder) count(level slog.Level) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.recs {
		if rec.Level == level {
			n++
		}
	}
	return n
}

func (r *logRecorder) messages(level slog.Level) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rec := range r.recs {
		if rec.Level == level {
			out = append(out, rec.Message)
		}
	}
	return out
}

// The breaker's wiring, on a fake Redis (a function returning errors) and a
// fake clock (synctest): it opens after BreakerFailures consecutive
// failures, skips Redis while open, probes once per cool-down, closes on a
// successful probe; one WARN when it opens, one INFO when it closes, no log
// line per skipped call.
func TestBreakerOpensOnceAndClosesOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &logRecorder{}
		b := newBreaker(3, 5*time.Second, slog.New(logs))
		ctx := context.Background()
		down := errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
		var redisCalls int
		redis := func(err error) func(context.Context) error {
			return func(context.Context) error { redisCalls++; return err }
		}
		mustState := func(want BreakerState) {
			t.Helper()
			if got := b.state(); got != want {
				t.Fatalf("state %s, want %s", got, want)
			}
		}

		// Two failures, a success, two failures: never 3 in a row.
		for _, err := range []error{down, down, nil, down, down} {
			if got := b.call(ctx, time.Second, redis(err)); !errors.Is(got, err) {
				t.Fatalf("call = %v, want %v", got, err)
			}
		}
		mustState(BreakerClosed)
		// The third consecutive failure opens it.
		_ = b.call(ctx, time.Second, redis(down))
		mustState(BreakerOpen)
		// While open: no Redis call, ErrBreakerOpen at once, no log line.
		before := redisCalls
		for range 1000 {
			err := b.call(ctx, time.Second, redis(nil))
			if !errors.Is(err, ErrBreakerOpen) || !errors.Is(err, dedup.ErrFastPathSkipped) {
				t.Fatalf("open: %v, want ErrBreakerOpen", err)
			}
		}
		if redisCalls != before {
			t.Fatalf("%d Redis calls while open, want 0", redisCalls-before)
		}
		// After the cool-down one call probes; it fails: open again, and
		// still one warning in all.
		time.Sleep(5*time.Second + time.Nanosecond) // gobreaker: half-open strictly after the cool-down
		mustState(BreakerHalfOpen)
		_ = b.call(ctx, time.Second, redis(down))
		mustState(BreakerOpen)
		if redisCalls != before+1 {
			t.Fatalf("%d Redis calls for the probe, want 1", redisCalls-before)
		}
		// The next probe succeeds; while it runs, other calls still skip.
		time.Sleep(5*time.Second + time.Nanosecond)
		var duringProbe error
		err := b.call(ctx, time.Second, func(ctx context.Context) error {
			duringProbe = b.call(ctx, time.Second, redis(nil))
			return nil
		})
		if err != nil || !errors.Is(duringProbe, ErrBreakerOpen) {
			t.Fatalf("probe = %v, call during the probe = %v (want nil, ErrBreakerOpen)", err, duringProbe)
		}
		mustState(BreakerClosed)

		st := b.stats()
		if st.Opened != 1 || st.Probed != 2 || st.ProbesFailed != 1 || st.Closed != 1 || st.Skipped != 1001 {
			t.Fatalf("stats %+v, want opened 1, probed 2, probes failed 1, closed 1, skipped 1001", st)
		}
		if w, i := logs.count(slog.LevelWarn), logs.count(slog.LevelInfo); w != 1 || i != 1 {
			t.Fatalf("%d warnings %v and %d info lines %v, want one each", w, logs.messages(slog.LevelWarn), i, logs.messages(slog.LevelInfo))
		}
		if !strings.Contains(logs.messages(slog.LevelInfo)[0], "recovered") {
			t.Fatalf("info line %q", logs.messages(slog.LevelInfo)[0])
		}
	})
}

// Calls that fail because their caller's context ended (a shutdown) are not
// Redis's fault and never open the breaker; each call's own deadline is
// Timeout.
func TestBreakerIgnoresCallerCancellation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBreaker(2, 5*time.Second, slog.New(&logRecorder{}))
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		for range 10 {
			_ = b.call(ctx, time.Second, func(ctx context.Context) error { return ctx.Err() })
		}
		if s := b.state(); s != BreakerClosed {
			t.Fatalf("after 10 calls of a canceled caller: %s, want closed", s)
		}
		start := time.Now()
		var deadline time.Time
		_ = b.call(context.Background(), 50*time.Millisecond, func(ctx context.Context) error {
			deadline, _ = ctx.Deadline()
			<-ctx.Done() // a hung Redis: the call ends at its deadline
			return ctx.Err()
		})
		if got := deadline.Sub(start); got != 50*time.Millisecond {
			t.Fatalf("call deadline %s after the start, want the 50ms timeout", got)
		}
	})
}

// Lookup and Remember go through the breaker: against a Redis refusing
// connections, a FailFast client dials once per call, the breaker opens
// after BreakerFailures calls, and from then on no call dials at all.
func TestFastPathSkipsRedisWhileOpen(t *testing.T) {
	var dials atomic.Int32
	opt := ClientOptions("redis.invalid:6379")
	opt.Dialer = func(context.Context, string, string) (net.Conn, error) {
		dials.Add(1)
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	client := redis.NewClient(opt)
	t.Cleanup(func() { _ = client.Close() })
	logs := &logRecorder{}
	f, err := New(Config{Client: client, BreakerFailures: 4, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	id, err := dedup.NewIdentity("payments", "m-1", "pay-1", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 4 {
		var err error
		if i%2 == 0 {
			_, _, err = f.Lookup(ctx, id)
		} else {
			err = f.Remember(ctx, id, dedup.FastPathEntry{KeyID: "k1", Fingerprint: []byte{1}})
		}
		if err == nil || errors.Is(err, ErrBreakerOpen) {
			t.Fatalf("call %d: %v, want a dial error", i, err)
		}
	}
	// One dial per pool tried: a pipeline tries go-redis's pipeline pool,
	// then the regular one.
	dialsToOpen := dials.Load()
	if dialsToOpen < 4 || dialsToOpen > 8 {
		t.Fatalf("%d dials for 4 calls, want 4 to 8 (DialerRetries 1)", dialsToOpen)
	}
	for range 100 {
		if _, _, err := f.Lookup(ctx, id); !errors.Is(err, ErrBreakerOpen) {
			t.Fatalf("Lookup while open: %v", err)
		}
		if err := f.Remember(ctx, id, dedup.FastPathEntry{KeyID: "k1", Fingerprint: []byte{1}}); !errors.Is(err, ErrBreakerOpen) {
			t.Fatalf("Remember while open: %v", err)
		}
	}
	if n := dials.Load(); n != dialsToOpen {
		t.Fatalf("%d dials, want no more while the breaker is open", n-dialsToOpen)
	}
	if st := f.BreakerStats(); st.State != BreakerOpen || st.Opened != 1 || st.Skipped != 200 {
		t.Fatalf("stats %+v", st)
	}
	if w := logs.messages(slog.LevelWarn); len(w) != 1 || !strings.Contains(w[0], "skipping Redis") {
		t.Fatalf("warnings %q, want the one about the breaker", w)
	}

	want := `
# HELP idemq_fastpath_breaker_skipped_total Fast-path calls answered without Redis because the circuit breaker was open (also counted in idemq_fastpath_total{result="error"}).
# TYPE idemq_fastpath_breaker_skipped_total counter
idemq_fastpath_breaker_skipped_total 200
# HELP idemq_fastpath_breaker_state State of the Redis fast path's circuit breaker: 0 closed (Redis used), 1 half-open (probing), 2 open (Redis skipped).
# TYPE idemq_fastpath_breaker_state gauge
idemq_fastpath_breaker_state 2
# HELP idemq_fastpath_breaker_transitions_total State changes of the Redis fast path's circuit breaker; from=closed,to=open is an outage beginning, from=half_open,to=closed its end.
# TYPE idemq_fastpath_breaker_transitions_total counter
idemq_fastpath_breaker_transitions_total{from="closed",to="open"} 1
idemq_fastpath_breaker_transitions_total{from="half_open",to="closed"} 0
idemq_fastpath_breaker_transitions_total{from="half_open",to="open"} 0
idemq_fastpath_breaker_transitions_total{from="open",to="half_open"} 0
`
	if err := testutil.CollectAndCompare(f.Collector(), strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}
