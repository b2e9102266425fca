package redisstore_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// A consumer whose handler has no database: records live in Redis, the
// handler runs in lease mode and passes the lease's idempotency key to the
// system it calls.
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	fp, _ := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "k1", Secret: []byte("a secret of 16+ bytes")})
	store, err := redisstore.New(redisstore.Config{Client: rdb, Fingerprinter: fp})
	if err != nil {
		panic(err)
	}
	_, err = consumer.New(consumer.Config{
		Scope: "notifications",
		Store: store,
		LeaseHandler: func(ctx context.Context, _ *dedup.Message) error {
			lease, _ := dedup.LeaseFromContext(ctx)
			_ = lease.IdempotencyKey() // send it with the e-mail request
			return nil
		},
	})
	fmt.Println("lease mode:", err)

	// Atomic mode needs a Postgres transaction: refused.
	_, err = consumer.New(consumer.Config{Scope: "notifications", Store: store,
		Handler: func(context.Context, pgx.Tx, *dedup.Message) error { return nil }})
	fmt.Println("atomic mode:", errors.Is(err, consumer.ErrInvalidConfig))

	c := store.Config()
	fmt.Println(c.Prefix, c.MaxAttempts, c.SucceededRetention, c.FailedRetention)
	// Output:
	// lease mode: <nil>
	// atomic mode: true
	// idemq 5 168h0m0s 720h0m0s
}
