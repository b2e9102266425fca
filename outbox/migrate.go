package outbox

import (
	"context"
	"embed"
	"fmt"

	"github.com/idemq/idemq/internal/pgmigrate"
	"github.com/idemq/idemq/internal/pooler"
	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrate creates the schema if needed and applies the embedded, numbered SQL
// migrations (outbox/migrations/NNN_*.sql) that the database does not have
// yet, recording the version in <schema>.<table>_schema_version. It is safe
// to call from many processes at once (a Postgres advisory lock serializes
// them, together with pgstore.Store.Migrate) and cheap when there is nothing
// to do: it first reads the version read-only (as CheckSchema does) and, when
// the schema is current, returns without a lock or any DDL, so a data-only
// role may call it. It returns ErrNoPool on an Outbox built without a pool,
// and an error wrapping ErrNeedsSession with Config.TransactionPooler set.
func (o *Outbox) Migrate(ctx context.Context) error {
	if o.pool == nil {
		return ErrNoPool
	}
	if o.cfg.TransactionPooler {
		return pooler.NeedsSession("idemq/outbox: migrate", "outbox.Config.TransactionPooler",
			"run Migrate on an Outbox built on a direct pool to Postgres (same Config, TransactionPooler false)")
	}
	if err := pgmigrate.Apply(ctx, o.pool, o.cfg.Schema, o.cfg.Table+"_schema_version", migrations(), o.templateData()); err != nil {
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
