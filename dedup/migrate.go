package dedup

import (
	"context"
	"embed"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrationLockKey is the pg_advisory_lock key held while migrating, so that
// many processes may call Migrate at once ("idemq" in ASCII).
const migrationLockKey = 0x6964656d71

// Migrate creates the schema if needed and applies the embedded, numbered SQL
// migrations (dedup/migrations/NNN_*.sql) that the database does not have yet,
// recording the version in <schema>.<records table>_schema_version. It is safe
// to call from many processes at once (a Postgres advisory lock serializes
// them) and cheap when there is nothing to do.
func (s *Store) Migrate(ctx context.Context) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("idemq: migrate: %w", err)
	}
	defer conn.Release()
	c := conn.Conn()
	if _, err := c.Exec(ctx, "select pg_advisory_lock($1)", migrationLockKey); err != nil {
		return fmt.Errorf("idemq: migrate: lock: %w", err)
	}
	defer func() { _, _ = c.Exec(context.WithoutCancel(ctx), "select pg_advisory_unlock($1)", migrationLockKey) }()

	if _, err := c.Exec(ctx, "create schema if not exists "+pgx.Identifier{s.cfg.Schema}.Sanitize()); err != nil {
		return fmt.Errorf("idemq: migrate: create schema: %w", err)
	}
	m, err := migrate.NewMigrator(ctx, c, pgx.Identifier{s.cfg.Schema, s.cfg.RecordsTable + "_schema_version"}.Sanitize())
	if err != nil {
		return fmt.Errorf("idemq: migrate: %w", err)
	}
	for k, v := range s.templateData() {
		m.Data[k] = v
	}
	sub, err := fs.Sub(migrationFS, "migrations")
	if err != nil {
		return err
	}
	if err := m.LoadMigrations(sub); err != nil {
		return fmt.Errorf("idemq: migrate: load: %w", err)
	}
	if err := m.Migrate(ctx); err != nil {
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
	}
}
