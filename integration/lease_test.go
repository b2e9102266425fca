package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
)

// S13 and S14: lease mode for side effects outside the database. Owner A
// claims with a 2 s lease and stalls 5 s without heartbeats; a copy at 1 s
// finds the lease live (no early takeover: deadlines are database time);
// B at 3 s takes over and completes; A's completion is fenced and not acked.
func TestS13S14LeaseLostWhileOwnerWorks(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
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
	opt := dedup.LeaseOptions{TTL: 2 * time.Second, Heartbeat: -1}
	type outcome struct {
		res dedup.Result
		err error
	}
	aDone := make(chan outcome, 1)
	claimed := make(chan struct{})
	go func() {
		res, err := e.store.ProcessLeased(e.ctx, msg(t, "billing", "m-13", "charge-13", "x"), func(ctx context.Context, m *dedup.Message) error {
			close(claimed)
			if err := charge(ctx, "A"); err != nil {
				return err
			}
			time.Sleep(5 * time.Second) // stalled: no heartbeat
			return nil
		}, opt)
		aDone <- outcome{res, err}
	}()
	<-claimed
	var leaseLeft float64
	if err := e.pool.QueryRow(e.ctx, `select extract(epoch from lease_until - now()) from `+e.table("consumption_records")+` where message_id = 'm-13'`).Scan(&leaseLeft); err != nil {
		t.Fatal(err)
	}
	if leaseLeft <= 0 || leaseLeft > 2.01 {
		t.Fatalf("lease_until - database now() = %.3fs, want within (0, 2]", leaseLeft)
	}

	time.Sleep(time.Second)
	early, err := e.store.ProcessLeased(e.ctx, msg(t, "billing", "m-13", "charge-13", "x"), func(context.Context, *dedup.Message) error {
		t.Error("handler ran while the lease was live")
		return nil
	}, opt)
	if err != nil || early.Outcome != dedup.OutcomeRetry || !errors.Is(early.Err, dedup.ErrLeaseHeld) || early.Outcome.Acked() {
		t.Fatalf("copy at 1s: %+v %v, want retry (lease held, not acked)", early, err)
	}

	time.Sleep(2 * time.Second) // 3 s: A's lease has expired
	b, err := e.store.ProcessLeased(e.ctx, msg(t, "billing", "m-13", "charge-13", "x"), func(ctx context.Context, m *dedup.Message) error {
		return charge(ctx, "B")
	}, dedup.LeaseOptions{TTL: 2 * time.Second})
	if err != nil || b.Outcome != dedup.OutcomeProcessed || b.Attempts != 2 {
		t.Fatalf("B: %+v %v, want processed on attempt 2", b, err)
	}
	a := <-aDone
	if a.err != nil || a.res.Outcome != dedup.OutcomeFenced || !errors.Is(a.res.Err, dedup.ErrFenced) || a.res.Outcome.Acked() {
		t.Fatalf("A: %+v %v, want fenced and not acked", a.res, a.err)
	}
	r := e.record("billing", "m-13")
	if r.Status != dedup.StatusSucceeded || r.Fence != 2 || r.Attempts != 2 {
		t.Fatalf("record = %+v, want SUCCEEDED, fence 2 (grew by 1), attempts 2", r)
	}
	if n := e.count(`select count(*) from ` + provider); n != 1 {
		t.Fatalf("downstream effects = %d, want 1 (keyed by the identity)", n)
	}
	// A redelivery after completion is a plain duplicate.
	again, err := e.store.ProcessLeased(e.ctx, msg(t, "billing", "m-13", "charge-13", "x"), func(context.Context, *dedup.Message) error {
		t.Error("handler ran for a completed record")
		return nil
	}, opt)
	if err != nil || again.Outcome != dedup.OutcomeDuplicate {
		t.Fatalf("redelivery: %+v %v", again, err)
	}
}

// Lease mode marks failures like atomic mode: a permanent error ends the
// lease with FAILED_FINAL and a dead letter; a heartbeat keeps a slow owner's
// lease alive past its TTL.
func TestLeaseHeartbeatAndFailure(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	res, err := e.store.ProcessLeased(e.ctx, msg(t, "billing", "m-slow", "", "x"), func(ctx context.Context, m *dedup.Message) error {
		time.Sleep(2500 * time.Millisecond) // longer than the TTL; heartbeats every 300ms
		return ctx.Err()
	}, dedup.LeaseOptions{TTL: time.Second, Heartbeat: 300 * time.Millisecond})
	if err != nil || res.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("slow owner with heartbeat: %+v %v", res, err)
	}
	res, err = e.store.ProcessLeased(e.ctx, msg(t, "billing", "m-bad", "", "x"), func(context.Context, *dedup.Message) error {
		return dedup.Permanent(errors.New("card declined"))
	}, dedup.LeaseOptions{TTL: time.Second})
	if err != nil || res.Outcome != dedup.OutcomeDeadLetter || res.DeadLetterID == 0 {
		t.Fatalf("permanent failure: %+v %v", res, err)
	}
	if r := e.record("billing", "m-bad"); r.Status != dedup.StatusFailedFinal || r.Attempts != 1 || r.LastErrorClass != "permanent:error" {
		t.Fatalf("record = %+v", r)
	}
	if err := (dedup.LeaseOptions{TTL: 20 * time.Minute}).ValidateUnder(15 * time.Minute); !errors.Is(err, dedup.ErrInvalidConfig) {
		t.Fatalf("lease TTL above RocketMQ's ConsumeTimeout accepted: %v", err)
	}
}
