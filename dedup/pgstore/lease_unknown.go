package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// Lease mode on Postgres commits three times per execution: the claim, then
// the completion, failure or release mark. pgx never resends a statement on
// its own, and lease mode cannot leave a lost answer open the way atomic
// mode does: a committed claim holds a lease, so the runtime's next attempt
// (a new claim with a new owner token) would find a live lease, wait out
// the TTL, take over and count a second attempt; with MaxAttempts reached
// it would dead-letter a message whose handler never ran, or whose handler
// succeeded. So the store retries these calls in place itself:
//
//   - a serialization failure or deadlock (FailureTransient) at once, under
//     Config.TransientRetry;
//   - a call whose outcome is unknown (FailureOutcomeUnknown: the connection
//     was lost or terminated before its answer came, see Classify) under
//     Config.OutcomeUnknownRetry, with the same owner token and fence.
//
// Each call recognises its own earlier run, so running it twice is safe:
//
//   - a mark (completion, failure, release) is a compare-and-set on the
//     owner token and fence; the token and fence stay on the row after the
//     lease ends, and the statement also reports whether an earlier run of
//     the same mark had made it (sql/lease.sql). A retry that finds the
//     row already in the status it writes, under its own token and fence,
//     answers done, not fenced, and a final failure answers with the dead
//     letter its first run wrote;
//   - before claiming again, a claim looks for the claims of its own whose
//     answers were lost, by owner token (ownClaim): one that committed is
//     this caller's lease, and the handler runs under it at the attempt it
//     counted. One that committed a dead letter instead (it found the last
//     attempt's lease expired: ErrExecutionLost) left its token on the
//     FAILED_FINAL record, and the claim answers that dead letter again
//     (ownExhaust).
//
// When the retries are used up the error wraps ErrOutcomeUnknown: the
// delivery is not acked, and a claim that committed unseen expires after its
// TTL. The heartbeat needs nothing: a renewal extends the lease again, and
// the next heartbeat is its retry.

// markRetry runs op, retrying it while it fails with an unknown outcome
// (OutcomeUnknownRetry) or a transient error (TransientRetry).
func markRetry[T any](ctx context.Context, s *Store, what string, op func() (T, error)) (T, error) {
	return retryWhile(ctx, s.cfg.OutcomeUnknownRetry, s.cfg.Logger, what, dedup.IsOutcomeUnknown, func() (T, error) {
		return retryWhile(ctx, s.cfg.TransientRetry, s.cfg.Logger, what, dedup.IsTransient, op)
	})
}

// claimLeaseRetrying is claimLease retried in place: at once while it is
// transient, and under OutcomeUnknownRetry while its outcome is unknown.
// Before claiming again it looks for its claims whose answers were lost: one
// that committed holds this caller's lease, which it returns. A new claim
// that finds a live lease looks once more, since a lost claim may have
// committed only while the new one waited for its row. When the retries are
// used up the error wraps ErrOutcomeUnknown.
func (s *Store) claimLeaseRetrying(ctx context.Context, lc leaseClaim) (dedup.Lease, int64, dedup.Result, error) {
	msg, sum, ttl := lc.msg, lc.sum, lc.ttl
	type claimed struct {
		lease dedup.Lease
		rowID int64
		res   dedup.Result
	}
	what := "lease claim " + msg.Identity.String()
	var lost []uuid.UUID // owner tokens of the claims whose outcome is unknown
	c, err := retryWhile(ctx, s.cfg.OutcomeUnknownRetry, s.cfg.Logger, what, dedup.IsOutcomeUnknown, func() (claimed, error) {
		if len(lost) > 0 {
			own, ownRow, err := s.ownClaim(ctx, msg.Identity, lost, ttl)
			if err != nil || ownRow != 0 {
				return claimed{lease: own, rowID: ownRow}, err
			}
		}
		c, err := retryWhile(ctx, s.cfg.TransientRetry, s.cfg.Logger, what, dedup.IsTransient, func() (claimed, error) {
			lease, rowID, res, err := s.claimLease(ctx, lc)
			return claimed{lease: lease, rowID: rowID, res: res}, err
		})
		switch {
		case dedup.IsOutcomeUnknown(err):
			lost = append(lost, c.lease.OwnerToken)
		case err == nil && c.rowID == 0 && len(lost) > 0 && c.res.Outcome == dedup.OutcomeDuplicate && c.res.Status == dedup.StatusFailedFinal:
			// A lost claim may have dead-lettered the record at the last
			// attempt's expired lease (crashloop.go).
			if dl, ok, ferr := s.ownExhaust(ctx, msg, sum, lost, c.res); ferr == nil && ok {
				return claimed{lease: c.lease, res: dl}, nil
			}
		case err == nil && c.rowID == 0 && len(lost) > 0 && errors.Is(c.res.Err, dedup.ErrLeaseHeld):
			if own, ownRow, ferr := s.ownClaim(ctx, msg.Identity, lost, ttl); ferr == nil && ownRow != 0 {
				return claimed{lease: own, rowID: ownRow}, nil
			}
		}
		return c, err
	})
	if err != nil && dedup.IsOutcomeUnknown(err) {
		return c.lease, 0, dedup.Result{}, wrapUnknown(err)
	}
	return c.lease, c.rowID, c.res, err
}

// ownClaim returns the lease and row id of id's record when it is
// PROCESSING under one of tokens (a claim of this caller that committed
// although its answer was lost), else row id 0. It extends the lease it
// finds to ttl from now, as the claim would have, under the row's lock: the
// retries may have used a good part of the TTL, and the handler starts now.
// A lease another copy took over in the meantime has another token and is
// not found.
func (s *Store) ownClaim(ctx context.Context, id dedup.Identity, tokens []uuid.UUID, ttl time.Duration) (dedup.Lease, int64, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	l := dedup.Lease{Identity: id, Record: dedup.Identity{Scope: id.Scope}}
	var rowID int64
	err := s.pool.QueryRow(ctx, s.q.leaseOwnClaimSQL, id.Scope, id.MessageID, id.BusinessKey, tokenStrings(tokens), ttl.Seconds()).
		Scan(&rowID, &l.Record.MessageID, &l.Record.BusinessKey, &l.OwnerToken, &l.Attempt, &l.Fence)
	if errors.Is(err, pgx.ErrNoRows) {
		return dedup.Lease{}, 0, nil
	}
	if err != nil {
		return dedup.Lease{}, 0, fmt.Errorf("idemq: lease claim %s: look for a claim whose answer was lost: %w", id, err)
	}
	return l, rowID, nil
}

// liveDeadLetterID returns the ID of msg's live (not re-driven) dead letter
// for reason and payload fingerprint sum, 0 when there is none: what a final
// failure mark run again answers, as its first run wrote it.
func (q *queries) liveDeadLetterID(ctx context.Context, tx pgx.Tx, msg *dedup.Message, sum []byte, reason string) (int64, error) {
	var id int64
	err := tx.QueryRow(ctx, q.deadLetterLiveIDSQL, msg.Identity.Scope, msg.Identity.MessageID, reason, sum).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("idemq: dead letter %s: %w", msg.Identity, err)
	}
	return id, nil
}

// tokenStrings is tokens as text, which every query mode of pgx encodes as a
// uuid[] parameter.
func tokenStrings(tokens []uuid.UUID) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		out[i] = t.String()
	}
	return out
}
