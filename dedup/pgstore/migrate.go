package pgstore

import (
	"context"
	"embed"
	"fmt"
	"io/fs"

	"github.com/idemq/idemq/internal/pgmigrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrate creates the schema if needed and applies the embedded, numbered SQL
// migrations (dedup/migrations/NNN_*.sql) that the database does not have yet,
// recording the version in <schema>.<records table>_schema_version. It is safe
// to call from many processes at once (a Postgres advisory lock serializes
// them) and cheap when there is nothing to do.
func (s *Store) Migrate(ctx context.Context) error {
	sub, err := fs.Sub(migrationFS, "migrations")
	if err != nil {
		return err
	}
	if err := pgmigrate.Apply(ctx, s.pool, s.cfg.Schema, s.cfg.RecordsTable+"_schema_version", sub, s.q.tables); err != nil {
		return fmt.Errorf("idemq: migrate: %w", err)
	}
	return nil
}
