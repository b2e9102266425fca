package main

import (
	"flag"
	"io"

	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/outbox"
)

// migrateFlags are the flags of `idemq migrate` and `idemq outbox migrate`
// besides the table names: -print writes the SQL instead of applying it,
// -check only verifies the version, read-only.
type migrateFlags struct {
	print, check bool
}

func (m *migrateFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&m.print, "print", false, "print the versioned migration SQL (schema and table names filled in) for Flyway/goose/Atlas/psql instead of applying it; needs no database")
	fs.BoolVar(&m.check, "check", false, "only check, read-only, that the schema version is current (exit 1 with what to run if not); needs no DDL rights")
}

// printRecordsSQL writes pgstore.MigrationSQL for f's schema and tables.
func printRecordsSQL(w io.Writer, f *storeFlags) error {
	sql, err := pgstore.MigrationSQL(pgstore.Config{Schema: f.db.schema, RecordsTable: f.records, DeadLettersTable: f.deadLetters, Fingerprinter: adminFingerprinter()})
	if err != nil {
		return err
	}
	_, err = io.WriteString(w, sql)
	return err
}

// printOutboxSQL writes outbox.MigrationSQL for d's schema and table.
func printOutboxSQL(w io.Writer, d *outboxFlags) error {
	sql, err := outbox.MigrationSQL(outbox.Config{Schema: d.schema, Table: d.table})
	if err != nil {
		return err
	}
	_, err = io.WriteString(w, sql)
	return err
}
