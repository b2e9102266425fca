package pgmigrate

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/tern/v2/migrate"
)

// Querier is what Version reads through: a *pgxpool.Pool, a *pgx.Conn or a
// pgx.Tx.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// load parses and renders the migrations in fsys with data, without a
// database connection.
func load(fsys fs.FS, versionTable string, data map[string]any) ([]*migrate.Migration, error) {
	m, err := migrate.NewMigrator(context.Background(), nil, versionTable)
	if err != nil {
		return nil, err
	}
	for k, v := range data {
		m.Data[k] = v
	}
	if err := m.LoadMigrations(fsys); err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	return m.Migrations, nil
}

// Latest is the highest version in fsys: the version a current schema has.
func Latest(fsys fs.FS) (int, error) {
	ms, err := load(fsys, "v", nil)
	if err != nil {
		return 0, err
	}
	return len(ms), nil
}

// Version reads schema.versionTable read-only (one SELECT, no lock, no DDL).
// It returns found=0, exists=false when the version table (or the schema)
// does not exist.
func Version(ctx context.Context, q Querier, schema, versionTable string) (found int, exists bool, err error) {
	var v int32
	err = q.QueryRow(ctx, "select version from "+pgx.Identifier{schema, versionTable}.Sanitize()).Scan(&v)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return int(v), true, nil
	case errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000"): // undefined_table, invalid_schema_name
		return 0, false, nil
	case errors.Is(err, pgx.ErrNoRows):
		return 0, true, nil
	default:
		return 0, false, err
	}
}

// Current reports whether schema.versionTable records at least the latest
// version in fsys, read-only. found is the recorded version (0 when the table
// is missing), want the latest one.
func Current(ctx context.Context, pool *pgxpool.Pool, schema, versionTable string, fsys fs.FS) (found, want int, exists bool, err error) {
	want, err = Latest(fsys)
	if err != nil {
		return 0, 0, false, err
	}
	found, exists, err = Version(ctx, pool, schema, versionTable)
	return found, want, exists, err
}

// SQL renders the migrations in fsys (filled from data) as one SQL script
// that Flyway, goose, Atlas or psql can apply: a header block that creates
// the schema and the version table (version 0), then one block per version,
// in order, each ending with the version-table update that Apply would make.
// Every block starts with a "-- idemq <name> version N: <file>" line. The
// blocks hold no BEGIN/COMMIT: run each in one transaction (psql
// --single-transaction, or the tool's own per-migration transaction).
func SQL(name, schema, versionTable string, fsys fs.FS, data map[string]any) (string, error) {
	vt := pgx.Identifier{schema, versionTable}.Sanitize()
	ms, err := load(fsys, vt, data)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "-- idemq %s version 0: schema %s and version table %s\n", name, pgx.Identifier{schema}.Sanitize(), vt)
	fmt.Fprintf(&b, "create schema if not exists %s;\n", pgx.Identifier{schema}.Sanitize())
	fmt.Fprintf(&b, "create table if not exists %s(version int4 not null);\n", vt)
	fmt.Fprintf(&b, "insert into %s(version) select 0 where 0=(select count(*) from %s);\n", vt, vt)
	for _, m := range ms {
		fmt.Fprintf(&b, "\n-- idemq %s version %d: %s\n", name, m.Sequence, m.Name)
		b.WriteString(strings.TrimSpace(m.UpSQL))
		if !strings.HasSuffix(strings.TrimSpace(m.UpSQL), ";") {
			b.WriteString(";")
		}
		fmt.Fprintf(&b, "\nupdate %s set version = %d;\n", vt, m.Sequence)
	}
	return b.String(), nil
}
