package integration

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/dedup/redisfast"
	"github.com/redis/go-redis/v9"
)

// logLines is a slog.Handler keeping the level and message of every record.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, r.Level.String()+" "+r.Message)
	return nil
}
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logLines) WithGroup(string) slog.Handler      { return l }

// matching returns the lines starting with level and containing text.
func (l *logLines) matching(level slog.Level, text string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, s := range l.lines {
		if strings.HasPrefix(s, level.String()+" ") && strings.Contains(s, text) {
			out = append(out, s)
		}
	}
	return out
}

// Redis stops for 10 s in the middle of 5,000 messages (4,000 payments,
// 1,000 duplicates: half the same message again, half a producer re-send
// under a new message ID with the same business key), consumed from Kafka by
// a real consumer on Postgres with the Redis fast path on a redis-server of
// this test. Effects stay exactly once; the fast path's errors are counted;
// its circuit breaker opens once (one warning) and closes once after Redis
// is back (one info line).
func TestFastPathRedisOutageMidStream(t *testing.T) {
	t.Parallel()
	rs := startRedisServer(t)
	client := redis.NewClient(redisfast.ClientOptions(rs.addr()))
	t.Cleanup(func() { _ = client.Close() })
	logs := &logLines{}
	const cooldown = 3 * time.Second
	fast, err := redisfast.New(redisfast.Config{Client: client, Prefix: randomName("fp-"),
		Timeout: 300 * time.Millisecond, BreakerCooldown: cooldown, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	e := setup(t, func(c *pgstore.Config) { c.FastPath = fast })
	a := newApplier(e.appliesTable())
	topic, group := newTopic(t, 3), randomName("g-")
	var counters consumer.Counters
	bk := func(m *dedup.Message) (string, error) {
		if p := string(m.Payload); strings.HasPrefix(p, "pay-") {
			return strings.SplitN(p, ";", 2)[0], nil
		}
		return "", nil
	}
	r := startConsumer(t, consumer.Config{Scope: group, Store: e.store, Handler: a.handler(), BusinessKey: bk, Metrics: &counters},
		newSpySource(t, group, topic))

	// phase produces n new payments numbered from first, and n/4 copies of
	// earlier payments of [copyFrom, first+n): every other one the same
	// message again, the others a re-send with a new message ID.
	next := 0
	phase := func(name string, n, copyFrom int) []kmsg {
		first := next
		next += n
		var out []kmsg
		for i := first; i < first+n; i++ {
			out = append(out, kmsg{id: fmt.Sprintf("m-%05d", i), payload: fmt.Sprintf("pay-%05d;amount=%d", i, i%97)})
		}
		for j := range n / 4 {
			i := copyFrom + (j*7919)%(first+n-copyFrom)
			id := fmt.Sprintf("m-%05d", i)
			if j%2 == 1 {
				id = fmt.Sprintf("m-%05d-resend-%s", i, name)
			}
			out = append(out, kmsg{id: id, payload: fmt.Sprintf("pay-%05d;amount=%d", i, i%97)})
		}
		return out
	}
	handled := func() int64 {
		return counters.Get(string(dedup.OutcomeProcessed)) + counters.Get(string(dedup.OutcomeDuplicate))
	}
	waitHandled := func(n int64) {
		t.Helper()
		eventually(t, 3*time.Minute, fmt.Sprintf("%d deliveries handled", n), func() bool { return handled() >= n })
	}

	// Before: Redis up.
	produce(t, topic, phase("before", 1600, 0)...)
	waitHandled(2000)
	hitsBefore, _, errsBefore := e.store.FastPathStats()
	if errsBefore != 0 || fast.BreakerStats().Opened != 0 {
		t.Fatalf("before the outage: %d fast-path errors, breaker %+v", errsBefore, fast.BreakerStats())
	}

	// During: Redis stopped for 10 s; 1,500 more deliveries, the copies
	// among them of payments remembered in Redis before it stopped.
	rs.stop()
	stopped := time.Now()
	produce(t, topic, phase("during", 1200, 0)...)
	waitHandled(3500)
	if st := fast.BreakerStats(); st.Opened != 1 {
		t.Fatalf("Redis down, 1,500 deliveries later: breaker %+v, want opened once", st)
	}
	time.Sleep(10*time.Second - time.Since(stopped))
	rs.start()

	// After: every cool-down begun during the outage has ended, so the
	// first fast-path call now probes Redis. The last 1,500 deliveries come
	// in slices over more than a cool-down, so a probe that meets a
	// connection of the old server still leaves later probes.
	eventually(t, 30*time.Second, "the breaker's last cool-down to end", func() bool {
		return fast.BreakerStats().State != redisfast.BreakerOpen
	})
	after := phase("after", 1200, 0)
	for i := 0; i < len(after); i += 100 {
		produce(t, topic, after[i:min(i+100, len(after))]...)
		time.Sleep(300 * time.Millisecond)
	}
	waitHandled(5000)
	waitCaughtUp(t, group, topic)
	eventually(t, 30*time.Second, "the breaker to close", func() bool { return fast.BreakerStats().Closed >= 1 })
	r.stop(t)

	// Exactly-once effects.
	if got := counters.Get(string(dedup.OutcomeProcessed)); got != 4000 {
		t.Fatalf("processed %d, want 4000", got)
	}
	if got := counters.Get(string(dedup.OutcomeDuplicate)); got != 1000 {
		t.Fatalf("duplicates %d, want 1000", got)
	}
	if n := e.count(`select count(*) from ` + a.table); n != 4000 || a.total() != 4000 {
		t.Fatalf("%d effects and %d handler calls, want 4000 each", n, a.total())
	}
	if n := e.count(`select count(*) from (select business_key from ` + a.table + ` group by 1 having count(*) > 1) d`); n != 0 {
		t.Fatalf("%d payments applied more than once", n)
	}
	// The fast path was used before and after, failed during.
	hits, _, errs := e.store.FastPathStats()
	st := fast.BreakerStats()
	t.Logf("fast path: hits %d (%d before the outage), errors %d; breaker %+v", hits, hitsBefore, errs, st)
	if errs == 0 {
		t.Fatal("no fast-path error counted during the outage")
	}
	if hits <= hitsBefore {
		t.Fatalf("no fast-path hit after Redis came back (hits %d, %d before the outage)", hits, hitsBefore)
	}
	if st.Opened != 1 || st.Closed != 1 || st.State != redisfast.BreakerClosed || st.Skipped == 0 {
		t.Fatalf("breaker %+v, want opened once, closed once, closed now, calls skipped", st)
	}
	if w, i := logs.matching(slog.LevelWarn, "fast path"), logs.matching(slog.LevelInfo, "fast path"); len(w) != 1 || len(i) != 1 {
		t.Fatalf("breaker log lines: warnings %q, info %q; want one each", w, i)
	}
}
