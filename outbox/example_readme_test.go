package outbox_test

import (
	"context"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The README's outbox snippet (internal/docscheck checks that it is copied
// from here): the outbox on a pool, and a handler that writes its business
// rows and its outbox row through the consumption record's transaction.
func Example_handler() {
	ctx := context.Background()
	var pool *pgxpool.Pool // your pool

	ob, _ := outbox.New(pool, outbox.Config{}) // table "idemq"."outbox"
	_ = ob.Migrate(ctx)                        // or: idemq outbox migrate

	confirm := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		if _, err := tx.Exec(ctx, `insert into shop.orders (order_id, body) values ($1, $2)`, string(m.Key), m.Payload); err != nil {
			return err
		}
		_, err := ob.Add(ctx, tx, outbox.Message{
			Topic:       "order.confirmed",
			Key:         m.Key, // per-key order: one order's events stay in order
			Payload:     m.Payload,
			CausationID: outbox.Causation(m),
		})
		return err
	}
	_ = pgstore.Handler(confirm) // give it to consumer.Config.Handler
}
