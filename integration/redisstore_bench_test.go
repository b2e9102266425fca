package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
)

// BenchmarkRedisStoreOverhead measures what the Redis-only store costs per
// message against a ceiling measured in the same run: the cheapest correct
// claim there is without idemq, one SET NX PX round trip per message.
//
//   - ceiling=set-nx: SET key token NX PX 30000, one per message;
//   - process-new: ProcessLeased of a new message (claim script, handler,
//     completion script: two round trips, plus the fingerprint);
//   - process-duplicate: ProcessLeased of a message that already succeeded
//     (one claim script; the handler does not run).
//
// Each reports msgs/s and, for the idemq cases, "x-ceiling".
//
//	make bench   (or: go test -run '^$' -bench RedisStoreOverhead ./integration)
func BenchmarkRedisStoreOverhead(b *testing.B) {
	c := redisClient(b)
	s := newRedisStore(b, nil)
	ctx := context.Background()
	noop := func(context.Context, *dedup.Message) error { return nil }
	var ceiling time.Duration
	report := func(b *testing.B, d time.Duration) time.Duration {
		b.ReportMetric(float64(b.N)/d.Seconds(), "msgs/s")
		return d / time.Duration(b.N)
	}
	b.Run("ceiling=set-nx", func(b *testing.B) {
		run := randomName(s.Config().Prefix + ":ceiling:")
		start := time.Now()
		for i := range b.N {
			if err := c.SetNX(ctx, fmt.Sprintf("%s:%d", run, i), "token", 30*time.Second).Err(); err != nil {
				b.Fatal(err)
			}
		}
		ceiling = report(b, time.Since(start))
	})
	for _, dup := range []bool{false, true} {
		name := map[bool]string{false: "process-new", true: "process-duplicate"}[dup]
		b.Run(name, func(b *testing.B) {
			run := randomName("")
			if dup {
				if _, err := s.ProcessLeased(ctx, msg(b, "bench", "dup-"+run, "", `{"amount":100}`), noop, dedup.LeaseOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			want := map[bool]dedup.Outcome{false: dedup.OutcomeProcessed, true: dedup.OutcomeDuplicate}[dup]
			start := time.Now()
			for i := range b.N {
				id := fmt.Sprintf("new-%s-%d", run, i)
				if dup {
					id = "dup-" + run
				}
				res, err := s.ProcessLeased(ctx, msg(b, "bench", id, "", `{"amount":100}`), noop, dedup.LeaseOptions{})
				if err != nil || res.Outcome != want {
					b.Fatalf("%+v %v", res, err)
				}
			}
			per := report(b, time.Since(start))
			if ceiling > 0 {
				b.ReportMetric(float64(per)/float64(ceiling), "x-ceiling")
			}
		})
	}
}
