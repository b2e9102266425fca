package integration

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// Waiting on conditions instead of sleeping: each helper polls durable state
// (Postgres, Redis) or what a client has observed, with a generous deadline,
// through eventually (kafka_harness_test.go).

// waitLockWaiter waits until a backend of this database runs a statement
// naming schema and waits on a lock: a second copy blocked on the row lock
// of the first copy's transaction. schema is a test's own random schema, so
// no other test's backend matches.
func waitLockWaiter(t testing.TB, pool *pgxpool.Pool, schema string) {
	t.Helper()
	eventually(t, 60*time.Second, "a backend of schema "+schema+" to wait on a lock", func() bool {
		var n int
		err := pool.QueryRow(context.Background(), `select count(*) from pg_stat_activity
where datname = current_database() and wait_event_type = 'Lock' and pid <> pg_backend_pid()
and strpos(query, $1) > 0`, schema).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
}

// waitLeaseExpired waits until the lease of (scope, messageID) has ended in
// the store's own time: on Postgres lease_until is past by the database's
// clock; on Redis the lease key is gone (its PX ran out).
func waitLeaseExpired(t *testing.T, st adminStore, scope, messageID string) {
	t.Helper()
	switch s := st.(type) {
	case *pgstore.Store:
		records := pgx.Identifier{s.Config().Schema, "consumption_records"}.Sanitize()
		eventually(t, 60*time.Second, "the lease of "+messageID+" to expire in database time", func() bool {
			var expired bool
			err := s.Pool().QueryRow(context.Background(), `select coalesce(bool_and(lease_until <= now()), false) from `+records+`
where scope = $1 and message_id = $2`, scope, messageID).Scan(&expired)
			if err != nil {
				t.Fatal(err)
			}
			return expired
		})
	case *redisstore.Store:
		waitLeaseGone(t, s, messageID)
	default:
		t.Fatalf("waitLeaseExpired: no lease probe for %T", st)
	}
}

// scriptCounter is a go-redis hook counting the Lua script calls (EVAL,
// EVALSHA) that completed: redisstore runs every store operation, renewals
// included, as one script call.
type scriptCounter struct{ n atomic.Int64 }

func countScripts(c redis.UniversalClient) *scriptCounter {
	h := &scriptCounter{}
	c.AddHook(h)
	return h
}

func (h *scriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if strings.HasPrefix(strings.ToLower(cmd.Name()), "eval") {
			h.n.Add(1)
		}
		return err
	}
}
func (h *scriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// waitMore waits until n more script calls than now have completed.
func (h *scriptCounter) waitMore(t testing.TB, n int64, what string) {
	t.Helper()
	target := h.n.Load() + n
	eventually(t, 60*time.Second, what, func() bool { return h.n.Load() >= target })
}
