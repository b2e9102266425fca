package redisfast_test

import (
	"log"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisfast"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// Put Redis in front of Postgres for duplicates of succeeded messages.
// (Compiled, not run: it needs Redis and Postgres.)
func ExampleNew() {
	var pool *pgxpool.Pool // your pool
	fast, err := redisfast.New(redisfast.Config{Client: redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})})
	if err != nil {
		log.Fatal(err)
	}
	fp, _ := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "k1", Secret: []byte("a-secret-from-your-secret-store")})
	store, err := dedup.NewStore(pool, dedup.Config{Fingerprinter: fp, FastPath: fast})
	if err != nil {
		log.Fatal(err)
	}
	_ = store // hits, misses, errors: store.FastPathStats()
}
