package pgmigrate

import (
	"context"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/tern/v2/migrate"
)

// LockKey is the pg_advisory_lock key held while migrating ("idemq" in
// ASCII). Every idemq migration takes it, so concurrent processes, and the
// dedup and outbox migrations, never race on "create schema".
const LockKey int64 = 0x6964656d71

// Apply creates schema if needed and applies the migrations in fsys
// (NNN_name.sql files, tern templates filled from data) that the version
// table schema.versionTable does not record yet, under LockKey. It first
// reads the version read-only (Current) and returns without a lock or any DDL
// when the schema is already current, so a role without DDL rights can call
// it on a migrated database.
func Apply(ctx context.Context, pool *pgxpool.Pool, schema, versionTable string, fsys fs.FS, data map[string]any) error {
	if found, want, exists, err := Current(ctx, pool, schema, versionTable, fsys); err == nil && exists && found >= want {
		return nil
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	c := conn.Conn()
	if _, err := c.Exec(ctx, "select pg_advisory_lock($1)", LockKey); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	defer func() { _, _ = c.Exec(context.WithoutCancel(ctx), "select pg_advisory_unlock($1)", LockKey) }()

	if _, err := c.Exec(ctx, "create schema if not exists "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	m, err := migrate.NewMigrator(ctx, c, pgx.Identifier{schema, versionTable}.Sanitize())
	if err != nil {
		return err
	}
	for k, v := range data {
		m.Data[k] = v
	}
	if err := m.LoadMigrations(fsys); err != nil {
		return fmt.Errorf("load: %w", err)
	}
	return m.Migrate(ctx)
}
