package outbox_test

import (
	"fmt"
	"log"
	"strings"

	"github.com/idemq/idemq/outbox"
)

// The outbox's SQL for a migration tool, like pgstore.MigrationSQL.
func ExampleMigrationSQL() {
	sql, err := outbox.MigrationSQL(outbox.Config{Schema: "billing", Table: "events_out"})
	if err != nil {
		log.Fatal(err)
	}
	for _, line := range strings.Split(sql, "\n") {
		if strings.HasPrefix(line, "-- idemq outbox version ") || strings.HasPrefix(line, "update \"billing\".\"events_out_schema_version\"") {
			fmt.Println(line)
		}
	}
	// Output:
	// -- idemq outbox version 0: schema "billing" and version table "billing"."events_out_schema_version"
	// -- idemq outbox version 1: 001_outbox.sql
	// update "billing"."events_out_schema_version" set version = 1;
	// -- idemq outbox version 2: 002_last_error_at.sql
	// update "billing"."events_out_schema_version" set version = 2;
	// -- idemq outbox version 3: 003_message_id.sql
	// update "billing"."events_out_schema_version" set version = 3;
}
