package transition_test

import (
	"context"
	"errors"
	"log"
	"net/http"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/transition"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// An order's life cycle, applied by a payment provider's callback (HTTP,
// delivered up to three times) and by a message handler under idemq's
// consumer (the same Machine, in the handler's transaction). The table:
//
//	create table shop.orders (id text primary key, status text not null,
//	  version bigint not null default 0, amount numeric not null)
//
// (Compiled, not run: it needs Postgres.)
func Example() {
	orders, err := transition.New(transition.Config{
		Table: pgx.Identifier{"shop", "orders"}, // columns id, status, version: the defaults
		Rules: append(transition.Path("PENDING", "PAID", "SHIPPED"),
			transition.Rule{From: "PENDING", To: "CANCELLED"}),
	})
	if err != nil {
		log.Fatal(err)
	}
	prometheus.MustRegister(orders.Collector()) // idemq_transitions_total{entity="orders",result="illegal"}

	var pool *pgxpool.Pool // your pool
	http.HandleFunc("POST /callbacks/provider", func(w http.ResponseWriter, r *http.Request) {
		orderID := r.FormValue("order_id")
		err := pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error {
			res, err := orders.Apply(r.Context(), tx, orderID, "PAID")
			if err != nil || res.AlreadyApplied {
				return err // a repeated callback: nothing more to do
			}
			// res.Changed: the first delivery. Effects that must happen
			// once go here, in the same transaction (an outbox row, …).
			return nil
		})
		var illegal *transition.IllegalTransitionError
		switch {
		case errors.As(err, &illegal): // e.g. CANCELLED: the provider must refund
			http.Error(w, "order is "+illegal.Status, http.StatusConflict)
		case errors.Is(err, transition.ErrNotFound):
			http.Error(w, "no such order", http.StatusNotFound)
		case err != nil:
			http.Error(w, "try again", http.StatusServiceUnavailable) // the provider retries
		default:
			w.WriteHeader(http.StatusNoContent) // first delivery and repeats alike
		}
	})

	// The same transition from a message handler (consumer.Config.Handler).
	shipped := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		_, err := orders.Apply(ctx, tx, string(m.Key), "SHIPPED")
		if errors.Is(err, transition.ErrIllegalTransition) {
			return dedup.Permanent(err) // dead-lettered, not retried
		}
		return err
	}
	_ = shipped
}

// The optimistic lock: change the row only if nobody changed it since it
// was read at version v. (Compiled, not run: it needs Postgres.)
func ExampleIfVersion() {
	var tx pgx.Tx // your transaction
	var orders *transition.Machine
	ctx := context.Background()

	var status string
	var v int64
	if err := tx.QueryRow(ctx, `select status, version from shop.orders where id = $1`, "o-1").Scan(&status, &v); err != nil {
		log.Fatal(err)
	}
	// … decide from what was read …
	_, err := orders.Apply(ctx, tx, "o-1", "CANCELLED", transition.IfVersion(v))
	if errors.Is(err, transition.ErrStaleVersion) {
		log.Print("the order changed meanwhile: read it again and decide again")
	}
}
