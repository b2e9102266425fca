package integration

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/dedup/redisfast"
	"github.com/redis/go-redis/v9"
)

// BenchmarkFastPathRedisDown measures what a Redis outage costs a store
// with the Redis fast path, against the ceiling of the same run: the same
// store without a fast path (Postgres only). Redis is down (a loopback port
// where nothing listens: connection refused) and the fast path's circuit
// breaker is open, as it is a few calls into an outage. The two stores take
// turns message by message on the same tables, 20% of the messages being
// duplicates, so load on the machine hits both alike. It reports msgs/s of
// each and "x-postgres-only", the ratio of the two throughputs, which must be
// at least 0.9 (the benchmark fails below).
//
//	make bench   (or: go test -run '^$' -bench FastPathRedisDown ./integration)
func BenchmarkFastPathRedisDown(b *testing.B) {
	e, _, handler := benchPayments(b)
	port, err := freePort() // closed again: nothing listens there
	if err != nil {
		b.Fatal(err)
	}
	client := redis.NewClient(redisfast.ClientOptions("127.0.0.1:" + strconv.Itoa(port)))
	b.Cleanup(func() { _ = client.Close() })
	fast, err := redisfast.New(redisfast.Config{Client: client, Prefix: randomName("fp-")})
	if err != nil {
		b.Fatal(err)
	}
	down, err := pgstore.New(e.pool, pgstore.Config{Schema: e.schema, Fingerprinter: testFingerprinter(b), FastPath: fast})
	if err != nil {
		b.Fatal(err)
	}
	// The outage has begun: the breaker opened on the first failed calls.
	for i := 0; fast.BreakerStats().State != redisfast.BreakerOpen; i++ {
		if i == 100 {
			b.Fatalf("the breaker is not open after %d failed calls: %+v", i, fast.BreakerStats())
		}
		_, _, _ = fast.Lookup(e.ctx, benchMsg(b, "warm-up").Identity)
	}

	stores := []struct {
		name string
		st   *pgstore.Store
		took time.Duration
		n    int
	}{{name: "postgres-only", st: e.store}, {name: "redis-down", st: down}}
	run := randomName("")
	b.ResetTimer()
	for i := range b.N {
		s := &stores[i%2]
		n := i / 2
		id := fmt.Sprintf("%s-%s-%d", s.name, run, n)
		want := dedup.OutcomeProcessed
		if n%5 == 4 { // every fifth message is a copy of the one before
			id = fmt.Sprintf("%s-%s-%d", s.name, run, n-1)
			want = dedup.OutcomeDuplicate
		}
		start := time.Now()
		res, err := s.st.Process(e.ctx, benchMsg(b, id), handler)
		s.took += time.Since(start)
		s.n++
		if err != nil || res.Outcome != want {
			b.Fatalf("%s %s: %+v %v, want %s", s.name, id, res, err, want)
		}
	}
	b.StopTimer()
	rate := func(i int) float64 { return float64(stores[i].n) / stores[i].took.Seconds() }
	b.ReportMetric(rate(0), "postgres-only-msgs/s")
	b.ReportMetric(rate(1), "redis-down-msgs/s")
	ratio := rate(1) / rate(0)
	b.ReportMetric(ratio, "x-postgres-only")
	if st := fast.BreakerStats(); st.State == redisfast.BreakerClosed || st.Opened != 1 {
		b.Fatalf("breaker %+v, want opened once, at the warm-up, and never closed", st)
	}
	if _, _, errs := down.FastPathStats(); errs == 0 && b.N > 1 {
		b.Fatal("no fast-path error counted with Redis down")
	}
	if b.N >= 100 && ratio < 0.9 {
		b.Errorf("with Redis down the store runs at %.2f of Postgres-only throughput, want at least 0.9", ratio)
	}
}
