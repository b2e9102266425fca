package outbox_test

import (
	"context"
	"fmt"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The README's outbox snippet (internal/docscheck checks that it is copied
// from here): the outbox on a pool, and a handler that writes its business
// rows and its outbox row through the consumption record's transaction.
func outboxHandler(ctx context.Context, pool *pgxpool.Pool) (pgstore.Handler, error) {
	ob, err := outbox.New(pool, outbox.Config{}) // table "idemq"."outbox"
	if err != nil {
		return nil, err
	}
	if err := ob.Migrate(ctx); err != nil { // or: idemq outbox migrate
		return nil, err
	}
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
	return confirm, nil // give it to consumer.Config.Handler
}

// Example_handler builds the README's handler without a pool: outbox.New
// refuses it with an error.
func Example_handler() {
	_, err := outboxHandler(context.Background(), nil)
	fmt.Println(err != nil)
	// Output: true
}
