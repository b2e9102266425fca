package dedup

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ProcessBatch runs h for msgs in batched atomic mode: one
// transaction and one commit for the whole batch, each handler run after its
// own savepoint. A message whose handler fails rolls back alone (its writes)
// and is marked FAILED_RETRYABLE or FAILED_FINAL (+ dead letter) in the same
// transaction. This is the throughput mode: the commit, the costly
// part, is paid once per batch.
//
// Messages are handled in order. Processing stops at the first OutcomeRetry
// so that a later message of the same partition never overtakes an earlier
// one that still has to be retried: the results of the messages after it are
// left zero (Outcome ""), meaning "not attempted". A message appearing twice
// in a batch is handled twice, in order (the second copy is a duplicate).
//
// results has one entry per message. A non-nil error means the batch
// transaction did not commit: no result is durable, nothing may be acked.
func (s *Store) ProcessBatch(ctx context.Context, msgs []*Message, h Handler) ([]Result, error) {
	results := make([]Result, len(msgs))
	if len(msgs) == 0 {
		return results, nil
	}
	if h == nil {
		return nil, errors.New("idemq: ProcessBatch: nil handler")
	}
	type fp struct {
		sum   []byte
		keyID string
		err   error
	}
	fps := make([]fp, len(msgs))
	for i, m := range msgs {
		if m == nil || m.Identity.Scope == "" || m.Identity.MessageID == "" {
			return nil, fmt.Errorf("idemq: ProcessBatch: message %d has no identity (use NewIdentity)", i)
		}
		fps[i].sum, fps[i].keyID, fps[i].err = s.fp.Sum(m.Payload)
	}

	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, fmt.Errorf("idemq: begin batch: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	for i, m := range msgs {
		if fps[i].err != nil {
			res, err := s.markFailedIn(ctx, tx, m, nil, "", Permanent(fps[i].err), ReasonBadInput)
			if err != nil {
				return nil, err
			}
			results[i] = res
			continue
		}
		if res, hit := s.fastLookup(ctx, m); hit {
			results[i] = res
			continue
		}
		res, herr, err := s.claimAndRunIn(ctx, tx, m, fps[i].sum, fps[i].keyID, h, false)
		if err != nil {
			return nil, err
		}
		if herr != nil {
			// The handler's failure could not be rolled back to its
			// savepoint: the transaction is unusable, the batch fails.
			return nil, fmt.Errorf("idemq: batch transaction unusable after a handler failure: %w", herr)
		}
		results[i] = res
		if res.Outcome == OutcomeRetry {
			break
		}
	}
	if err := commit(ctx, tx); err != nil {
		return nil, err
	}
	for i, r := range results {
		if r.Status == StatusSucceeded && (r.Outcome == OutcomeProcessed || r.Outcome == OutcomeDuplicate) && fps[i].err == nil {
			s.fastRemember(ctx, msgs[i].Identity, fps[i].sum, fps[i].keyID)
		}
	}
	return results, nil
}
