package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A store on a pool: New validates the config without touching the database;
// Migrate (once at start) creates the tables; Process runs a handler in the
// transaction that also holds the consumption record.
func ExampleNew() {
	fp, _ := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "k1", Secret: []byte("a secret of 16+ bytes")})
	pool, _ := pgxpool.New(context.Background(), "postgres://app@127.0.0.1:5432/app") // connects lazily
	defer pool.Close()

	store, err := pgstore.New(pool, pgstore.Config{Fingerprinter: fp})
	if err != nil {
		panic(err)
	}
	c := store.Config()
	fmt.Println(c.Schema, c.RecordsTable, c.MaxAttempts, c.SucceededRetention)

	// A handler's writes commit with the record, or not at all.
	var _ pgstore.Handler = func(ctx context.Context, tx pgx.Tx, msg *dedup.Message) error {
		_, err := tx.Exec(ctx, `insert into payments (id, amount) values ($1, $2)`, msg.Identity.BusinessKey, 100)
		return err
	}

	// Config errors name the field and wrap ErrInvalidConfig.
	_, err = pgstore.New(pool, pgstore.Config{Fingerprinter: fp, SucceededRetention: time.Second})
	fmt.Println(errors.Is(err, pgstore.ErrInvalidConfig))
	// Output:
	// idemq consumption_records 5 168h0m0s
	// true
}
