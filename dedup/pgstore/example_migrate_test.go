package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"

	"github.com/idemq/idemq/dedup/pgstore"
)

// MigrationSQL gives the SQL for a migration tool (Flyway, goose, Atlas,
// psql), with the configured names filled in: one block per version, each
// ending with the version-table update. It needs no database.
func ExampleMigrationSQL() {
	sql, err := pgstore.MigrationSQL(pgstore.Config{Schema: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	for _, line := range strings.Split(sql, "\n") {
		if strings.HasPrefix(line, "-- idemq records version ") {
			fmt.Println(line)
		}
	}
	// Output:
	// -- idemq records version 0: schema "billing" and version table "billing"."consumption_records_schema_version"
	// -- idemq records version 1: 001_consumption_records.sql
	// -- idemq records version 2: 002_dead_letters_live_key.sql
	// -- idemq records version 3: 003_crash_loops.sql
	// -- idemq records version 4: 004_redrives.sql
	// -- idemq records version 5: 005_records_hot_updates.sql
	// -- idemq records version 6: 006_http_responses.sql
	// -- idemq records version 7: 007_dead_letter_tooling.sql
}

// A service running under a data-only role checks the schema at start
// instead of migrating it (consumer.Run does the same before it fetches with
// consumer.Config.CheckSchema).
func ExampleStore_CheckSchema() {
	ctx := context.Background()
	var store *pgstore.Store // from pgstore.New, on a pool of the data-only role

	if err := store.CheckSchema(ctx); errors.Is(err, pgstore.ErrSchemaOutdated) || errors.Is(err, pgstore.ErrSchemaMissing) {
		log.Fatal(err) // names the found and wanted versions and what to run
	} else if err != nil {
		log.Fatal(err)
	}
}
