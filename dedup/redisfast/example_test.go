package redisfast_test

import (
	"log"
	"log/slog"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/dedup/redisfast"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Put Redis in front of Postgres for duplicates of succeeded messages, with
// a client that fails fast and the breaker's metrics registered.
// (Compiled, not run: it needs Redis and Postgres.)
func ExampleNew() {
	var pool *pgxpool.Pool // your pool
	logger := slog.Default()
	client := redis.NewClient(redisfast.ClientOptions("127.0.0.1:6379")) // or redisfast.FailFast(yourOptions)
	fast, err := redisfast.New(redisfast.Config{Client: client, Logger: logger})
	if err != nil {
		log.Fatal(err)
	}
	fp, _ := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "k1", Secret: []byte("a-secret-from-your-secret-store")})
	store, err := pgstore.New(pool, pgstore.Config{Fingerprinter: fp, FastPath: fast, Logger: logger})
	if err != nil {
		log.Fatal(err)
	}
	// idemq_fastpath_total{result}, and the breaker's state and transitions.
	prometheus.MustRegister(consumer.StoreCollector(store), fast.Collector())
	_ = store // hits, misses, errors: store.FastPathStats(); the breaker: fast.BreakerStats()
}
