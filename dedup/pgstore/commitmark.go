package pgstore

import (
	"context"
	"fmt"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// commitClaimedFailure marks the handler's failure pend.failed on the record
// this transaction claimed and commits, in one round trip (commitWith):
// the handler's savepoint rolled back, the record marked FAILED_RETRYABLE or
// FAILED_FINAL (markClaimedFailed's rules), the dead letter of a final
// failure, then COMMIT. Its results mean claimAndRun's:
//
//   - a statement of the mark that the server refused (the COMMIT behind it
//     was skipped, nothing committed): herr is the handler's failure, and
//     the caller rolls back; Process marks it in a new transaction, as when
//     the mark failed alone;
//   - a COMMIT refused: the same;
//   - a transient COMMIT (40001, 40P01): herr, retried whole;
//   - the connection lost during the batch: the COMMIT may have run; an err
//     wrapping ErrOutcomeUnknown, nothing counted by this delivery.
func (s *Store) commitClaimedFailure(ctx context.Context, tx *lazyTx, c claimRun, pend pendingMark) (_ dedup.Result, herr, err error) {
	m, dl, res := s.planClaimedFailure(claimedFailure{rowID: pend.rowID, attempts: pend.attempts, msg: c.msg, sum: c.sum, err: pend.failed})
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 4)}
	b.Queue(s.q.handlerRollbackSQL)
	b.Queue(s.q.recordMarkFailedSQL, m.args()...)
	if dl != nil {
		b.Queue(s.q.deadLetterInsertSQL, s.q.deadLetterArgs(*dl)...)
	}
	ended, err := tx.commitWith(ctx, b, func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			return err
		}
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("idemq: mark %s: %w", m.status, err)
		}
		if dl == nil {
			return nil
		}
		var err error
		res.DeadLetterID, err = scanDeadLetterID(*dl, br.QueryRow())
		return err
	})
	if err == nil {
		return res, nil, nil
	}
	called := dedup.Result{HandlerCalled: true, Attempts: pend.attempts}
	if !ended {
		return called, pend.failed, nil
	}
	switch commitFailureClass(err) {
	case dedup.FailureOutcomeUnknown:
		return called, nil, fmt.Errorf("%w: commit: %w", dedup.ErrOutcomeUnknown, err)
	case dedup.FailureTransient:
		return called, fmt.Errorf("idemq: commit: %w", err), nil
	}
	return called, pend.failed, nil
}
