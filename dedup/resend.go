package dedup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Lease-mode calls whose answer was lost are sent again.
//
// pgx never resends a statement on its own. When the connection fails after
// a lease-mode claim or mark was sent, the statement may or may not have
// run, and lease mode cannot leave that open the way atomic mode does: a
// committed claim holds a lease, so the runtime's next attempt (a new claim
// with a new owner token) would find a live lease, wait out the TTL, take
// over and count a second attempt; with MaxAttempts reached it would
// dead-letter a message whose handler never ran, or whose handler succeeded.
// So the store sends these calls again itself, with the same owner token
// and fence, and each one recognises its own earlier run:
//
//   - a mark (completion, failure, release) is a compare-and-set on the
//     owner token and fence; the token and fence stay on the row after the
//     lease ends, so a second run that finds the row already in the status
//     it writes, under its own token and fence, answers done (and, for a
//     final failure, the dead letter the first run wrote), not fenced;
//   - a claim whose answer was lost is looked up by its owner token before
//     claiming again: a committed claim is this caller's lease and runs; a
//     committed claim that dead-lettered the record instead (the last
//     attempt's lease had expired: ErrExecutionLost) left its token on the
//     FAILED_FINAL record and answers that dead letter again.
//
// The heartbeat needs nothing: a renewal extends the lease again, and the
// next heartbeat is its resend.
const (
	// leaseResends is how many times a lease-mode claim or mark is sent again
	// after its answer was lost.
	leaseResends = 3
	// leaseResendWait is the pause before the first resend; each later pause
	// is four times the one before (25ms, 100ms, 400ms).
	leaseResendWait = 25 * time.Millisecond
)

// answerLost reports whether err says that a statement's answer never came
// back because the connection failed, so that the statement may or may not
// have run: pgx did not send it (pgconn.SafeToRetry), the connection broke
// (an I/O error, EOF), or the server ended the session (SQLSTATE class 08,
// 57P01 admin shutdown, 57P02 crash shutdown, 57P03 cannot connect now).
// Any other answer from the server, and the end of ctx, are not.
func answerLost(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P01", "57P02", "57P03":
			return true
		}
		return strings.HasPrefix(pgErr.Code, "08")
	}
	var netErr net.Error
	return pgconn.SafeToRetry(err) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &netErr)
}

// resend runs call, and runs it again, at most leaseResends more times after
// growing pauses, while its error says the answer was lost. call must be
// safe to run twice. It returns call's last error, or ctx's when ctx ends
// during a pause.
func resend(ctx context.Context, call func() error) error {
	err := call()
	wait := leaseResendWait
	for range leaseResends {
		if !answerLost(err) {
			return err
		}
		if !pause(ctx, wait) {
			return errors.Join(err, ctx.Err())
		}
		wait *= 4
		err = call()
	}
	return err
}

// pause waits d or until ctx ends; it reports whether d elapsed.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// claimLeaseResent is claimLease, sent again while its answer is lost. Before
// claiming again it looks for the claims whose answers were lost: one that
// committed holds this caller's lease, which it returns. A new claim that
// finds a live lease looks once more, since the lost claim may have
// committed only while the new one waited for its row.
func (s *Store) claimLeaseResent(ctx context.Context, msg *Message, sum []byte, keyID string, ttl time.Duration) (Lease, int64, Result, error) {
	lease, rowID, res, err := s.claimLease(ctx, msg, sum, keyID, ttl)
	var lost []uuid.UUID
	wait := leaseResendWait
	for range leaseResends {
		if !answerLost(err) {
			return lease, rowID, res, err
		}
		if len(lost) == 0 || lost[len(lost)-1] != lease.OwnerToken {
			lost = append(lost, lease.OwnerToken)
		}
		if !pause(ctx, wait) {
			return lease, 0, Result{}, errors.Join(err, ctx.Err())
		}
		wait *= 4
		own, ownRow, ferr := s.ownClaim(ctx, msg.Identity, lost)
		if ferr != nil {
			err = ferr // still no answer (or a new error): the loop decides
			continue
		}
		if ownRow != 0 {
			return own, ownRow, Result{}, nil
		}
		lease, rowID, res, err = s.claimLease(ctx, msg, sum, keyID, ttl)
		if err == nil && rowID == 0 && res.Outcome == OutcomeDuplicate && res.Status == StatusFailedFinal {
			// The lost claim may have dead-lettered the record at the
			// last attempt's expired lease (crashloop.go).
			if dl, ok, ferr := s.ownExhaust(ctx, msg, sum, lost, res); ferr == nil && ok {
				return lease, 0, dl, nil
			}
		}
		if err == nil && rowID == 0 && errors.Is(res.Err, ErrLeaseHeld) {
			if own, ownRow, ferr := s.ownClaim(ctx, msg.Identity, lost); ferr == nil && ownRow != 0 {
				return own, ownRow, Result{}, nil
			}
		}
	}
	return lease, rowID, res, err
}

// ownClaim returns the lease and row id of msg's record when it is
// PROCESSING under one of tokens (a claim of this caller that committed
// although its answer was lost), else row id 0.
func (s *Store) ownClaim(ctx context.Context, id Identity, tokens []uuid.UUID) (Lease, int64, error) {
	l := Lease{Identity: id, Record: Identity{Scope: id.Scope}}
	var rowID int64
	err := s.pool.QueryRow(ctx, `select id, message_id, business_key, owner_token, attempts, fence from `+s.q.records+`
where id = (`+s.q.matchSQL()+`) and owner_token = any($4::uuid[]) and status = 'PROCESSING'`,
		id.Scope, id.MessageID, id.BusinessKey, tokenStrings(tokens)).
		Scan(&rowID, &l.Record.MessageID, &l.Record.BusinessKey, &l.OwnerToken, &l.Attempt, &l.Fence)
	if errors.Is(err, pgx.ErrNoRows) {
		return Lease{}, 0, nil
	}
	if err != nil {
		return Lease{}, 0, fmt.Errorf("idemq: lease claim %s: look for a claim whose answer was lost: %w", id, err)
	}
	return l, rowID, nil
}

// liveDeadLetterID returns the ID of msg's live (not re-driven) dead letter
// for reason and payload fingerprint sum, 0 when there is none: what a final
// failure mark sent again answers, as its first run wrote it.
func (q *queries) liveDeadLetterID(ctx context.Context, tx pgx.Tx, msg *Message, sum []byte, reason string) (int64, error) {
	var id int64
	err := tx.QueryRow(ctx, `select id from `+q.deadLetters+`
where scope = $1 and message_id = $2 and reason = $3 and coalesce(fingerprint, ''::bytea) = coalesce($4::bytea, ''::bytea)
  and redriven_at is null`, msg.Identity.Scope, msg.Identity.MessageID, reason, sum).Scan(&id)
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
