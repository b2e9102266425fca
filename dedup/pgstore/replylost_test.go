package pgstore

// A reply lost after Postgres did the work (S18 on Postgres, and a COMMIT
// that landed unseen): a TCP proxy (internal/faultproxy) between the store's
// pool and Postgres swallows the answer to one request and closes its
// connection. Moved here from the integration module; the harness is in
// env_test.go. Each test has its own proxy and pool, so a predicate sees no
// other test's statements.

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/testkit"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/faultproxy"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// proxiedStore is a store on the test's schema (tweak applied to its
// Config) whose pool, of at most 4 connections, reaches Postgres through a
// fault proxy of the test's own. The pool parses every statement anew
// (pgx.QueryExecModeDescribeExec) so that its text is on the wire for the
// proxy's predicates each time, not only the first time on a connection.
func (e *storeEnv) proxiedStore(tweak func(*Config)) (*Store, *faultproxy.Proxy) {
	e.t.Helper()
	direct := dbStore.pool.Config().ConnConfig
	target := net.JoinHostPort(direct.Host, strconv.Itoa(int(direct.Port)))
	p := faultproxy.New(e.t, target, faultproxy.Postgres)
	at, err := netip.ParseAddrPort(p.Addr())
	if err != nil {
		e.t.Fatal(err)
	}
	pool := e.newPool(func(c *pgxpool.Config) {
		c.ConnConfig.Host, c.ConnConfig.Port, c.ConnConfig.Fallbacks = at.Addr().String(), at.Port(), nil
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeDescribeExec
		c.MaxConns = 4
	})
	return e.newStore(pool, tweak), p
}

// total is the handler's calls over every message ID.
func (h *itemHandler) total() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, c := range h.calls {
		n += c
	}
	return n
}

// logBuffer collects a logger's output.
type logBuffer = testkit.LogBuffer

// A COMMIT that committed but whose reply was lost (the proxy drops it)
// is an outcome unknown too: not counted, not acked; the next copy finds
// the truth. Atomic and batched: the next copy is a duplicate, applied once.
// Lease mode retries the call in place (OutcomeUnknownRetry): a claim whose
// reply was lost finds its own committed claim by owner token and runs the
// handler at attempt 1 (with MaxAttempts 1, no dead letter), and a
// completion or failure mark whose reply was lost recognises its own
// earlier commit by owner token and fence (not reported as fenced). With no
// retry allowed, the claim's unknown outcome is returned as such.
// TestLeaseCallAnswersLost covers every lease call one by one.
func TestCommitReplyLost(t *testing.T) {
	t.Parallel()
	// replyEnv is itemsEnv's table and handler, with a store (MaxAttempts 1,
	// then tweak) whose pool reaches Postgres through a proxy.
	replyEnv := func(t *testing.T, tweak func(*Config)) (*storeEnv, *faultproxy.Proxy, *Store, string, *itemHandler) {
		e, tbl, h := itemsEnv(t, false)
		st, proxy := e.proxiedStore(func(c *Config) {
			c.MaxAttempts = 1
			if tweak != nil {
				tweak(c)
			}
		})
		return e, proxy, st, tbl, h
	}
	// lose arms the proxy from inside the handler, for the next request
	// that match accepts.
	lose := func(p *faultproxy.Proxy, match func([]byte) bool, h Handler) Handler {
		return func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
			if err := h(ctx, tx, m); err != nil {
				return err
			}
			p.DropReplyOnce(match)
			return nil
		}
	}

	t.Run("atomic", func(t *testing.T) {
		e, proxy, st, tbl, h := replyEnv(t, nil)
		res, err := st.Process(e.ctx, e.msg("m-1", "", "one"), lose(proxy, faultproxy.IsCommit, h.handle))
		if !errors.Is(err, dedup.ErrOutcomeUnknown) || !res.HandlerCalled || proxy.Dropped() != 1 {
			t.Fatalf("%+v, %v (proxy dropped %d); want ErrOutcomeUnknown with HandlerCalled", res, err, proxy.Dropped())
		}
		res, err = st.Process(e.ctx, e.msg("m-1", "", "one"), h.handle)
		if err != nil || res.Outcome != dedup.OutcomeDuplicate || res.HandlerCalled {
			t.Fatalf("next copy: %+v, %v; want a duplicate (the commit had landed)", res, err)
		}
		if n := e.count(`select count(*) from ` + tbl); n != 1 || h.total() != 1 || len(e.deadLetters()) != 0 {
			t.Fatalf("rows %d, calls %d; want 1 and 1, no dead letter", n, h.total())
		}
	})

	t.Run("batched", func(t *testing.T) {
		e, proxy, st, tbl, h := replyEnv(t, nil)
		batch := func() []*dedup.Message {
			return []*dedup.Message{e.msg("m-1", "", "one"), e.msg("m-2", "", "two")}
		}
		handler := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
			if m.Identity.MessageID == "m-2" {
				return lose(proxy, faultproxy.IsCommit, h.handle)(ctx, tx, m)
			}
			return h.handle(ctx, tx, m)
		}
		results, err := st.ProcessBatch(e.ctx, batch(), handler)
		if !errors.Is(err, dedup.ErrOutcomeUnknown) || len(results) != 2 || !results[0].HandlerCalled || !results[1].HandlerCalled {
			t.Fatalf("%+v, %v; want ErrOutcomeUnknown with HandlerCalled", results, err)
		}
		results, err = st.ProcessBatch(e.ctx, batch(), h.handle)
		if err != nil || results[0].Outcome != dedup.OutcomeDuplicate || results[1].Outcome != dedup.OutcomeDuplicate {
			t.Fatalf("next copies: %+v, %v; want duplicates", results, err)
		}
		if n := e.count(`select count(*) from ` + tbl); n != 2 || h.total() != 2 {
			t.Fatalf("rows %d, calls %d; want 2 and 2", n, h.total())
		}
	})

	leaseOpt := dedup.LeaseOptions{TTL: 30 * time.Second, DisableHeartbeat: true}
	leaseInsert := func(e *storeEnv, tbl string, calls *atomic.Int32) dedup.LeaseHandler {
		return func(ctx context.Context, m *dedup.Message) error {
			calls.Add(1)
			_, err := e.pool.Exec(ctx, `insert into `+tbl+` (k) values ($1)`, string(m.Payload))
			return err
		}
	}

	t.Run("lease claim", func(t *testing.T) {
		e, proxy, st, tbl, _ := replyEnv(t, nil)
		var calls atomic.Int32
		proxy.DropReplyOnce(faultproxy.CommitAfter(pgLeaseClaim))
		res, err := st.ProcessLeased(e.ctx, e.msg("m-1", "", "one"), leaseInsert(e, tbl, &calls), leaseOpt)
		if err != nil || res.Outcome != dedup.OutcomeProcessed || res.Attempts != 1 || calls.Load() != 1 || proxy.Dropped() != 1 {
			t.Fatalf("%+v, %v, %d calls (proxy dropped %d); want processed at attempt 1: the retried claim finds its own",
				res, err, calls.Load(), proxy.Dropped())
		}
		if rec := e.record("m-1"); rec.Status != dedup.StatusSucceeded || rec.Attempts != 1 || rec.Fence != 1 {
			t.Fatalf("record = %+v, want SUCCEEDED at attempt 1, fence 1 (one claim)", rec)
		}
		if n := e.count(`select count(*) from ` + tbl); n != 1 || len(e.deadLetters()) != 0 {
			t.Fatalf("rows %d; want 1, no dead letter", n)
		}
	})

	// The retries may outlast the TTL: the claim found then is extended as a
	// new claim would be, so the handler never starts under an expired
	// lease that another copy could take over.
	t.Run("lease claim found after its TTL", func(t *testing.T) {
		e, proxy, st, tbl, _ := replyEnv(t, func(c *Config) {
			c.OutcomeUnknownRetry = RetryPolicy{Attempts: 1, Initial: 3 * time.Second} // waits 1.5s to 4.5s
		})
		var calls atomic.Int32
		var live atomic.Bool
		proxy.DropReplyOnce(faultproxy.CommitAfter(pgLeaseClaim))
		res, err := st.ProcessLeased(e.ctx, e.msg("m-1", "", "one"), func(ctx context.Context, m *dedup.Message) error {
			live.Store(e.count(`select count(*) from `+e.records()+
				` where scope = $1 and message_id = 'm-1' and status = 'PROCESSING' and lease_until > now()`, e.scope) == 1)
			return leaseInsert(e, tbl, &calls)(ctx, m)
		}, dedup.LeaseOptions{TTL: time.Second, DisableHeartbeat: true})
		if err != nil || res.Outcome != dedup.OutcomeProcessed || res.Attempts != 1 || calls.Load() != 1 {
			t.Fatalf("%+v, %v, %d calls; want processed at attempt 1", res, err, calls.Load())
		}
		if !live.Load() {
			t.Fatal("the handler ran under an expired lease: the claim found by its owner token was not extended")
		}
	})

	t.Run("lease claim without retries", func(t *testing.T) {
		e, proxy, st, tbl, _ := replyEnv(t, func(c *Config) { c.OutcomeUnknownRetry = RetryPolicy{Disable: true} })
		var calls atomic.Int32
		proxy.DropReplyOnce(faultproxy.CommitAfter(pgLeaseClaim))
		res, err := st.ProcessLeased(e.ctx, e.msg("m-1", "", "one"), leaseInsert(e, tbl, &calls), leaseOpt)
		if !errors.Is(err, dedup.ErrOutcomeUnknown) || res.HandlerCalled || calls.Load() != 0 || proxy.Dropped() != 1 {
			t.Fatalf("%+v, %v, %d calls; want ErrOutcomeUnknown before the handler", res, err, calls.Load())
		}
		// The claim had committed unseen: its lease stands until its TTL.
		if rec := e.record("m-1"); rec.Status != dedup.StatusProcessing || rec.Attempts != 1 {
			t.Fatalf("record after the lost claim reply = %+v, want PROCESSING attempts 1", rec)
		}
	})

	t.Run("lease completion", func(t *testing.T) {
		e, proxy, st, tbl, _ := replyEnv(t, nil)
		var calls atomic.Int32
		res, err := st.ProcessLeased(e.ctx, e.msg("m-1", "", "one"), func(ctx context.Context, m *dedup.Message) error {
			proxy.DropReplyOnce(faultproxy.ExecOf(pgLeaseDone))
			return leaseInsert(e, tbl, &calls)(ctx, m)
		}, leaseOpt)
		if err != nil || res.Outcome != dedup.OutcomeProcessed || res.Attempts != 1 || proxy.Dropped() != 1 {
			t.Fatalf("%+v, %v (proxy dropped %d); want processed: the retried completion finds its own commit", res, err, proxy.Dropped())
		}
		if rec := e.record("m-1"); rec.Status != dedup.StatusSucceeded || rec.Attempts != 1 || calls.Load() != 1 {
			t.Fatalf("record = %+v, %d calls", rec, calls.Load())
		}
	})

	t.Run("lease failure mark", func(t *testing.T) {
		e, proxy, st, _, _ := replyEnv(t, nil)
		res, err := st.ProcessLeased(e.ctx, e.msg("m-1", "", "one"), func(context.Context, *dedup.Message) error {
			proxy.DropReplyOnce(faultproxy.CommitAfter(pgLeaseFail))
			return errors.New("provider said no")
		}, leaseOpt)
		if err != nil || res.Outcome != dedup.OutcomeDeadLetter || res.Attempts != 1 || proxy.Dropped() != 1 {
			t.Fatalf("%+v, %v (proxy dropped %d); want a dead letter: the retried mark finds its own commit", res, err, proxy.Dropped())
		}
		dls := e.deadLetters()
		if len(dls) != 1 || dls[0].Reason != dedup.ReasonAttemptsExhausted || res.DeadLetterID != dls[0].ID {
			t.Fatalf("dead letters = %+v, result's ID %d; want one (attempts used up), with that ID", dls, res.DeadLetterID)
		}
	})
}

// Lease mode's statements (sql/lease.sql), by their text.
var (
	pgLeaseClaim   = faultproxy.SQLHas("insert into", "owner_token, fence, lease_until")
	pgLeaseDone    = faultproxy.SQLHas("set status = 'SUCCEEDED'", "lease_until = null")
	pgLeaseRelease = faultproxy.SQLHas("set status = 'FAILED_RETRYABLE', attempts = greatest(attempts - 1, 0)")
	pgLeaseFail    = faultproxy.SQLHas("last_error = $5", "lease_until = null")
)

// Lease mode on Postgres, the same fault: the answer to a claim or a mark is
// lost with its connection after Postgres committed it. pgx does not resend;
// the store sends the call again itself with the same owner token and
// fence, and the call recognises its own first run.
func TestLeaseCallAnswersLost(t *testing.T) {
	t.Parallel()
	ok := func(context.Context, *dedup.Message) error { return nil }
	opt := dedup.LeaseOptions{TTL: 5 * time.Second, DisableHeartbeat: true} // no heartbeat statements on the wire

	// S18 on Postgres: MaxAttempts 1, the claim's COMMIT answer lost. The
	// resent claim finds its own lease: the handler runs once, SUCCEEDED,
	// attempts 1, no dead letter, and a later copy is a duplicate.
	t.Run("claim", func(t *testing.T) {
		e := newEnv(t, nil)
		st, p := e.proxiedStore(func(c *Config) { c.MaxAttempts = 1 })
		var calls atomic.Int32
		p.DropReplyOnce(faultproxy.CommitAfter(pgLeaseClaim))
		r, err := st.ProcessLeased(e.ctx, e.msg("cap-88", "", "x"), func(context.Context, *dedup.Message) error {
			calls.Add(1)
			return nil
		}, opt)
		p.WaitDropped(1)
		if err != nil || r.Outcome != dedup.OutcomeProcessed || r.Attempts != 1 || calls.Load() != 1 {
			t.Fatalf("%+v, %v, calls %d; want processed at attempt 1, one call", r, err, calls.Load())
		}
		if rec := e.record("cap-88"); rec.Status != dedup.StatusSucceeded || rec.Attempts != 1 || rec.Fence != 1 {
			t.Fatalf("record = %+v; want SUCCEEDED, attempts 1, fence 1", rec)
		}
		if r, err := st.ProcessLeased(e.ctx, e.msg("cap-88", "", "x"), ok, opt); err != nil || r.Outcome != dedup.OutcomeDuplicate || calls.Load() != 1 {
			t.Fatalf("later copy: %+v, %v; want a duplicate", r, err)
		}
		if dls := e.deadLetters(); len(dls) != 0 {
			t.Fatalf("dead letters = %+v; want none", dls)
		}
	})

	t.Run("complete", func(t *testing.T) {
		e := newEnv(t, nil)
		st, p := e.proxiedStore(nil)
		var calls atomic.Int32
		r, err := st.ProcessLeased(e.ctx, e.msg("m-done", "", "x"), func(context.Context, *dedup.Message) error {
			calls.Add(1)
			p.DropReplyOnce(faultproxy.ExecOf(pgLeaseDone))
			return nil
		}, opt)
		p.WaitDropped(1)
		if err != nil || r.Outcome != dedup.OutcomeProcessed || r.Attempts != 1 || calls.Load() != 1 {
			t.Fatalf("%+v, %v, calls %d; want processed (acked) at attempt 1", r, err, calls.Load())
		}
		if rec := e.record("m-done"); rec.Status != dedup.StatusSucceeded || rec.Attempts != 1 {
			t.Fatalf("record = %+v; want SUCCEEDED, attempts 1", rec)
		}
	})

	t.Run("fail", func(t *testing.T) {
		e := newEnv(t, nil)
		st, p := e.proxiedStore(nil)
		r, err := st.ProcessLeased(e.ctx, e.msg("m-fail", "", "x"), func(context.Context, *dedup.Message) error {
			p.DropReplyOnce(faultproxy.CommitAfter(pgLeaseFail))
			return errors.New("provider timeout")
		}, opt)
		p.WaitDropped(1)
		if err != nil || r.Outcome != dedup.OutcomeRetry || r.Status != dedup.StatusFailedRetryable || r.Attempts != 1 {
			t.Fatalf("%+v, %v; want retry, FAILED_RETRYABLE at attempt 1", r, err)
		}
		if rec := e.record("m-fail"); rec.Status != dedup.StatusFailedRetryable || rec.Attempts != 1 || rec.LastError != "provider timeout" {
			t.Fatalf("record = %+v; want FAILED_RETRYABLE, attempts 1, the error", rec)
		}
	})

	t.Run("fail-final", func(t *testing.T) {
		e := newEnv(t, nil)
		st, p := e.proxiedStore(nil)
		r, err := st.ProcessLeased(e.ctx, e.msg("m-final", "", "x"), func(context.Context, *dedup.Message) error {
			p.DropReplyOnce(faultproxy.CommitAfter(pgLeaseFail))
			return dedup.Permanent(errors.New("card refused"))
		}, opt)
		p.WaitDropped(1)
		if err != nil || r.Outcome != dedup.OutcomeDeadLetter || r.Status != dedup.StatusFailedFinal {
			t.Fatalf("%+v, %v; want a dead letter", r, err)
		}
		dls := e.deadLetters()
		if len(dls) != 1 || dls[0].Reason != dedup.ReasonPermanentError || r.DeadLetterID != dls[0].ID {
			t.Fatalf("dead letters = %+v, result's ID %d; want one, with that ID", dls, r.DeadLetterID)
		}
	})

	t.Run("release", func(t *testing.T) {
		e := newEnv(t, nil)
		logs := &logBuffer{}
		st, p := e.proxiedStore(func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
		ctx, cancel := context.WithCancel(e.ctx)
		_, err := st.ProcessLeased(ctx, e.msg("m-stop", "", "x"), func(hctx context.Context, _ *dedup.Message) error {
			p.DropReplyOnce(faultproxy.ExecOf(pgLeaseRelease))
			cancel()
			<-hctx.Done()
			return hctx.Err()
		}, opt)
		p.WaitDropped(1)
		if err == nil {
			t.Fatal("interrupted handler: nil error, want one (do not ack)")
		}
		if strings.Contains(logs.String(), "release lease") {
			t.Fatalf("the release was answered as failed: %s", logs.String())
		}
		if rec := e.record("m-stop"); rec.Status != dedup.StatusFailedRetryable || rec.Attempts != 0 {
			t.Fatalf("record after the release = %+v; want FAILED_RETRYABLE, attempts 0", rec)
		}
	})
}

// S17 with S18 on Postgres: the claim that finds the last attempt's lease
// expired dead-letters the record, and the answer to its COMMIT is lost. The
// store retries the claim, whose outcome is unknown (lease_unknown.go); the
// retried claim finds the record FAILED_FINAL under its own owner token and
// answers what the lost first run did: the dead letter (acked,
// attempts_exhausted, Err wrapping ErrExecutionLost, the ID of the one dead
// letter written), not a duplicate. The dead owner's late completion is
// fenced.
func TestS17LeaseCapClaimAnswerLost(t *testing.T) {
	e := newEnv(t, nil)
	st, p := e.proxiedStore(func(c *Config) { c.MaxAttempts = 1 })
	const id = "ingest/big-78"
	opt := dedup.LeaseOptions{TTL: time.Second, DisableHeartbeat: true} // no heartbeat statements on the wire
	release := make(chan struct{})
	dead := make(chan dedup.Result, 1)
	started := make(chan struct{})
	go func() {
		r, _ := st.ProcessLeased(e.ctx, e.msg(id, "", "big"), func(context.Context, *dedup.Message) error {
			close(started)
			<-release // the owner "dies" holding the lease; it returns at the end
			return nil
		}, opt)
		dead <- r
	}()
	<-started
	e.waitLeaseExpired(id) // its lease expires, in database time

	p.DropReplyOnce(faultproxy.CommitAfter(faultproxy.SQLHas("set status = 'FAILED_FINAL', attempts = $2")))
	r, err := st.ProcessLeased(e.ctx, e.msg(id, "", "big"), func(context.Context, *dedup.Message) error {
		return errors.New("the copy at the exhausted limit must not run the handler")
	}, opt)
	p.WaitDropped(1)
	dls := e.deadLetters()
	if err != nil || r.Outcome != dedup.OutcomeDeadLetter || !r.Outcome.Acked() || r.HandlerCalled || r.Status != dedup.StatusFailedFinal ||
		r.Attempts != 1 || r.Reason != dedup.ReasonAttemptsExhausted || !errors.Is(r.Err, dedup.ErrExecutionLost) {
		t.Fatalf("resent claim: %+v, %v; want the acked attempts_exhausted dead letter its lost first run wrote", r, err)
	}
	if len(dls) != 1 || dls[0].Reason != dedup.ReasonAttemptsExhausted || r.DeadLetterID != dls[0].ID {
		t.Fatalf("dead letters = %+v, result's ID %d; want one attempts_exhausted, with that ID", dls, r.DeadLetterID)
	}
	close(release)
	if late := <-dead; late.Outcome != dedup.OutcomeFenced {
		t.Fatalf("the dead owner's late completion: %+v; want fenced", late)
	}
	if rec := e.record(id); rec.Status != dedup.StatusFailedFinal || rec.Attempts != 1 {
		t.Fatalf("record = %+v; want FAILED_FINAL, attempts 1", rec)
	}
}
