package outbox

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
// many processes may call Migrate at once. It is the key dedup.Store.Migrate
// holds ("idemq" in ASCII), so the two never race on "create schema" when
// they share a schema.
const migrationLockKey = 0x6964656d71

// Migrate creates the schema if needed and applies the embedded, numbered SQL
// migrations (outbox/migrations/NNN_*.sql) that the database does not have
// yet, recording the version in <schema>.<table>_schema_version. It is safe
// to call from many processes at once (a Postgres advisory lock serializes
// them, together with dedup.Store.Migrate) and cheap when there is nothing
// to do. It returns ErrNoPool on an
// Outbox built without a pool.
func (o *Outbox) Migrate(ctx context.Context) error {
	if o.pool == nil {
		return ErrNoPool
	}
	conn, err := o.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("idemq/outbox: migrate: %w", err)
	}
	defer conn.Release()
	c := conn.Conn()
	if _, err := c.Exec(ctx, "select pg_advisory_lock($1)", int64(migrationLockKey)); err != nil {
		return fmt.Errorf("idemq/outbox: migrate: lock: %w", err)
	}
	defer func() {
		_, _ = c.Exec(context.WithoutCancel(ctx), "select pg_advisory_unlock($1)", int64(migrationLockKey))
	}()

	if _, err := c.Exec(ctx, "create schema if not exists "+pgx.Identifier{o.cfg.Schema}.Sanitize()); err != nil {
		return fmt.Errorf("idemq/outbox: migrate: create schema: %w", err)
	}
	m, err := migrate.NewMigrator(ctx, c, pgx.Identifier{o.cfg.Schema, o.cfg.Table + "_schema_version"}.Sanitize())
	if err != nil {
		return fmt.Errorf("idemq/outbox: migrate: %w", err)
	}
	for k, v := range o.templateData() {
		m.Data[k] = v
	}
	sub, err := fs.Sub(migrationFS, "migrations")
	if err != nil {
		return err
	}
	if err := m.LoadMigrations(sub); err != nil {
		return fmt.Errorf("idemq/outbox: migrate: load: %w", err)
	}
	if err := m.Migrate(ctx); err != nil {
		return fmt.Errorf("idemq/outbox: migrate: %w", err)
	}
	return nil
}

// templateData gives the migrations their quoted table and index names.
func (o *Outbox) templateData() map[string]any {
	ident := func(name string) string { return pgx.Identifier{name}.Sanitize() }
	t := o.cfg.Table
	return map[string]any{
		"outbox":               o.q.table,
		"outbox_id_key":        ident(t + "_id_key"),
		"outbox_pending_idx":   ident(t + "_pending_idx"),
		"outbox_key_idx":       ident(t + "_key_idx"),
		"outbox_keyless_idx":   ident(t + "_keyless_idx"),
		"outbox_published_idx": ident(t + "_published_idx"),
	}
}
