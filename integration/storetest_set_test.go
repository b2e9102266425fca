package integration

import (
	"context"
	"fmt"
	"testing"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/dedup/storetest"
	"github.com/jackc/pgx/v5"
)

// The Postgres store's set-based batched mode (ProcessBatchSet) passes the
// conformance suite, one delivery per call: the suite's handler run by a
// BatchHandler over the slice it gets. A failing call of one message is
// marked without running the handler again (one execution, one attempt, as
// the suite counts them). The suite's BatchInOrder case is left to the
// per-message batched run: it counts handler effects made outside the
// transaction, and a failing BatchHandler call of several messages is, by
// design, run again one message at a time to find the culprit
// (pgstore: TestBatchHandlerCulpritFallback and
// TestBatchDuplicatesAndConflictsInsideABatch cover set-based batches).
func TestStoreConformancePostgresBatchSet(t *testing.T) {
	t.Parallel()
	storetest.Run(t, pgFeatures, func(t *testing.T) storetest.Harness {
		return pgHarness(t, batchSetMode)
	})
}

// batchSetMode is storetest's batched mode through ProcessBatchSet.
func batchSetMode(s *pgstore.Store) storetest.Mode {
	batch := func(ctx context.Context, msgs []*dedup.Message, h storetest.Handler) ([]dedup.Result, error) {
		res, err := s.ProcessBatchSet(ctx, msgs, func(ctx context.Context, _ pgx.Tx, ms []*dedup.Message) error {
			for _, m := range ms {
				if err := h(ctx, m); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil && len(res) != len(msgs) {
			err = fmt.Errorf("ProcessBatchSet of %d messages returned %d results", len(msgs), len(res))
		}
		return res, err
	}
	return storetest.Mode{Name: "batched-set", Process: func(ctx context.Context, msg *dedup.Message, h storetest.Handler) (dedup.Result, error) {
		res, err := batch(ctx, []*dedup.Message{msg}, h)
		if err != nil {
			return dedup.Result{}, err
		}
		return res[0], nil
	}}
}
