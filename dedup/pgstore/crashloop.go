package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

const (
	// classExecutionLost is the error class of the record and dead letter
	// of an ErrExecutionLost: the Redis-only store's class for the same case.
	classExecutionLost = "attempts_exhausted"
	// classProcessDied is the error class of a record whose marked run did
	// not survive its process (attempts left).
	classProcessDied = "process_died"
	// laneWatermarksSuffix names the lane watermark table after the records
	// table: "<RecordsTable>_lane_watermarks" (at most 56 bytes).
	laneWatermarksSuffix = "_lane_watermarks"
)

// LaneWatermarksTable returns the quoted, schema-qualified name of the lane
// watermark table: "<Schema>"."<RecordsTable>_lane_watermarks".
func (s *Store) LaneWatermarksTable() string { return s.q.lanes }

// AdvanceLaneWatermark raises the watermark of (scope, lane) to at least to,
// in one autocommitted upsert, and returns the watermark the lane had before
// (-1 when it had none). A lane is what consumer.Delivery.Lane names (a
// Kafka partition, a RocketMQ queue); the watermark is an offset of it. The
// watermark never goes down.
//
// The consumer runtime calls it before a lane runs a handler at an offset
// the watermark does not cover yet, asking for that offset plus
// consumer.Config.CrashLoop.Window: so one call covers the next Window
// offsets, and after a crash every offset whose handler may have started is
// at or below the lane's watermark.
func (s *Store) AdvanceLaneWatermark(ctx context.Context, scope, lane string, to int64) (int64, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var prev int64
	if err := s.pool.QueryRow(ctx, s.q.laneWatermarkAdvanceSQL, scope, lane, to).Scan(&prev); err != nil {
		return 0, fmt.Errorf("idemq: lane watermark %s %s: %w", scope, lane, err)
	}
	return prev, nil
}

// CheckReplay answers, with one read (no lock, no write), whether a delivery
// that may be a crash replay is already decided: when its identity has a
// SUCCEEDED or FAILED_FINAL record with the same payload fingerprint, it
// returns that delivery's OutcomeDuplicate result and done true, exactly as
// Process would, without a transaction. Otherwise (no record, a record not
// final, or a different fingerprint) done is false and the delivery goes
// through Process, which decides conflicts. Errors are database errors.
func (s *Store) CheckReplay(ctx context.Context, msg *dedup.Message) (dedup.Result, bool, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if msg == nil || msg.Identity.Scope == "" || msg.Identity.MessageID == "" {
		return dedup.Result{}, false, errors.New("idemq: CheckReplay: message identity not set (use NewIdentity)")
	}
	id := msg.Identity
	var rec record
	var status string
	err := s.pool.QueryRow(ctx, s.q.replayPeekSQL, id.Scope, id.MessageID, id.BusinessKey).
		Scan(&rec.messageID, &rec.fingerprint, &rec.keyID, &status, &rec.attempts)
	if errors.Is(err, pgx.ErrNoRows) {
		return dedup.Result{}, false, nil
	}
	if err != nil {
		return dedup.Result{}, false, fmt.Errorf("idemq: check replay %s: %w", id, err)
	}
	rec.status = dedup.Status(status)
	if rec.status != dedup.StatusSucceeded && rec.status != dedup.StatusFailedFinal {
		return dedup.Result{}, false, nil
	}
	if same, ferr := s.fp.Matches(msg.Payload, rec.fingerprint, rec.keyID); ferr != nil || !same {
		return dedup.Result{}, false, nil
	}
	return dedup.Result{Outcome: dedup.OutcomeDuplicate, MatchedBy: rec.matchedBy(id), Status: rec.status, Attempts: rec.attempts}, true, nil
}

// MarkStart writes a start marker for a handler run that may replay a crash
// (atomic and batched modes), in one short transaction of its own, before
// the run's own transaction. It locks the record the delivery's identity
// matches (creating a FAILED_RETRYABLE record with 0 attempts when there is
// none) and:
//
//   - when the record's previous marked run never reached an outcome (its
//     start_mark equals its attempts: the process died while the handler
//     ran), counts that run as an attempt, with last_error class
//     "process_died";
//   - when such a death was just counted and the attempts, plus one for the
//     unmarked first run that may have died the same way before the first
//     marker, reach Config.MaxAttempts, makes the record FAILED_FINAL with a
//     dead letter (reason ReasonAttemptsExhausted, class
//     "attempts_exhausted", Result.Err wrapping ErrExecutionLost) and
//     returns Run false: the handler must not run, the delivery is acked;
//   - otherwise sets start_mark to the attempts and returns Run true.
//
// A record that is not FAILED_RETRYABLE (final, a live lease), or whose
// fingerprint differs, or a payload that cannot be fingerprinted, is left
// alone: Run is true and Process decides as usual. The first, unmarked run of
// a message is never the sole reason for a dead letter, so a delivery that
// never ran cannot be dead-lettered by a marker.
func (s *Store) MarkStart(ctx context.Context, msg *dedup.Message) (dedup.StartMark, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if msg == nil || msg.Identity.Scope == "" || msg.Identity.MessageID == "" {
		return dedup.StartMark{}, errors.New("idemq: MarkStart: message identity not set (use NewIdentity)")
	}
	sum, keyID, err := s.fp.Sum(msg.Payload)
	if err != nil {
		return dedup.StartMark{Run: true}, nil // bad input: Process rejects it
	}
	for try := 0; try < 3; try++ {
		m, again, err := s.markStart(ctx, msg, sum, keyID)
		if err != nil || !again {
			return m, err
		}
		// The conflicting record vanished between the two statements
		// (purged): mark again.
	}
	return dedup.StartMark{}, fmt.Errorf("idemq: start marker %s: record keeps vanishing", msg.Identity)
}

func (s *Store) markStart(ctx context.Context, msg *dedup.Message, sum []byte, keyID string) (m dedup.StartMark, again bool, err error) {
	id := msg.Identity
	// BEGIN travels with the marker's first batch, and the marker's update
	// with the COMMIT (lazyTx): 2 round trips.
	tx, err := beginLazy(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return dedup.StartMark{}, false, fmt.Errorf("idemq: begin start marker: %w", err)
	}
	defer s.rollback(ctx, tx)
	b := &pgx.Batch{}
	b.Queue(s.q.startMarkInsertSQL, id.Scope, id.MessageID, id.BusinessKey, sum, keyID, clip(msg.Source, 1024), msg.ReconsumeTimes)
	b.Queue(s.q.startMarkLockSQL, id.Scope, id.MessageID, id.BusinessKey)
	br := tx.SendBatch(ctx, b)
	var rowID int64
	if err = br.QueryRow().Scan(&rowID); errors.Is(err, pgx.ErrNoRows) {
		err = nil
	}
	var rec record
	var status string
	var startMark *int
	found := false
	if err == nil {
		err = br.QueryRow().Scan(&rec.id, &rec.messageID, &rec.businessKey, &rec.fingerprint, &rec.keyID, &status, &rec.attempts, &startMark)
		found = err == nil
		if errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return dedup.StartMark{}, false, fmt.Errorf("idemq: start marker %s: %w", id, err)
	}
	if rowID != 0 {
		return dedup.StartMark{Run: true, Token: startRef{rowID: rowID}}, false, commit(ctx, tx)
	}
	if !found {
		return dedup.StartMark{}, true, nil
	}
	rec.status = dedup.Status(status)
	if rec.status != dedup.StatusFailedRetryable {
		return dedup.StartMark{Run: true}, false, nil
	}
	if same, ferr := s.fp.Matches(msg.Payload, rec.fingerprint, rec.keyID); ferr != nil || !same {
		return dedup.StartMark{Run: true}, false, nil // a conflict: Process dead-letters it
	}
	attempts := rec.attempts
	died := startMark != nil && *startMark == attempts
	var errText, errClass *string
	if died {
		attempts++
		// Plus one for the run before the first marker (unmarked, as every
		// first delivery is), which may have died the same way.
		if n := attempts + 1; n >= s.cfg.MaxAttempts {
			cause := fmt.Errorf("%w: attempts exhausted after %d handler starts: the process died while the handler ran (found by a start marker after a restart)", dedup.ErrExecutionLost, n)
			res, err := s.exhaustLostExecution(ctx, tx, lostExecution{msg: msg, sum: sum, rec: &rec, by: rec.matchedBy(id), attempts: n, cause: cause})
			if err != nil {
				return dedup.StartMark{}, false, err
			}
			return dedup.StartMark{Result: res}, false, commit(ctx, tx)
		}
		t := clip(fmt.Sprintf("idemq: the process died while the handler ran (attempt %d, found by a start marker after a restart)", attempts), s.cfg.MaxErrorBytes)
		c := classProcessDied
		errText, errClass = &t, &c
		s.cfg.Logger.WarnContext(ctx, "idemq: a handler run died with its process; counted as an attempt", "identity", id.String(),
			"attempts", attempts, "max_attempts", s.cfg.MaxAttempts, "source", msg.Source)
	}
	set := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 2)}
	set.Queue(s.q.startMarkSetSQL, rec.id, attempts, errText, errClass)
	if _, err := tx.commitWith(ctx, set, nil); err != nil {
		return dedup.StartMark{}, false, fmt.Errorf("idemq: start marker %s: %w", id, err)
	}
	return dedup.StartMark{Run: true, Token: startRef{rowID: rec.id, mark: attempts}}, false, nil
}

// ClearStart withdraws the marker m after its run returned to the caller
// without an outcome (Process returned an error: a shutdown, the database
// unreachable): the process did not die, so the next marker must not count
// that run. It changes nothing when the run's attempt was recorded, or when
// m marked nothing.
func (s *Store) ClearStart(ctx context.Context, m dedup.StartMark) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	ref, ok := m.Token.(startRef)
	if !ok || ref.rowID == 0 {
		return nil
	}
	if _, err := s.pool.Exec(ctx, s.q.startMarkClearSQL, ref.rowID, ref.mark); err != nil {
		return fmt.Errorf("idemq: clear start marker: %w", err)
	}
	return nil
}

// lostExecution is a record whose last execution never reported an outcome
// and that has no attempt left.
type lostExecution struct {
	msg      *dedup.Message // the delivery that found it
	sum      []byte         // its payload fingerprint
	rec      *record        // the locked record
	by       dedup.MatchedBy
	attempts int   // the record's attempts once final
	cause    error // wraps ErrExecutionLost
	// owner is the lease claim's owner token that ends the record (nil
	// outside lease mode): it is kept on the record, so that the claim,
	// sent again after its answer was lost, recognises its own first run
	// (ownExhaust), and the dead owner's late marks are fenced.
	owner *uuid.UUID
}

// exhaustLostExecution makes the locked record l.rec FAILED_FINAL with
// l.attempts and writes its dead letter (ReasonAttemptsExhausted, class
// "attempts_exhausted") in tx. It does not commit.
func (s *Store) exhaustLostExecution(ctx context.Context, tx pgx.Tx, l lostExecution) (dedup.Result, error) {
	msg, n, cause := l.msg, l.attempts, l.cause
	if _, err := tx.Exec(ctx, s.q.recordExhaustLostSQL, l.rec.id, n, clip(cause.Error(), s.cfg.MaxErrorBytes), classExecutionLost,
		*s.expiry(dedup.StatusFailedFinal), clip(msg.Source, 1024), msg.ReconsumeTimes, l.owner); err != nil {
		return dedup.Result{}, fmt.Errorf("idemq: mark %s %s: %w", dedup.StatusFailedFinal, msg.Identity, err)
	}
	dlID, err := s.q.insertDeadLetter(ctx, tx, deadLetterRow{msg: msg, sum: l.sum, reason: dedup.ReasonAttemptsExhausted,
		cause: cause, class: classExecutionLost, attempts: n})
	if err != nil {
		return dedup.Result{}, err
	}
	s.cfg.Logger.WarnContext(ctx, "idemq: attempts exhausted by executions that never reported an outcome; dead-lettered without running the handler",
		"identity", msg.Identity.String(), "attempts", n, "source", msg.Source)
	return dedup.Result{Outcome: dedup.OutcomeDeadLetter, MatchedBy: l.by, Status: dedup.StatusFailedFinal, Attempts: n, Err: cause,
		Reason: dedup.ReasonAttemptsExhausted, DeadLetterID: dlID}, nil
}

// ownExhaust answers a lease claim sent again after its answer was lost
// (claimLeaseRetrying) that found msg's record FAILED_FINAL (res, a
// duplicate): when the record is FAILED_FINAL under one of tokens, the lost
// claim was the one that found the last attempt's lease expired and
// dead-lettered the record, and the answer is its dead letter (ok true), as
// the first run answered; else ok is false and res stands.
func (s *Store) ownExhaust(ctx context.Context, msg *dedup.Message, sum []byte, tokens []uuid.UUID, res dedup.Result) (dl dedup.Result, ok bool, err error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	id := msg.Identity
	err = pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var attempts int
		err := tx.QueryRow(ctx, s.q.leaseOwnExhaustSQL, id.Scope, id.MessageID, id.BusinessKey, tokenStrings(tokens)).Scan(&attempts)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("idemq: lease claim %s: look for a claim whose answer was lost: %w", id, err)
		}
		dlID, err := s.q.liveDeadLetterID(ctx, tx, msg, sum, dedup.ReasonAttemptsExhausted)
		if err != nil {
			return err
		}
		dl, ok = dedup.Result{Outcome: dedup.OutcomeDeadLetter, MatchedBy: res.MatchedBy, Status: dedup.StatusFailedFinal, Attempts: attempts,
			Err: leaseLost(attempts), Reason: dedup.ReasonAttemptsExhausted, DeadLetterID: dlID}, true
		return nil
	})
	return dl, ok, err
}

// leaseLost is the dead letter's cause when a lease-mode copy finds an
// expired lease at the last attempt (the Redis-only store's rule).
func leaseLost(attempts int) error {
	return fmt.Errorf("%w: attempts exhausted: the lease of attempt %d expired without an outcome (its owner died or stalled)", dedup.ErrExecutionLost, attempts)
}

// startRef is the Token of a StartMark this store wrote.
type startRef struct {
	rowID int64 // the record marked
	mark  int   // the start_mark written
}
