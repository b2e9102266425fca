package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/pgmigrate"
)

// ErrSchemaMissing is matched (errors.Is) by the *SchemaError CheckSchema
// returns when the version table <schema>.<RecordsTable>_schema_version does
// not exist: nothing was ever migrated there.
var ErrSchemaMissing = errors.New("idemq: schema missing")

// ErrSchemaOutdated is matched (errors.Is) by the *SchemaError CheckSchema
// returns when the version table records an older version than this build's
// embedded migrations (dedup/pgstore/migrations) need.
var ErrSchemaOutdated = errors.New("idemq: schema outdated")

// SchemaError is CheckSchema's error for a schema that is missing or older
// than this build needs. errors.Is matches ErrSchemaMissing when Found is 0
// and the version table does not exist, else ErrSchemaOutdated.
type SchemaError struct {
	Schema       string // the configured Config.Schema
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
	return fmt.Sprintf("idemq: consumption-record schema %q is %s: run `idemq migrate --schema %s` (or Store.Migrate) with a role that may run DDL, or apply `idemq migrate --print --schema %s` with your migration tool",
		e.Schema, what, e.Schema, e.Schema)
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

func versionTable(cfg Config) string { return cfg.RecordsTable + "_schema_version" }

// CheckSchema verifies, read-only (one SELECT, no lock, no DDL, so a
// data-only role may call it), that the schema holds every migration this
// build embeds. It returns nil when the recorded version is the latest or
// newer (a newer schema comes from a newer build during a rolling deploy), a
// *SchemaError matching ErrSchemaMissing or ErrSchemaOutdated otherwise, and
// the database's error when the query fails (e.g. permission denied on the
// version table).
func (s *Store) CheckSchema(ctx context.Context) error {
	found, want, exists, err := pgmigrate.Current(ctx, s.pool, s.cfg.Schema, versionTable(s.cfg), migrations())
	if err != nil {
		return fmt.Errorf("idemq: check schema: %w", err)
	}
	if exists && found >= want {
		return nil
	}
	return &SchemaError{Schema: s.cfg.Schema, VersionTable: versionTable(s.cfg), Found: found, Want: want, Missing: !exists}
}

// MigrationSQL returns the SQL that Migrate would apply to an empty database
// for cfg (defaults applied; its schema and table names filled in), for
// teams that migrate with their own tool (Flyway, goose, Atlas, psql): a
// version-0 block creating the schema and the version table, then one block
// per migration version in order, each starting with a
// "-- idemq records version N: <file>" line and ending with the version-table
// update. Run each block in one transaction. A database migrated this way
// passes CheckSchema, and Migrate treats it like its own. Only Schema,
// RecordsTable and DeadLettersTable are read (defaults "idemq",
// "consumption_records", "dead_letters"); the rest of cfg, Fingerprinter
// included, may be left zero. It returns an error wrapping
// dedup.ErrInvalidConfig, naming the field, for an invalid name.
func MigrationSQL(cfg Config) (string, error) {
	cfg = cfg.withDefaults()
	for name, v := range map[string]string{"Schema": cfg.Schema, "RecordsTable": cfg.RecordsTable, "DeadLettersTable": cfg.DeadLettersTable} {
		if !identRe.MatchString(v) {
			return "", fmt.Errorf("%w: %s %q must match %s", dedup.ErrInvalidConfig, name, v, identRe)
		}
	}
	if cfg.RecordsTable == cfg.DeadLettersTable {
		return "", fmt.Errorf("%w: RecordsTable and DeadLettersTable are both %q", dedup.ErrInvalidConfig, cfg.RecordsTable)
	}
	return pgmigrate.SQL("records", cfg.Schema, versionTable(cfg), migrations(), tableNames(cfg))
}
