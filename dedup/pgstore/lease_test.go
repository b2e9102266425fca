package pgstore

// Store-level tests of lease mode on Postgres: S13 (fencing) and S14 (clock
// skew). Moved here from the integration module; the harness is in
// env_test.go.

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5/pgxpool"
)

// S13: lease mode for side effects outside the database. Owner A claims with
// a 4 s lease and stalls without heartbeats until B is done; a copy while
// A's lease is live finds it held; B, once the lease has expired in database
// time, takes over and completes; A's completion is fenced and not acked.
// (The scenario's 2 s / 5 s / 3 s as conditions: the copy runs while
// lease_until is ahead of the database's now(), B once it is not; the 4 s
// TTL is the margin for a loaded machine between the claim and the copy.)
func TestS13LeaseLostWhileOwnerWorks(t *testing.T) {
	e := newEnv(t, nil)
	provider := e.table("provider_charges")
	e.exec(`create table ` + provider + ` (idempotency_key text primary key, fence bigint not null, owner text not null)`)
	// charge is the downstream side effect: the provider dedups on the key.
	charge := func(ctx context.Context, owner string) error {
		l, ok := dedup.LeaseFromContext(ctx)
		if !ok {
			return errors.New("no lease in context")
		}
		_, err := e.pool.Exec(ctx, `insert into `+provider+` values ($1, $2, $3) on conflict (idempotency_key) do nothing`,
			l.IdempotencyKey(), l.Fence, owner)
		return err
	}
	opt := dedup.LeaseOptions{TTL: 4 * time.Second, DisableHeartbeat: true}
	var aFence int64
	type outcome struct {
		res dedup.Result
		err error
	}
	aDone := make(chan outcome, 1)
	claimed := make(chan struct{})
	release := make(chan struct{})
	releaseA := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseA)
	go func() {
		res, err := e.store.ProcessLeased(e.ctx, e.msg("m-13", "charge-13", "x"), func(ctx context.Context, _ *dedup.Message) error {
			l, _ := dedup.LeaseFromContext(ctx)
			aFence = l.Fence
			close(claimed)
			if err := charge(ctx, "A"); err != nil {
				return err
			}
			<-release // stalled, no heartbeat: until B has taken over and completed
			return nil
		}, opt)
		aDone <- outcome{res, err}
	}()
	<-claimed
	if left := e.leaseLeft("m-13"); left <= 0 || left > 4.01 {
		t.Fatalf("lease_until - database now() = %.3fs, want within (0, 4]", left)
	}

	early, err := e.store.ProcessLeased(e.ctx, e.msg("m-13", "charge-13", "x"), func(context.Context, *dedup.Message) error {
		t.Error("handler ran while the lease was live")
		return nil
	}, opt)
	if err != nil || early.Outcome != dedup.OutcomeRetry || !errors.Is(early.Err, dedup.ErrLeaseHeld) || early.Outcome.Acked() {
		t.Fatalf("copy during A's lease: %+v %v, want retry (lease held, not acked)", early, err)
	}
	if left := e.leaseLeft("m-13"); left <= 0 {
		t.Fatalf("A's lease ran out (%.3fs left) before the copy was answered: the copy did not meet a live lease (the machine stalled for longer than the TTL)", left)
	}

	e.waitLeaseExpired("m-13") // A still stalls
	var bFence int64
	b, err := e.store.ProcessLeased(e.ctx, e.msg("m-13", "charge-13", "x"), func(ctx context.Context, _ *dedup.Message) error {
		l, _ := dedup.LeaseFromContext(ctx)
		bFence = l.Fence
		return charge(ctx, "B")
	}, dedup.LeaseOptions{TTL: 4 * time.Second})
	if err != nil || b.Outcome != dedup.OutcomeProcessed || b.Attempts != 2 {
		t.Fatalf("B: %+v %v, want processed on attempt 2", b, err)
	}
	releaseA()
	a := <-aDone
	if a.err != nil || a.res.Outcome != dedup.OutcomeFenced || !errors.Is(a.res.Err, dedup.ErrFenced) || a.res.Outcome.Acked() {
		t.Fatalf("A: %+v %v, want fenced and not acked", a.res, a.err)
	}
	r := e.record("m-13")
	if aFence < 1 || bFence != aFence+1 || r.Fence != bFence || r.Status != dedup.StatusSucceeded || r.Attempts != 2 {
		t.Fatalf("record = %+v, A's fence %d, B's %d: want SUCCEEDED, attempts 2, fence grown by 1", r, aFence, bFence)
	}
	if n := e.count(`select count(*) from ` + provider); n != 1 {
		t.Fatalf("downstream effects = %d, want 1 (keyed by the identity)", n)
	}
	// A redelivery after completion is a plain duplicate.
	again, err := e.store.ProcessLeased(e.ctx, e.msg("m-13", "charge-13", "x"), func(context.Context, *dedup.Message) error {
		t.Error("handler ran for a completed record")
		return nil
	}, opt)
	if err != nil || again.Outcome != dedup.OutcomeDuplicate {
		t.Fatalf("redelivery: %+v %v", again, err)
	}
}

// S14: the consumer's clock runs 10 minutes ahead of the database. Here the
// database's now() is shadowed to run 10 minutes behind the real clock (which
// the application uses), for a pool of its own. Lease expiry and retention
// must follow database time: no early takeover, no early purge.
func TestS14ClockSkewUsesDatabaseTime(t *testing.T) {
	base := newOwnSchemaEnv(t, nil) // it purges
	skew := base.biz
	base.exec(`create function ` + skew + `.now() returns timestamptz language sql stable as $$ select pg_catalog.now() - interval '10 minutes' $$`)
	pool := base.newPool(func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["search_path"] = skew + ", pg_catalog" })
	var dbAhead float64
	if err := pool.QueryRow(base.ctx, `select extract(epoch from now() - clock_timestamp())`).Scan(&dbAhead); err != nil || dbAhead > -590 {
		t.Fatalf("shadowed now() is %.0fs from the real clock (%v), want about -600", dbAhead, err)
	}
	st := base.newStore(pool, func(c *Config) { c.SucceededRetention = time.Minute })
	opt := dedup.LeaseOptions{TTL: 3 * time.Second, DisableHeartbeat: true}
	claimed, release := make(chan struct{}), make(chan struct{})
	done := make(chan dedup.Result, 1)
	go func() {
		res, _ := st.ProcessLeased(base.ctx, base.msg("m-14", "", "x"), func(context.Context, *dedup.Message) error {
			close(claimed)
			<-release
			return nil
		}, opt)
		done <- res
	}()
	<-claimed
	// The owner's lease in the skewed database time: written from the
	// database's now() (10 minutes behind), so it is live now and for at
	// most its TTL. A lease_until taken from the application's clock would
	// be 10 minutes ahead of it.
	var leaseLeft float64
	if err := pool.QueryRow(base.ctx, `select extract(epoch from lease_until - now()) from `+base.records()+` where message_id = 'm-14'`).Scan(&leaseLeft); err != nil || leaseLeft <= 0 || leaseLeft > 3.01 {
		t.Fatalf("lease_until - database now() = %.3fs (%v), want within (0, 3]", leaseLeft, err)
	}
	copyRes, err := st.ProcessLeased(base.ctx, base.msg("m-14", "", "x"), func(context.Context, *dedup.Message) error {
		return errors.New("early takeover")
	}, opt)
	close(release)
	if err != nil || copyRes.Outcome != dedup.OutcomeRetry || !errors.Is(copyRes.Err, dedup.ErrLeaseHeld) {
		t.Fatalf("copy during a live lease: %+v %v, want ErrLeaseHeld", copyRes, err)
	}
	if r := <-done; r.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("owner: %+v", r)
	}
	// Retention: the record expires 1 minute after its completion in
	// database time; a purge now must not take it.
	var left float64
	if err := pool.QueryRow(base.ctx, `select extract(epoch from expires_at - now()) from `+base.records()+` where message_id = 'm-14'`).Scan(&left); err != nil || left < 50 || left > 61 {
		t.Fatalf("expires_at - database now() = %.1fs (%v), want about 60", left, err)
	}
	if n, err := st.Purge(base.ctx, 10); err != nil || n != 0 {
		t.Fatalf("purge right after completion removed %d (%v), want 0", n, err)
	}
	if _, err := st.Lookup(base.ctx, base.scope, "m-14"); err != nil {
		t.Fatalf("record purged early: %v", err)
	}
}
