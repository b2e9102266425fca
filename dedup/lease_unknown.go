package dedup

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Lease mode on Postgres commits three times per execution: the claim, then
// the completion or failure mark. Each may meet a serialization failure or
// deadlock (retried at once, Config.TransientRetry) or lose its connection
// at COMMIT, leaving its outcome unknown. A mark is then retried in place
// (Config.OutcomeUnknownRetry): it is conditional on the lease's owner token
// and fence, and a retry that finds the record already in the wanted state
// at this lease's fence knows an earlier try committed (every takeover bumps
// the fence, so no other owner can have written it). A claim whose outcome
// is unknown is given back without counting its attempt, so that no copy
// waits for a lease no one runs, nor counts an attempt whose handler never
// started.

// markRetry runs op, retrying it while it fails with an unknown outcome
// (OutcomeUnknownRetry) or a transient error (TransientRetry).
func markRetry[T any](ctx context.Context, s *Store, what string, op func() (T, error)) (T, error) {
	return retryWhile(ctx, s.cfg.OutcomeUnknownRetry, s.cfg.Logger, what, IsOutcomeUnknown, func() (T, error) {
		return retryWhile(ctx, s.cfg.TransientRetry, s.cfg.Logger, what, IsTransient, op)
	})
}

// markedAtFence reports whether the record is in status at this lease's
// fence: a mark of this lease that found no PROCESSING row under its token
// was then already made by an earlier try of its own.
func (p *pgLease) markedAtFence(ctx context.Context, status Status) (bool, error) {
	var mine bool
	err := p.s.pool.QueryRow(ctx, `select status = $2 and fence = $3 from `+p.s.q.records+` where id = $1`,
		p.rowID, string(status), p.lease.Fence).Scan(&mine)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return mine, err
}

// claimLeaseRetrying is claimLease, retried at once while it is transient.
// When its outcome is unknown (the connection was lost at or before its
// COMMIT), the claim is given back if it committed (releaseClaim) and the
// error wraps ErrOutcomeUnknown.
func (s *Store) claimLeaseRetrying(ctx context.Context, msg *Message, sum []byte, keyID string, ttl time.Duration) (Lease, int64, Result, error) {
	type claimed struct {
		lease Lease
		rowID int64
		res   Result
	}
	c, err := retryWhile(ctx, s.cfg.TransientRetry, s.cfg.Logger, "lease claim "+msg.Identity.String(), IsTransient, func() (claimed, error) {
		lease, rowID, res, err := s.claimLease(ctx, msg, sum, keyID, ttl)
		return claimed{lease: lease, rowID: rowID, res: res}, err
	})
	if err != nil && IsOutcomeUnknown(err) {
		if c.lease.OwnerToken != uuid.Nil {
			s.releaseClaim(ctx, msg.Identity, c.lease.OwnerToken)
		}
		return c.lease, 0, Result{}, wrapUnknown(err)
	}
	return c.lease, c.rowID, c.res, err
}

// releaseClaim gives back the lease owned by token on the record of id, if
// the claim committed: FAILED_RETRYABLE, attempt not counted (as after a
// shutdown). It is conditional on the token, so it is safe to run when the
// claim did not commit, and more than once. It is tried once (plus transient
// retries): when the database cannot be reached, the lease expires after its
// TTL and a copy takes it over, as after a crash.
func (s *Store) releaseClaim(ctx context.Context, id Identity, token uuid.UUID) {
	ctx = context.WithoutCancel(ctx)
	sql := `update ` + s.q.records + `
set status = 'FAILED_RETRYABLE', attempts = greatest(attempts - 1, 0), owner_token = null, lease_until = null,
    updated_at = now()
where id = (` + s.q.matchSQL() + `) and owner_token = $4 and status = 'PROCESSING'`
	_, err := retryWhile(ctx, s.cfg.TransientRetry, s.cfg.Logger, "lease claim release "+id.String(), IsTransient, func() (struct{}, error) {
		_, err := s.pool.Exec(ctx, sql, id.Scope, id.MessageID, id.BusinessKey, token)
		return struct{}{}, err
	})
	if err != nil {
		s.cfg.Logger.Warn("idemq: giving back a lease claim whose outcome is unknown failed; a copy takes over when it expires",
			"identity", id.String(), "err", err)
	}
}
