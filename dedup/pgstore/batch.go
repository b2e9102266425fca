package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemq/idemq/dedup"
)

// ProcessBatch runs h for msgs in batched atomic mode: one
// transaction and one commit for the whole batch, each handler run after its
// own savepoint, released once the message is done (pipelined with the next
// message's claim), so savepoints never nest however large the batch. A message whose handler fails rolls back alone (its writes)
// and is marked FAILED_RETRYABLE or FAILED_FINAL (+ dead letter) in the same
// transaction. This is the throughput mode: the commit, the costly
// part, is paid once per batch.
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
	fps := make([]batchFP, len(msgs))
	for i, m := range msgs {
		if m == nil || m.Identity.Scope == "" || m.Identity.MessageID == "" {
			return nil, fmt.Errorf("idemq: ProcessBatch: message %d has no identity (use NewIdentity)", i)
		}
		fps[i].sum, fps[i].keyID, fps[i].err = s.fp.Sum(m.Payload)
	}
	if s.cfg.FastPath != nil {
		return s.processBatchFast(ctx, msgs, fps, h)
	}
	return s.processBatchPG(ctx, msgs, fps, h)
}

// processBatchPG is ProcessBatch on Postgres, for the messages the fast path
// did not answer (all of them without one).
func (s *Store) processBatchPG(ctx context.Context, msgs []*dedup.Message, fps []batchFP, h Handler) ([]dedup.Result, error) {
	// called[i]: the handler ran for msgs[i] in some try.
	called := make([]bool, len(msgs))
	var results []dedup.Result
	var class dedup.FailureClass
	var failure error
	_, waitErr := retryWhile(ctx, s.cfg.TransientRetry, s.cfg.Logger, "batch", dedup.IsTransient, func() (struct{}, error) {
		results, class, failure = s.batchTx(ctx, msgs, fps, h, called)
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
	s.cfg.Logger.Warn("idemq: batch could not commit; rerunning it one message per transaction to find the culprit",
		"messages", len(msgs), "class", class, "err", failure)
	return s.rerunOneByOne(ctx, msgs, fps, h, called)
}

// batchFP is the fingerprint of one message of a batch, or why it has none.
type batchFP struct {
	sum   []byte
	keyID string
	err   error
}

// batchTx is one try of ProcessBatch: one transaction for the whole batch.
// On failure nothing is durable, and class says what the failure means:
// FailureOutcomeUnknown (failure wraps ErrOutcomeUnknown), FailureTransient
// (retry the batch), or FailureHandler (a message made the batch fail: find
// it). called[i] is set when the handler ran for msgs[i].
func (s *Store) batchTx(ctx context.Context, msgs []*dedup.Message, fps []batchFP, h Handler, called []bool) ([]dedup.Result, dedup.FailureClass, error) {
	results := make([]dedup.Result, len(msgs))
	tx, err := s.pool.BeginTx(ctx, s.cfg.TxOptions)
	if err != nil {
		return nil, ownFailureClass(err), wrapUnknown(fmt.Errorf("idemq: begin batch: %w", err))
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	held := false
	for i, m := range msgs {
		if fps[i].err != nil {
			res, err := s.markFailedIn(ctx, tx, failure{msg: m, err: dedup.Permanent(fps[i].err), finalReason: dedup.ReasonBadInput})
			if err != nil {
				return nil, ownFailureClass(err), wrapUnknown(err)
			}
			results[i] = res
			continue
		}
		// held: an earlier claim's savepoint is still set; it is released
		// in this claim's round trip, so savepoints never nest.
		res, herr, err := s.claimAndRunIn(ctx, tx, claimRun{msg: m, sum: fps[i].sum, keyID: fps[i].keyID, h: h, mode: claimProcessing, release: held})
		held = true
		called[i] = called[i] || res.HandlerCalled || herr != nil
		if err != nil {
			return nil, ownFailureClass(err), wrapUnknown(err)
		}
		if herr != nil {
			if dedup.IsTransient(herr) {
				return nil, dedup.FailureTransient, herr
			}
			// The handler's failure could not be rolled back to its
			// savepoint: the transaction is unusable; find the culprit.
			return nil, dedup.FailureHandler, fmt.Errorf("idemq: batch transaction unusable after a handler failure: %w", herr)
		}
		results[i] = res
		if res.Outcome == dedup.OutcomeRetry {
			break
		}
	}
	if err := tx.Commit(ctx); err != nil {
		class := commitFailureClass(err)
		if class == dedup.FailureOutcomeUnknown {
			return nil, class, fmt.Errorf("%w: batch commit: %w", dedup.ErrOutcomeUnknown, err)
		}
		return nil, class, fmt.Errorf("idemq: batch commit refused: %w", err)
	}
	return results, dedup.FailureNone, nil
}
