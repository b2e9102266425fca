package pgstore

import (
	"context"
	"embed"
	"fmt"

	"github.com/idemq/idemq/internal/pgmigrate"
	"github.com/idemq/idemq/internal/pooler"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrate creates the schema if needed and applies the embedded, numbered SQL
// migrations (dedup/migrations/NNN_*.sql) that the database does not have yet,
// recording the version in <schema>.<records table>_schema_version. It is safe
// to call from many processes at once (a Postgres advisory lock serializes
// them) and cheap when there is nothing to do: it first reads the version
// read-only (as CheckSchema does) and, when the schema is current, returns
// without a lock or any DDL, so a data-only role may call it.
//
// With Config.TransactionPooler set it returns an error wrapping
// ErrNeedsSession: the advisory lock is a session lock.
func (s *Store) Migrate(ctx context.Context) error {
	if s.cfg.TransactionPooler {
		return pooler.NeedsSession("idemq: migrate", "pgstore.Config.TransactionPooler",
			"run Migrate on a Store built on a direct pool to Postgres (same Config, TransactionPooler false)")
	}
	if err := pgmigrate.Apply(ctx, s.pool, s.cfg.Schema, versionTable(s.cfg), migrations(), s.q.tables); err != nil {
		return fmt.Errorf("idemq: migrate: %w", err)
	}
	return nil
}
