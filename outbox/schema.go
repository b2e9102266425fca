package outbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/idemq/idemq/internal/pgmigrate"
)

// ErrSchemaMissing is matched (errors.Is) by the *SchemaError CheckSchema
// returns when the version table <schema>.<Table>_schema_version does not
// exist: the outbox was never migrated there.
var ErrSchemaMissing = errors.New("idemq/outbox: schema missing")

// ErrSchemaOutdated is matched (errors.Is) by the *SchemaError CheckSchema
// returns when the version table records an older version than this build's
// embedded migrations (outbox/migrations) need.
var ErrSchemaOutdated = errors.New("idemq/outbox: schema outdated")

// SchemaError is CheckSchema's error for an outbox schema that is missing or
// older than this build needs. errors.Is matches ErrSchemaMissing when the
// version table does not exist, else ErrSchemaOutdated.
type SchemaError struct {
	Schema       string // the configured Config.Schema
	Table        string // the configured Config.Table
	VersionTable string // the version table's name, unqualified
	Found        int    // the recorded version; 0 when missing
	Want         int    // the latest embedded migration's version
	Missing      bool   // the version table does not exist
}

// Error names the found and wanted versions and what to run.
func (e *SchemaError) Error() string {
	what := fmt.Sprintf("outdated (found version %d, want %d)", e.Found, e.Want)
	if e.Missing {
		what = fmt.Sprintf("missing (no version table %q, want version %d)", e.VersionTable, e.Want)
	}
	return fmt.Sprintf("idemq/outbox: outbox %q in schema %q is %s: run `idemq outbox migrate --schema %s --table %s` (or Outbox.Migrate) with a role that may run DDL, or apply `idemq outbox migrate --print --schema %s --table %s` with your migration tool",
		e.Table, e.Schema, what, e.Schema, e.Table, e.Schema, e.Table)
}

// Is matches ErrSchemaMissing or ErrSchemaOutdated.
func (e *SchemaError) Is(target error) bool {
	return (e.Missing && target == ErrSchemaMissing) || (!e.Missing && target == ErrSchemaOutdated)
}

func migrations() fs.FS {
	sub, err := fs.Sub(migrationFS, "migrations")
	if err != nil {
		panic(err) // the embedded directory always exists
	}
	return sub
}

// CheckSchema verifies, read-only (one SELECT, no lock, no DDL, so a
// data-only role may call it), that the outbox schema holds every migration
// this build embeds. It returns nil when the recorded version is the latest
// or newer (a newer build's, during a rolling deploy), a *SchemaError
// matching ErrSchemaMissing or ErrSchemaOutdated otherwise, ErrNoPool on an
// Outbox built without a pool, and the database's error when the query fails.
func (o *Outbox) CheckSchema(ctx context.Context) error {
	if o.pool == nil {
		return ErrNoPool
	}
	vt := o.cfg.Table + "_schema_version"
	found, want, exists, err := pgmigrate.Current(ctx, o.pool, o.cfg.Schema, vt, migrations())
	if err != nil {
		return fmt.Errorf("idemq/outbox: check schema: %w", err)
	}
	if exists && found >= want {
		return nil
	}
	return &SchemaError{Schema: o.cfg.Schema, Table: o.cfg.Table, VersionTable: vt, Found: found, Want: want, Missing: !exists}
}

// MigrationSQL returns the SQL that Outbox.Migrate would apply to an empty
// database for cfg (defaults applied; its schema and table names filled in),
// for teams that migrate with their own tool (Flyway, goose, Atlas, psql): a
// version-0 block creating the schema and the version table, then one block
// per migration version in order, each starting with a
// "-- idemq outbox version N: <file>" line and ending with the version-table
// update. Run each block in one transaction. It returns cfg's validation
// error for an invalid cfg.
func MigrationSQL(cfg Config) (string, error) {
	o, err := New(nil, cfg)
	if err != nil {
		return "", err
	}
	return pgmigrate.SQL("outbox", o.cfg.Schema, o.cfg.Table+"_schema_version", migrations(), o.templateData())
}
