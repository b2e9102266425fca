package pgstore

import (
	"github.com/idemq/idemq/dedup"
	leaseengine "github.com/idemq/idemq/internal/lease"

	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/jackc/pgx/v5"
)

// ProcessLeased runs h for msg in lease mode (see the Lease type). Results
// and errors mean what they mean for Process, plus OutcomeFenced.
//
// A copy that finds an expired lease takes over and counts an attempt, unless
// the dead owner held the last one (attempts = Config.MaxAttempts): the
// record then becomes FAILED_FINAL with a dead letter (ReasonAttemptsExhausted,
// Result.Err wrapping ErrExecutionLost), the handler does not run and the
// delivery is acked, so a message that kills every owner starts at most
// MaxAttempts executions. The Redis-only store applies the same rule. Such a
// claim, sent again because its answer was lost, answers the same dead
// letter (the record keeps the claim's owner token).
func (s *Store) ProcessLeased(ctx context.Context, msg *dedup.Message, h dedup.LeaseHandler, opt dedup.LeaseOptions) (dedup.Result, error) {
	if msg == nil || h == nil {
		return dedup.Result{}, errors.New("idemq: ProcessLeased: nil message or handler")
	}
	opt = opt.WithDefaults()
	if err := opt.ValidateUnder(0); err != nil {
		return dedup.Result{}, err
	}
	sum, keyID, err := s.fp.Sum(msg.Payload)
	if err != nil {
		return s.Reject(ctx, msg, dedup.ReasonBadInput, err)
	}
	if res, hit := s.fastLookup(ctx, msg); hit {
		return res, nil
	}
	lease, rowID, res, err := s.claimLeaseRetrying(ctx, leaseClaim{msg: msg, sum: sum, keyID: keyID, ttl: opt.TTL})
	if err != nil || rowID == 0 {
		return res, err
	}
	marks := &pgLease{s: s, rowID: rowID, lease: lease, msg: msg, sum: sum, ttl: opt.TTL}
	res, err = leaseengine.Run(ctx, leaseengine.Params{
		Message: msg, Lease: lease, Handler: h, Options: opt,
		MaxAttempts: s.cfg.MaxAttempts, Marks: marks, Logger: s.cfg.Logger,
	})
	if err == nil && res.Outcome == dedup.OutcomeProcessed {
		s.fastRemember(ctx, msg.Identity, sum, keyID)
	}
	return res, err
}

// leaseClaim is one lease-mode claim: the message, its payload's
// fingerprint, and the lease's TTL.
type leaseClaim struct {
	msg   *dedup.Message
	sum   []byte // payload fingerprint
	keyID string // the fingerprint's key ID
	ttl   time.Duration
}

// claimLease commits a PROCESSING record owned by a fresh token, or decides
// the delivery without running the handler (rowID 0).
func (s *Store) claimLease(ctx context.Context, c leaseClaim) (dedup.Lease, int64, dedup.Result, error) {
	ctx, cancel := s.bound(ctx) // no handler runs here
	defer cancel()
	msg, sum, ttl := c.msg, c.sum, c.ttl
	lease := dedup.Lease{Identity: msg.Identity, Record: msg.Identity, OwnerToken: uuid.New(), Fence: 1, Attempt: 1}
	// BEGIN travels with the claim (lazyTx): a new claim costs 2 round
	// trips, the claim and the COMMIT.
	tx, err := beginLazy(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return lease, 0, dedup.Result{}, fmt.Errorf("idemq: begin lease claim: %w", err)
	}
	defer s.rollback(ctx, tx)
	id := msg.Identity
	var rowID *int64
	var found foundRecord
	err = batchRow(ctx, tx, s.q.leaseClaimSQL, id.Scope, id.MessageID, id.BusinessKey, sum, c.keyID,
		clip(msg.Source, 1024), msg.ReconsumeTimes, lease.OwnerToken, ttl.Seconds()).
		Scan(&rowID, &found.id, &found.messageID, &found.businessKey, &found.fingerprint, &found.keyID, &found.status, &found.attempts, &found.live)
	if err != nil {
		return lease, 0, dedup.Result{}, fmt.Errorf("idemq: lease claim %s: %w", id, err)
	}
	if rowID == nil {
		// A terminal record (SUCCEEDED, FAILED_FINAL) is answered from the
		// claim's read, unlocked: a duplicate writes nothing. Any other is
		// locked, and read again under the lock.
		rec, live := found.record(), false
		if rec == nil || !terminal(rec.status) {
			if rec, live, err = s.q.lockLease(ctx, tx, id); err != nil {
				return lease, 0, dedup.Result{}, err
			}
		}
		if rec == nil {
			return lease, 0, dedup.Result{}, fmt.Errorf("idemq: lease claim %s: record vanished", id)
		}
		res, run, err := s.decide(ctx, tx, msg, sum, rec)
		if err != nil {
			return lease, 0, dedup.Result{}, err
		}
		if rec.status == dedup.StatusProcessing && res.Outcome != dedup.OutcomeConflict {
			if live {
				res.Outcome, res.Err = dedup.OutcomeRetry, dedup.ErrLeaseHeld
				return lease, 0, res, nil
			}
			if rec.attempts >= s.cfg.MaxAttempts {
				// The owner of the last allowed attempt died (or stalled)
				// without an outcome: final, so a message that kills its
				// consumer cannot loop (the Redis-only store's rule). A
				// FAILED_RETRYABLE record at the limit was re-driven: it runs.
				res, err := s.exhaustLostExecution(ctx, tx, lostExecution{msg: msg, sum: sum, rec: rec, by: res.MatchedBy,
					attempts: rec.attempts, cause: leaseLost(rec.attempts), owner: &lease.OwnerToken})
				if err != nil {
					return lease, 0, dedup.Result{}, err
				}
				return lease, 0, res, commit(ctx, tx)
			}
			run = true // expired lease: take over
		}
		if !run {
			return lease, 0, res, commit(ctx, tx)
		}
		rowID = &rec.id
		lease.Record = dedup.Identity{Scope: id.Scope, MessageID: rec.messageID, BusinessKey: rec.businessKey}
		if err := tx.QueryRow(ctx, s.q.leaseTakeSQL, *rowID, lease.OwnerToken, ttl.Seconds(), clip(msg.Source, 1024), msg.ReconsumeTimes).
			Scan(&lease.Attempt, &lease.Fence); err != nil {
			return lease, 0, dedup.Result{}, fmt.Errorf("idemq: lease takeover %s: %w", id, err)
		}
	}
	return lease, *rowID, dedup.Result{}, commit(ctx, tx)
}

// pgLease is the lease engine's Marks on the Postgres record rowID.
type pgLease struct {
	s     *Store
	rowID int64
	lease dedup.Lease
	msg   *dedup.Message
	sum   []byte
	ttl   time.Duration
}

func (p *pgLease) Renew(ctx context.Context) (bool, error) {
	ctx, cancel := p.s.bound(ctx)
	defer cancel()
	tag, err := p.s.pool.Exec(ctx, p.s.q.leaseBeatSQL, p.rowID, p.lease.OwnerToken, p.lease.Fence, p.ttl.Seconds())
	return err == nil && tag.RowsAffected() > 0, err
}

func (p *pgLease) Succeed(ctx context.Context) (fenced bool, err error) {
	ctx, cancel := p.s.bound(ctx) // detached by the caller (internal/lease) when it must land
	defer cancel()
	fenced, err = markRetry(ctx, p.s, "lease complete "+p.lease.Identity.String(), func() (bool, error) {
		var marked, before bool
		err := p.s.pool.QueryRow(ctx, p.s.q.leaseDoneSQL, p.rowID, p.lease.OwnerToken, p.lease.Fence, *p.s.expiry(dedup.StatusSucceeded)).
			Scan(&marked, &before)
		return !marked && !before, err
	})
	return fenced, wrapUnknown(err)
}

// Release returns ErrFenced when the record is not this owner's any more.
func (p *pgLease) Release(ctx context.Context) error {
	ctx, cancel := p.s.bound(ctx) // detached by the caller (internal/lease) when it must land
	defer cancel()
	fenced, err := markRetry(ctx, p.s, "lease release "+p.lease.Identity.String(), func() (bool, error) {
		var marked, before bool
		err := p.s.pool.QueryRow(ctx, p.s.q.leaseReleaseSQL, p.rowID, p.lease.OwnerToken, p.lease.Fence).Scan(&marked, &before)
		return !marked && !before, err
	})
	if err == nil && fenced {
		return dedup.ErrFenced
	}
	return wrapUnknown(err)
}

// Fail writes the mark and, for a final failure, the dead letter in one
// transaction.
func (p *pgLease) Fail(ctx context.Context, status dedup.Status, reason string, herr error) (deadLetterID int64, fenced bool, err error) {
	ctx, cancel := p.s.bound(ctx) // detached by the caller (internal/lease) when it must land
	defer cancel()
	type marked struct {
		dlID   int64
		fenced bool
	}
	m, err := markRetry(ctx, p.s, "lease mark "+string(status)+" "+p.lease.Identity.String(), func() (marked, error) {
		var m marked
		// BEGIN travels with the mark (lazyTx).
		tx, err := beginLazy(ctx, p.s.pool, pgx.TxOptions{})
		if err != nil {
			return marked{}, err
		}
		defer p.s.rollback(ctx, tx)
		if m.dlID, m.fenced, err = p.fail(ctx, tx, status, reason, herr); err != nil {
			return marked{}, err
		}
		if err := tx.Commit(ctx); err != nil {
			return marked{}, err
		}
		return m, nil
	})
	return m.dlID, m.fenced, wrapUnknown(err)
}

// fail is one run of Fail's mark in tx. A run that finds the mark already
// made by an earlier run of its own (its answer lost) answers with the dead
// letter that run wrote.
func (p *pgLease) fail(ctx context.Context, tx pgx.Tx, status dedup.Status, reason string, herr error) (dlID int64, fenced bool, err error) {
	s := p.s
	var marked, before bool
	if err := batchRow(ctx, tx, s.q.leaseFailSQL, p.rowID, p.lease.OwnerToken, p.lease.Fence, string(status),
		clip(herr.Error(), s.cfg.MaxErrorBytes), dedup.ErrorClass(herr), s.expiry(status)).Scan(&marked, &before); err != nil {
		return 0, false, err
	}
	switch {
	case !marked && !before:
		return 0, true, nil
	case status != dedup.StatusFailedFinal: // no dead letter
		return 0, false, nil
	case marked:
		dlID, err = s.q.insertDeadLetter(ctx, tx, deadLetterRow{msg: p.msg, sum: p.sum, reason: reason, cause: herr, attempts: p.lease.Attempt})
	default: // an earlier run of this mark committed: the dead letter it wrote
		dlID, err = s.q.liveDeadLetterID(ctx, tx, p.msg, p.sum, reason)
	}
	return dlID, false, err
}
