package pgstore

import (
	"context"
	"embed"
	"fmt"
	"io/fs"

	"github.com/idemq/idemq/internal/pgmigrate"
	"github.com/jackc/pgx/v5"
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
	if err := pgmigrate.Apply(ctx, s.pool, s.cfg.Schema, s.cfg.RecordsTable+"_schema_version", sub, s.templateData()); err != nil {
		return fmt.Errorf("idemq: migrate: %w", err)
	}
	return nil
}

// templateData gives the migrations their quoted table and index names.
func (s *Store) templateData() map[string]any {
	ident := func(name string) string { return pgx.Identifier{name}.Sanitize() }
	r, d := s.cfg.RecordsTable, s.cfg.DeadLettersTable
	return map[string]any{
		"records":                  s.q.records,
		"dead_letters":             s.q.deadLetters,
		"records_message_id_key":   ident(r + "_message_id_key"),
		"records_business_key_key": ident(r + "_business_key_key"),
		"records_expires_idx":      ident(r + "_expires_idx"),
		"dead_letters_live_key":    ident(d + "_live_key"),
		"dead_letters_created_idx": ident(d + "_created_idx"),
		"lane_watermarks":          s.LaneWatermarksTable(),
		"redrives":                 s.redrivesTable(),
		"redrives_dead_letter_key": ident(d + "_redrives_dl_key"),
	}
}
