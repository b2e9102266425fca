// Package pgmigrate applies idemq's embedded, numbered SQL migrations
// (github.com/jackc/tern/v2) for one set of tables: the dedup store's and the
// outbox's share it.
package pgmigrate
