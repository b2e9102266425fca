package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemq/idemq/dedup"
)

// ProcessBatch runs h for msgs in batched atomic mode: one
// transaction and one commit for the whole batch. This is the throughput
// mode: the commit, the costly part, is paid once per batch.
//
// One round trip claims the whole batch (claimSet): one statement reads
// every record the messages match (by message ID, and by non-empty business
// key) and inserts the new ones at once, directly SUCCEEDED with their expiry
// (the COMMIT decides, as in atomic mode), and a second, pipelined with it,
// locks the matched records that are not terminal (PROCESSING,
// FAILED_RETRYABLE) in id order. A duplicate of a terminal record
// (SUCCEEDED, FAILED_FINAL) is answered from the read: no lock, no write. A
// new message's handler runs after a savepoint — set with the claim for the
// first, then released and set again in one round trip before each next
// one, so savepoints never nest however large the batch — and a handler that
// fails rolls back alone (its writes) and is marked FAILED_RETRYABLE or
// FAILED_FINAL (+ dead letter) in the same transaction. Duplicates and
// conflicts need no savepoint. A record to retry (FAILED_RETRYABLE), or one
// that changed since the read, is claimed and run on its own, as Process
// does. ProcessBatchSet is the same with one set-based handler call.
//
// With Config.FastPath set, the batch's messages are looked up before any
// transaction is opened: in one call when the fast path is a
// dedup.BatchFastPath (redisfast: one MGET per scope in one pipeline), else
// one Lookup per message. A hit whose remembered fingerprint matches is
// answered as a duplicate (Outcome OutcomeDuplicate, Status SUCCEEDED) and
// costs Postgres nothing; only the misses are claimed, in one transaction,
// and a batch whose every message hits opens none. A fast-path error (Redis
// down, the breaker open) makes every message a miss: Postgres answers.
//
// Messages are handled in order. Processing stops at the first OutcomeRetry
// so that a later message of the same partition never overtakes an earlier
// one that still has to be retried: the results of the messages after it are
// left zero (Outcome ""), meaning "not attempted". A message appearing twice
// in a batch is handled twice, in order (the second copy is a duplicate).
//
// A bad entry never blocks the batch. When the batch transaction cannot
// commit because of one of its messages (the server refused the COMMIT: a
// deferred constraint, an aborted transaction; or a handler left the
// transaction unusable), or keeps failing with serialization failures or
// deadlocks after Config.TransientRetry, the batch is rerun one message per
// transaction with Process's semantics, in order, stopping at the first
// message that must be retried later. The culprit is then marked like any
// handler failure (an attempt counted; FAILED_FINAL and a dead letter after
// Config.MaxAttempts) and the others commit. A batch is never retried whole
// without end.
//
// results has one entry per message. A non-nil error means nothing of the
// batch is durable and nothing may be acked; it wraps ErrOutcomeUnknown when
// the connection was lost or terminated at COMMIT or under a handler, or
// ctx ended (nothing was counted or marked). results, when not nil with an
// error, only say which handlers ran (HandlerCalled; Outcome ""). When a
// per-message rerun meets such an error after earlier messages committed,
// their results come back with a nil error, and the failing message's
// result has Outcome "" (not acked), HandlerCalled, and Err set to the
// error.
func (s *Store) ProcessBatch(ctx context.Context, msgs []*dedup.Message, h Handler) ([]dedup.Result, error) {
	if len(msgs) == 0 {
		return []dedup.Result{}, nil
	}
	if h == nil {
		return nil, errors.New("idemq: ProcessBatch: nil handler")
	}
	fps, err := s.batchFingerprints("ProcessBatch", msgs)
	if err != nil {
		return nil, err
	}
	w := batchWork{h: h}
	if s.cfg.FastPath != nil {
		return s.processBatchFast(ctx, msgs, fps, w)
	}
	return s.processBatchPG(ctx, msgs, fps, w)
}

// processBatchPG is ProcessBatch on Postgres, for the messages the fast path
// did not answer (all of them without one).
func (s *Store) processBatchPG(ctx context.Context, msgs []*dedup.Message, fps []batchFP, w batchWork) ([]dedup.Result, error) {
	// called[i]: the handler ran for msgs[i] in some try.
	called := make([]bool, len(msgs))
	var results []dedup.Result
	var class dedup.FailureClass
	var failure error
	var sole *soleFailure
	_, waitErr := retryWhile(ctx, s.cfg.TransientRetry, s.cfg.Logger, "batch", dedup.IsTransient, func() (struct{}, error) {
		results, class, failure = s.setTx(ctx, msgs, fps, w, called, &sole)
		if class == dedup.FailureTransient {
			return struct{}{}, failure
		}
		return struct{}{}, nil
	})
	switch {
	case failure == nil:
		s.fastRememberBatch(ctx, msgs, fps, results)
		return results, nil
	case waitErr != nil && !dedup.IsTransient(waitErr):
		// ctx ended while waiting to retry.
		return calledResults(called), fmt.Errorf("%w: batch: %w", dedup.ErrOutcomeUnknown, errors.Join(waitErr, failure))
	case class == dedup.FailureOutcomeUnknown:
		return calledResults(called), failure
	}
	s.cfg.Logger.WarnContext(ctx, "idemq: batch could not commit; rerunning it one message per transaction to find the culprit",
		"messages", len(msgs), "class", class, "err", failure)
	return s.rerunOneByOne(ctx, msgs, fps, w.perMessage(), called, sole)
}

// batchFP is the fingerprint of one message of a batch, or why it has none.
type batchFP struct {
	sum   []byte
	keyID string
	err   error
}
