package outbox

import (
	"embed"
	"fmt"

	"github.com/idemq/idemq/internal/namedsql"
	"github.com/jackc/pgx/v5"
)

// sqlFS holds the outbox's statements, one "-- name:" block each.
//
//go:embed sql/*.sql
var sqlFS embed.FS

// statements is sql/*.sql parsed once, at package initialization (a
// malformed or duplicated name panics here, and fails every test).
var statements = namedsql.MustParseFS(sqlFS, "sql/*.sql")

// queries holds the SQL of one Outbox: the named statements of sql/*.sql
// with its quoted table and channel filled in once, by New.
type queries struct {
	table   string // quoted, schema-qualified
	channel string // NOTIFY channel (a string argument, never spliced)

	insertSQL, lockKeysSQL, claimSQL, claimWalkSQL, publishedSQL, failedSQL, purgeSQL string
	listenSQL, notifySQL, probeSQL                                                    string
	getSQL, listAllSQL, listPendingSQL, listParkedSQL, unparkSQL, statsSQL            string
	unparkMatchingSQL, countParkedMatchingSQL                                         string
}

func newQueries(cfg Config) (queries, error) {
	q := queries{table: pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize(), channel: cfg.channel()}
	data := map[string]any{
		"outbox":  q.table,
		"channel": pgx.Identifier{q.channel}.Sanitize(),
		"notify":  !cfg.DisableNotify,
	}
	err := statements.Bind(data, map[string]*string{
		"insert":                &q.insertSQL,
		"lock_keys":             &q.lockKeysSQL,
		"claim":                 &q.claimSQL,
		"claim_walk":            &q.claimWalkSQL,
		"mark_published":        &q.publishedSQL,
		"mark_failed":           &q.failedSQL,
		"purge":                 &q.purgeSQL,
		"listen":                &q.listenSQL,
		"notify":                &q.notifySQL,
		"probe":                 &q.probeSQL,
		"get":                   &q.getSQL,
		"list_all":              &q.listAllSQL,
		"list_pending":          &q.listPendingSQL,
		"list_parked":           &q.listParkedSQL,
		"unpark":                &q.unparkSQL,
		"stats":                 &q.statsSQL,
		"unpark_matching":       &q.unparkMatchingSQL,
		"count_parked_matching": &q.countParkedMatchingSQL,
	})
	if err != nil {
		return queries{}, fmt.Errorf("idemq/outbox: statements: %w", err)
	}
	return q, nil
}
