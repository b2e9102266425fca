package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// batchSetStore is a TxStore that also runs set-based batches
// (Config.BatchHandler): *pgstore.Store, ProcessBatchSet.
type batchSetStore interface {
	TxStore
	ProcessBatchSet(ctx context.Context, msgs []*dedup.Message, h dedup.TxBatchHandler[pgx.Tx]) ([]dedup.Result, error)
}

// validateBatchHandler checks Config.BatchHandler against the rest of c.
func (c Config) validateBatchHandler() error {
	if c.BatchHandler == nil {
		return nil
	}
	if _, ok := c.Store.(batchSetStore); !ok {
		return fmt.Errorf("%w: Store %T has no ProcessBatchSet for BatchHandler (set-based batched mode); use a *pgstore.Store", ErrInvalidConfig, c.Store)
	}
	if c.BatchSize < 2 {
		return fmt.Errorf("%w: BatchHandler needs BatchSize > 1 (got BatchSize %d): it runs once per batch of a pull lane", ErrInvalidConfig, c.BatchSize)
	}
	return nil
}

// txHandler is the per-message atomic-mode handler of cfg: Handler, or
// BatchHandler called with a one-message slice (a delivery run alone: a
// crash-loop replay, Handle); nil in lease mode.
func txHandler(cfg Config) dedup.TxHandler[pgx.Tx] {
	if cfg.Handler != nil || cfg.BatchHandler == nil {
		return cfg.Handler
	}
	bh := cfg.BatchHandler
	return func(ctx context.Context, tx pgx.Tx, msg *dedup.Message) error {
		return bh(ctx, tx, []*dedup.Message{msg})
	}
}

// boundBatch is boundTx for a batch handler: each call gets the deadline
// limit (0: h unchanged).
func boundBatch(h dedup.TxBatchHandler[pgx.Tx], limit time.Duration) dedup.TxBatchHandler[pgx.Tx] {
	if limit <= 0 || h == nil {
		return h
	}
	return func(ctx context.Context, tx pgx.Tx, msgs []*dedup.Message) error {
		hctx, cancel := context.WithTimeout(ctx, limit)
		defer cancel()
		return timeoutErr(ctx, hctx, limit, h(hctx, tx, msgs))
	}
}

// processBatchTx runs msgs through the store's batched mode: ProcessBatchSet
// with Config.BatchHandler, else ProcessBatch with Config.Handler.
func (c *Consumer) processBatchTx(ctx context.Context, msgs []*dedup.Message) ([]dedup.Result, error) {
	if c.cfg.BatchHandler != nil {
		return c.tx.(batchSetStore).ProcessBatchSet(ctx, msgs, boundBatch(c.cfg.BatchHandler, c.cfg.MaxHandlerDuration))
	}
	return c.tx.ProcessBatch(ctx, msgs, boundTx(c.cfg.Handler, c.cfg.MaxHandlerDuration))
}

// countSet is how many of set are true.
func countSet(set ...bool) int {
	n := 0
	for _, b := range set {
		if b {
			n++
		}
	}
	return n
}

// txHandlerFunc is an atomic-mode handler on Postgres.
type txHandlerFunc = dedup.TxHandler[pgx.Tx]
