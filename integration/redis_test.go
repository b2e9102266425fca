package integration

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/dedup/redisfast"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

func redisClient(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: redisAddress(t)})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redis at %s: %v", redisAddress(t), err)
	}
	return c
}

// setupFast is setup with a Redis fast path on a fresh key prefix.
func setupFast(t testing.TB, client *redis.Client) (*env, *redisfast.FastPath) {
	t.Helper()
	fp, err := redisfast.New(redisfast.Config{Client: client, Prefix: randomName("fp-"), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return setup(t, func(c *pgstore.Config) { c.FastPath = fp }), fp
}

// Duplicates of SUCCEEDED records are answered by Redis; a conflicting
// payload is not, and still reaches the dead-letter path in Postgres.
func TestRedisFastPathHitsAndConflicts(t *testing.T) {
	t.Parallel()
	e, _ := setupFast(t, redisClient(t))
	tbl := e.paymentsTable()
	s := &spy{table: tbl}
	if res, err := e.store.Process(e.ctx, msg(t, "payments", "m-1", "pay-1", "40.00"), s.handle); err != nil || res.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("first: %+v %v", res, err)
	}
	for _, copyOf := range []struct {
		id, bk string
		by     dedup.MatchedBy
	}{{"m-1", "pay-1", dedup.ByMessageID}, {"m-1-resend", "pay-1", dedup.ByBusinessKey}} {
		res, err := e.store.Process(e.ctx, msg(t, "payments", copyOf.id, copyOf.bk, "40.00"), s.handle)
		if err != nil || res.Outcome != dedup.OutcomeDuplicate || res.MatchedBy != copyOf.by {
			t.Fatalf("copy %s: %+v %v", copyOf.id, res, err)
		}
	}
	hits, _, errs := e.store.FastPathStats()
	if hits != 2 || errs != 0 {
		t.Fatalf("fast path hits %d errors %d, want 2 and 0", hits, errs)
	}
	res, err := e.store.Process(e.ctx, msg(t, "payments", "m-1", "pay-1", "45.00"), s.handle)
	if err != nil || res.Outcome != dedup.OutcomeConflict || len(e.deadLetters("payments")) != 1 {
		t.Fatalf("conflict through the fast path: %+v %v", res, err)
	}
	if s.calls.Load() != 1 {
		t.Fatalf("handler calls = %d, want 1", s.calls.Load())
	}
}

// S11: a duplicate reaching another worker while the first handler still
// runs misses Redis, waits on Postgres, and ends a duplicate. With Redis
// refusing connections the counts are the same and the errors are counted.
func TestS11FastPathMissFallsThroughToPostgres(t *testing.T) {
	t.Parallel()
	for _, redisDown := range []bool{false, true} {
		t.Run(map[bool]string{false: "redis-up", true: "redis-down"}[redisDown], func(t *testing.T) {
			t.Parallel()
			client := redisClient(t)
			if redisDown {
				client = redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
				t.Cleanup(func() { _ = client.Close() })
			}
			e, _ := setupFast(t, client)
			tbl := e.paymentsTable()
			var calls atomic.Int64
			inHandler, release := make(chan struct{}), make(chan struct{})
			releaseOnce := sync.OnceFunc(func() { close(release) })
			t.Cleanup(releaseOnce) // a failed wait must not leave the first copy's transaction open
			slow := func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
				if calls.Add(1) == 1 {
					close(inHandler)
				}
				if _, err := tx.Exec(ctx, `insert into `+tbl+` (payment_id, amount) values ('p-11', 1)`); err != nil {
					return err
				}
				<-release // still running while the copy arrives
				return nil
			}
			first := make(chan error, 1)
			go func() {
				res, err := e.store.Process(e.ctx, msg(t, "payments", "m-11", "", "x"), slow)
				if err == nil && res.Outcome != dedup.OutcomeProcessed {
					err = errors.New("first copy: " + string(res.Outcome))
				}
				first <- err
			}()
			<-inHandler
			type answer struct {
				res dedup.Result
				err error
			}
			second := make(chan answer, 1)
			go func() {
				res, err := e.store.Process(e.ctx, msg(t, "payments", "m-11", "", "x"), slow)
				second <- answer{res, err}
			}()
			// The copy missed Redis and waits on the first copy's row lock
			// in Postgres; then the first handler returns.
			waitLockWaiter(t, e.pool, e.schema)
			releaseOnce()
			if ferr := <-first; ferr != nil {
				t.Fatal(ferr)
			}
			a := <-second
			if res, err := a.res, a.err; err != nil || res.Outcome != dedup.OutcomeDuplicate {
				t.Fatalf("copy while the first handler ran: %+v %v", res, err)
			}
			if calls.Load() != 1 || e.count(`select count(*) from `+tbl) != 1 || e.record("payments", "m-11").Status != dedup.StatusSucceeded {
				t.Fatalf("calls %d, want 1 call, 1 row, SUCCEEDED", calls.Load())
			}
			_, misses, errs := e.store.FastPathStats()
			if redisDown && errs != 4 {
				t.Fatalf("fast-path errors = %d, want 4 (2 lookups, 2 remembers)", errs)
			}
			if !redisDown && (errs != 0 || misses != 2) {
				t.Fatalf("misses %d errors %d, want 2 misses and 0 errors", misses, errs)
			}
		})
	}
}

// S12: a claim marker left in Redis by a worker that died before its commit
// is not trusted: worker 2 processes the message and acks only after the
// SUCCEEDED row exists.
func TestS12StaleRedisMarkerNotTrusted(t *testing.T) {
	t.Parallel()
	client := redisClient(t)
	e, fp := setupFast(t, client)
	s := &spy{table: e.paymentsTable()}
	id := msg(t, "payments", "m-400", "", "x").Identity
	if err := client.Set(e.ctx, fp.Key(id.Scope, "m", id.MessageID), "claim:worker-1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := e.store.Process(e.ctx, msg(t, "payments", "m-400", "", "x"), s.handle)
	if err != nil || res.Outcome != dedup.OutcomeProcessed || s.calls.Load() != 1 {
		t.Fatalf("worker 2: %+v %v calls %d, want processed", res, err, s.calls.Load())
	}
	if r := e.record("payments", "m-400"); r.Status != dedup.StatusSucceeded || e.count(`select count(*) from `+s.table) != 1 {
		t.Fatalf("record %+v", r)
	}
	// The marker is now a SUCCEEDED entry: the next copy is a fast-path hit.
	if res, err := e.store.Process(e.ctx, msg(t, "payments", "m-400", "", "x"), s.handle); err != nil || res.Outcome != dedup.OutcomeDuplicate {
		t.Fatalf("copy after success: %+v %v", res, err)
	}
	if hits, _, _ := e.store.FastPathStats(); hits != 1 {
		t.Fatalf("fast-path hits = %d, want 1", hits)
	}
}

// S12, the root of it: the fast path is written only after a SUCCEEDED
// commit. A handler that fails leaves no Redis marker (checked from inside
// the handler and after), so the next copy runs the handler again.
func TestS12NoRedisMarkerBeforeCommit(t *testing.T) {
	t.Parallel()
	client := redisClient(t)
	e, fp := setupFast(t, client)
	tbl := e.paymentsTable()
	id := msg(t, "payments", "m-401", "pay-401", "x").Identity
	keys := []string{fp.Key(id.Scope, "m", id.MessageID), fp.Key(id.Scope, "b", id.BusinessKey)}
	markers := func() int64 {
		n, err := client.Exists(e.ctx, keys...).Result()
		if err != nil {
			t.Error(err)
		}
		return n
	}
	var calls int
	var seenInHandler []int64
	h := func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
		calls++
		seenInHandler = append(seenInHandler, markers())
		if _, err := tx.Exec(ctx, `insert into `+tbl+` (payment_id, amount) values ('p-401', 1)`); err != nil {
			return err
		}
		if calls == 1 {
			return errors.New("worker 1 dies before its commit")
		}
		return nil
	}
	if res, err := e.store.Process(e.ctx, msg(t, "payments", "m-401", "pay-401", "x"), h); err != nil || res.Outcome != dedup.OutcomeRetry {
		t.Fatalf("first copy: %+v %v", res, err)
	}
	if n := markers(); n != 0 {
		t.Fatalf("%d fast-path markers after a failed attempt, want 0", n)
	}
	res, err := e.store.Process(e.ctx, msg(t, "payments", "m-401", "pay-401", "x"), h)
	if err != nil || res.Outcome != dedup.OutcomeProcessed || res.Attempts != 2 || calls != 2 {
		t.Fatalf("second copy: %+v %v calls %d, want processed on attempt 2", res, err, calls)
	}
	if seenInHandler[0] != 0 || seenInHandler[1] != 0 {
		t.Fatalf("markers seen inside the handler = %v, want none before the commit", seenInHandler)
	}
	if n := markers(); n != 2 {
		t.Fatalf("%d fast-path markers after SUCCEEDED, want 2 (message ID and business key)", n)
	}
	if r := e.record("payments", "m-401"); r.Status != dedup.StatusSucceeded || r.Attempts != 2 || e.count(`select count(*) from `+tbl) != 1 {
		t.Fatalf("record = %+v", r)
	}
}

// flushFastPath deletes every fast-path key under prefix (as a Redis
// failover or FLUSHALL would), failing when there was none to delete.
func flushFastPath(t testing.TB, prefix string) {
	t.Helper()
	rc := redisClient(t)
	ctx := context.Background()
	keys, err := rc.Keys(ctx, prefix+":*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("fast-path keys before the flush: %v %v", keys, err)
	}
	if err := rc.Del(ctx, keys...).Err(); err != nil {
		t.Fatal(err)
	}
}
