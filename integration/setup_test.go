package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go"
	tckafka "github.com/testcontainers/testcontainers-go/modules/kafka"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"
)

const startHint = "start the services with `make services-up` and export them with `eval \"$(scripts/services.sh env)\"`"

// servicesRequired is true in CI: a missing service is then a failure, never
// a skip.
func servicesRequired() bool {
	return os.Getenv("CI") == "true" || os.Getenv("TEST_REQUIRE_BROKERS") != ""
}

var (
	dockerOnce sync.Once
	dockerOK   bool
)

func dockerAvailable() bool {
	dockerOnce.Do(func() {
		p, err := testcontainers.NewDockerProvider()
		if err != nil {
			return
		}
		defer p.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		dockerOK = p.Health(ctx) == nil
	})
	return dockerOK
}

// endpoint returns the value of env, or one started by start (once per test
// process) when Docker answers, or fails (CI) / skips the test.
func endpoint(t testing.TB, env, service string, once *sync.Once, cached *string, start func(ctx context.Context) (string, error)) string {
	t.Helper()
	if v := os.Getenv(env); v != "" {
		return v
	}
	if servicesRequired() {
		t.Fatalf("%s is not set and CI=true: %s is required; %s", env, service, startHint)
	}
	if start == nil || !dockerAvailable() {
		t.Skipf("%s is not set and no Docker engine answers: %s", env, startHint)
	}
	var err error
	once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		*cached, err = start(ctx)
	})
	if err != nil || *cached == "" {
		t.Fatalf("start %s with testcontainers: %v", service, err)
	}
	return *cached
}

var (
	pgOnce, kafkaOnce, redisOnce sync.Once
	pgDSN, kafkaAddr, redisAddr  string
)

func postgresDSN(t testing.TB) string {
	return endpoint(t, "TEST_POSTGRES_DSN", "PostgreSQL", &pgOnce, &pgDSN, func(ctx context.Context) (string, error) {
		ctr, err := tcpostgres.Run(ctx, "postgres:16", tcpostgres.WithDatabase("idemq"),
			tcpostgres.WithUsername("idemq"), tcpostgres.WithPassword("idemq"), tcpostgres.BasicWaitStrategies())
		if err != nil {
			return "", err
		}
		return ctr.ConnectionString(ctx, "sslmode=disable")
	})
}

func kafkaBrokers(t testing.TB) []string {
	return strings.Split(endpoint(t, "TEST_KAFKA_BROKERS", "Kafka", &kafkaOnce, &kafkaAddr, func(ctx context.Context) (string, error) {
		ctr, err := tckafka.Run(ctx, "confluentinc/confluent-local:7.5.0")
		if err != nil {
			return "", err
		}
		b, err := ctr.Brokers(ctx)
		return strings.Join(b, ","), err
	}), ",")
}

func redisAddress(t testing.TB) string {
	return endpoint(t, "TEST_REDIS_ADDR", "Redis", &redisOnce, &redisAddr, func(ctx context.Context) (string, error) {
		ctr, err := tcredis.Run(ctx, "redis:7")
		if err != nil {
			return "", err
		}
		s, err := ctr.ConnectionString(ctx)
		return strings.TrimPrefix(s, "redis://"), err
	})
}

// rocketmqNamesrv has no container fallback: testcontainers-go has no
// RocketMQ module.
func rocketmqNamesrv(t testing.TB) string {
	var once sync.Once
	var v string
	return endpoint(t, "TEST_ROCKETMQ_NAMESRV", "RocketMQ", &once, &v, nil)
}

var (
	poolOnce sync.Once
	pool     *pgxpool.Pool
	poolErr  error
)

// testPool is one pool shared by the package's tests.
func testPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	dsn := postgresDSN(t)
	poolOnce.Do(func() {
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			poolErr = err
			return
		}
		cfg.MaxConns = 50
		pool, poolErr = pgxpool.NewWithConfig(context.Background(), cfg)
		if poolErr == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			poolErr = pool.Ping(ctx)
		}
	})
	if poolErr != nil {
		t.Fatalf("postgres at %s: %v", dsn, poolErr)
	}
	return pool
}

func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// testKeys is the fingerprint key set of the tests.
func testFingerprinter(t testing.TB) *dedup.Fingerprinter {
	f, err := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "k1", Secret: []byte("integration-test-secret-0123456789")})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// env is one test's bundle: its own schema holding the idemq tables and the
// test's business tables, dropped at the end.
type env struct {
	t      testing.TB
	ctx    context.Context
	pool   *pgxpool.Pool
	schema string
	store  *dedup.Store
}

// setup creates a fresh schema with migrated idemq tables; cfg tweaks the
// store config (Schema and Fingerprinter are filled in).
func setup(t testing.TB, tweak func(*dedup.Config)) *env {
	t.Helper()
	p := testPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	schema := randomName("t_")
	cfg := dedup.Config{Schema: schema, Fingerprinter: testFingerprinter(t)}
	if tweak != nil {
		tweak(&cfg)
	}
	st, err := dedup.NewStore(p, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = p.Exec(context.Background(), "drop schema if exists "+pgx.Identifier{schema}.Sanitize()+" cascade")
	})
	return &env{t: t, ctx: ctx, pool: p, schema: schema, store: st}
}

// table returns a quoted table name in the test's schema.
func (e *env) table(name string) string { return pgx.Identifier{e.schema, name}.Sanitize() }

func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.pool.Exec(e.ctx, sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(e.ctx, sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (e *env) record(scope, messageID string) dedup.Record {
	e.t.Helper()
	r, err := e.store.Lookup(e.ctx, scope, messageID)
	if err != nil {
		e.t.Fatalf("record %s/%s: %v", scope, messageID, err)
	}
	return r
}

func (e *env) deadLetters(scope string) []dedup.DeadLetter {
	e.t.Helper()
	dl, err := e.store.DeadLetters(e.ctx, scope, 0, 1000)
	if err != nil {
		e.t.Fatal(err)
	}
	return dl
}
