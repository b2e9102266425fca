package consumer

import (
	"context"
	"fmt"
)

// SchemaChecker is implemented by stores that can verify, read-only, that
// their database schema is current: *pgstore.Store (CheckSchema returns a
// *pgstore.SchemaError matching pgstore.ErrSchemaMissing or
// pgstore.ErrSchemaOutdated). Stores without tables (redisstore.Store) do not
// implement it.
type SchemaChecker interface {
	// CheckSchema returns nil when the schema holds every migration the
	// store's build needs, an error telling what to run otherwise.
	CheckSchema(ctx context.Context) error
}

// CheckSchema runs the store's read-only schema check (SchemaChecker) unless
// Config.SkipSchemaCheck is set or the store has none, and returns its error
// prefixed "idemq/consumer:" (errors.Is matches pgstore.ErrSchemaMissing /
// pgstore.ErrSchemaOutdated). Run calls it before it fetches anything; push
// adapters (rocketmqadapter.PushConsumer.Start) call it before they
// subscribe, so a missing or outdated schema stops the consumer at start with
// what to run instead of failing every delivery. It costs one SELECT.
func (c *Consumer) CheckSchema(ctx context.Context) error {
	sc, ok := c.cfg.Store.(SchemaChecker)
	if !ok || c.cfg.SkipSchemaCheck {
		return nil
	}
	if err := sc.CheckSchema(ctx); err != nil {
		return fmt.Errorf("idemq/consumer: %w", err)
	}
	return nil
}
