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

// checkSchema runs the store's CheckSchema, with Config.CheckSchema and when
// the store has one, before Run fetches anything: a missing or outdated
// schema stops Run at once with what to run, instead of failing every
// delivery.
func (c *Consumer) checkSchema(ctx context.Context) error {
	sc, ok := c.cfg.Store.(SchemaChecker)
	if !ok || !c.cfg.CheckSchema {
		return nil
	}
	if err := sc.CheckSchema(ctx); err != nil {
		return fmt.Errorf("idemq/consumer: %w", err)
	}
	return nil
}
