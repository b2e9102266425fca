package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/dedup/storetest"
	"github.com/idemq/idemq/httpidem"
	"github.com/idemq/idemq/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// S28: idemq behind a connection pooler. PgBouncer in transaction mode, RDS
// Proxy and Supavisor do not keep a client on one server session, so pgx runs
// there without prepared statements (QueryExecModeExec or
// QueryExecModeSimpleProtocol). Every statement idemq sends must work in all
// five pgx query exec modes, directly and through a real PgBouncer.

// execModes are pgx's five query exec modes, by the name of the
// default_query_exec_mode connection-string option.
var execModes = []struct {
	name string
	mode pgx.QueryExecMode
}{
	{"cache_statement", pgx.QueryExecModeCacheStatement},
	{"cache_describe", pgx.QueryExecModeCacheDescribe},
	{"describe_exec", pgx.QueryExecModeDescribeExec},
	{"exec", pgx.QueryExecModeExec},
	{"simple_protocol", pgx.QueryExecModeSimpleProtocol},
}

// pgbouncerService is scripts/services.sh's PgBouncer (transaction mode,
// default_pool_size = 4) in front of the shared Postgres. There is no
// container fallback: without TEST_PGBOUNCER_DSN the tests that need it skip,
// or fail under CI=true.
var pgbouncerService = &service{env: "TEST_PGBOUNCER_DSN", name: "PgBouncer (transaction mode)"}

func pgbouncerDSN(t testing.TB) string {
	t.Helper()
	if v := os.Getenv(pgbouncerService.env); v != "" {
		return v
	}
	if servicesRequired() {
		t.Fatalf("%s is not set and CI=true: %s is required; %s", pgbouncerService.env, pgbouncerService.name, startHint)
	}
	t.Skipf("%s is not set: %s", pgbouncerService.env, startHint)
	return ""
}

var (
	modePoolsMu sync.Mutex
	modePools   = map[string]*pgxpool.Pool{}
)

// modePool is a pool on dsn whose connections run in mode, at most maxConns
// of them, shared by the tests of the process (closed at its end).
func modePool(t testing.TB, dsn string, mode pgx.QueryExecMode, maxConns int32) *pgxpool.Pool {
	t.Helper()
	modePoolsMu.Lock()
	defer modePoolsMu.Unlock()
	key := dsn + "|" + mode.String()
	if p := modePools[key]; p != nil {
		return p
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.DefaultQueryExecMode = mode
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Ping(ctx); err != nil {
		t.Fatalf("%s pool at %s: %v", mode, dsn, err)
	}
	modePools[key] = p
	return p
}

// setupOn is setup with the store on pool: the schema is migrated normally,
// on direct (a pool straight to the Postgres that pool reaches), then the
// store runs on pool.
func setupOn(t testing.TB, direct, pool *pgxpool.Pool, tweak func(*pgstore.Config)) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	schema := randomName("t_")
	cfg := pgstore.Config{Schema: schema, Fingerprinter: testFingerprinter(t)}
	if tweak != nil {
		tweak(&cfg)
	}
	migrateCfg := cfg
	migrateCfg.TransactionPooler = false // Migrate needs a session
	ms, err := pgstore.New(direct, migrateCfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ms.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = direct.Exec(context.Background(), "drop schema if exists "+pgx.Identifier{schema}.Sanitize()+" cascade")
	})
	st, err := pgstore.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, ctx: ctx, pool: pool, schema: schema, store: st}
}

// pgbouncerBackend is a pool straight to the Postgres behind the PgBouncer
// (TEST_PGBOUNCER_BACKEND_DSN; TEST_POSTGRES_DSN when unset).
func pgbouncerBackend(t testing.TB) *pgxpool.Pool {
	t.Helper()
	dsn := os.Getenv("TEST_PGBOUNCER_BACKEND_DSN")
	if dsn == "" {
		return testPool(t)
	}
	return modePool(t, dsn, pgx.QueryExecModeCacheStatement, 10)
}

// storeModes are the Postgres store's three modes, as the conformance
// suite drives them.
var storeModes = []struct {
	name string
	mode func(*pgstore.Store) storetest.Mode
}{
	{"atomic", func(s *pgstore.Store) storetest.Mode { return storetest.Atomic(s) }},
	{"batched", func(s *pgstore.Store) storetest.Mode { return storetest.Batched(s) }},
	{"lease", func(s *pgstore.Store) storetest.Mode { return storetest.Leased(s, dedup.LeaseOptions{}) }},
	{"batchset", batchSetMode},
}

// TestStoreConformancePostgresExecModes runs the store conformance suite in
// each of the store's four modes (atomic, batched, set-based BatchHandler,
// lease) with the store's pool in each of pgx's five query exec modes
// straight to Postgres, and through PgBouncer in transaction mode (ten
// clients, Config.TransactionPooler) in the exec and simple_protocol modes.
func TestStoreConformancePostgresExecModes(t *testing.T) {
	t.Parallel()
	for _, em := range execModes {
		for _, sm := range storeModes {
			t.Run("postgres/"+em.name+"/"+sm.name, func(t *testing.T) {
				t.Parallel()
				pool := modePool(t, postgresDSN(t), em.mode, 10)
				storetest.Run(t, pgFeatures, func(t *testing.T) storetest.Harness {
					return pgHarnessFor(setupOn(t, testPool(t), pool, func(c *pgstore.Config) { c.MaxAttempts = storeMaxAttempts }), sm.mode)
				})
			})
		}
	}
	for _, em := range execModes[3:] { // exec, simple_protocol
		for _, sm := range storeModes {
			t.Run("pgbouncer/"+em.name+"/"+sm.name, func(t *testing.T) {
				t.Parallel()
				pool := modePool(t, pgbouncerDSN(t), em.mode, 10)
				storetest.Run(t, pgFeatures, func(t *testing.T) storetest.Harness {
					return pgHarnessFor(setupOn(t, pgbouncerBackend(t), pool, func(c *pgstore.Config) {
						c.MaxAttempts = storeMaxAttempts
						c.TransactionPooler = true
					}), sm.mode)
				})
			})
		}
	}
}

// s28Outcome is what one pool did with S28's case list: compared between
// pools, it must be the same everywhere.
type s28Outcome struct {
	Calls       map[string]int // handler runs per message ID (consumer, batch, lease)
	DeadLetters []string       // "message ID: reason", sorted
	Batch       []string       // the batch's outcomes, in order
	Lease       string         // the lease-mode message's outcome
	HTTP        []string       // "status replayed" of the request and its replay
	HTTPCalls   int            // HTTP handler runs
	Relayed     int            // outbox rows published
}

// runS28 runs S28's case list with every idemq component on pool: the Kafka
// consumer (consumer.Run, atomic mode) with a new message, its duplicate, a
// conflict and a message failing twice with MaxAttempts 2; a batch of three
// (one a duplicate); a lease-mode message; an HTTP request and its replay;
// an outbox row relayed. pooled is true for a pool through a transaction
// pooler (the stores then run with TransactionPooler).
func runS28(t *testing.T, direct, pool *pgxpool.Pool, pooled bool) s28Outcome {
	e := setupOn(t, direct, pool, func(c *pgstore.Config) { c.MaxAttempts = 2; c.TransactionPooler = pooled })
	out := s28Outcome{Calls: map[string]int{}}
	var mu sync.Mutex
	count := func(id string) { mu.Lock(); out.Calls[id]++; mu.Unlock() }
	calls := func(id string) int { mu.Lock(); defer mu.Unlock(); return out.Calls[id] }
	apply := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		count(m.Identity.MessageID)
		if strings.HasPrefix(m.Identity.MessageID, "m-poison") {
			return errors.New("poison: always fails")
		}
		_, err := tx.Exec(ctx, `select $1::text, $2::bytea`, m.Identity.MessageID, m.Payload)
		return err
	}

	// The Kafka consumer.
	topic := newTopic(t, 1)
	produce(t, topic,
		kmsg{id: "m-new", payload: "a:100", headers: map[string]string{"bk": "a"}},
		kmsg{id: "m-new", payload: "a:100", headers: map[string]string{"bk": "a"}}, // its duplicate
		kmsg{id: "m-conflict", payload: "a:999", headers: map[string]string{"bk": "a"}},
		kmsg{id: "m-poison", payload: "p:1", headers: map[string]string{"bk": "p"}},
		kmsg{id: "m-last", payload: "z:1", headers: map[string]string{"bk": "z"}},
	)
	group := randomName("s28-")
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{Reader: readerConfig(t, group, topic)})
	if err != nil {
		t.Fatal(err)
	}
	run := startConsumer(t, consumer.Config{Scope: group, Store: e.store, Handler: apply,
		BusinessKey: func(m *dedup.Message) (string, error) { return m.Headers["bk"], nil }}, src)
	waitCaughtUp(t, group, topic)
	run.stop(t)
	if calls("m-last") != 1 {
		t.Fatalf("m-last ran %d times", calls("m-last"))
	}

	ctx := e.ctx
	msg := func(id, bk, payload string) *dedup.Message {
		ident, err := dedup.NewIdentity(group, id, "", bk)
		if err != nil {
			t.Fatal(err)
		}
		return &dedup.Message{Identity: ident, Topic: topic, Payload: []byte(payload), Headers: map[string]string{"bk": bk}}
	}
	// A batch of three, one a duplicate (m-new).
	res, err := e.store.ProcessBatch(ctx, []*dedup.Message{msg("m-b1", "b1", "b1:1"), msg("m-new", "a", "a:100"), msg("m-b2", "b2", "b2:1")}, apply)
	if err != nil {
		t.Fatalf("ProcessBatch: %v", err)
	}
	for _, r := range res {
		out.Batch = append(out.Batch, string(r.Outcome))
	}
	// A lease-mode message.
	lr, err := e.store.ProcessLeased(ctx, msg("m-lease", "l", "l:1"), func(_ context.Context, m *dedup.Message) error {
		count(m.Identity.MessageID)
		return nil
	}, dedup.LeaseOptions{})
	if err != nil {
		t.Fatalf("ProcessLeased: %v", err)
	}
	out.Lease = string(lr.Outcome)

	// Dead letters of the consumer's scope.
	dls, err := e.store.DeadLetters(ctx, group, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dls {
		out.DeadLetters = append(out.DeadLetters, d.MessageID+": "+d.Reason)
	}
	sort.Strings(out.DeadLetters)

	// An HTTP request and its replay.
	mw, err := httpidem.New(httpidem.Config{Store: e.store, Fingerprinter: testFingerprinter(t), Principal: httpidem.Header("X-User")})
	if err != nil {
		t.Fatal(err)
	}
	var httpCalls atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpCalls.Add(1)
		if _, err := httpidem.FromContext(r.Context()).Exec(r.Context(), `select 1`); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"pay_1"}`)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for range 2 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":"10"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "s28-key-1")
		req.Header.Set("X-User", "u1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("HTTP %d: %s", resp.StatusCode, body)
		}
		out.HTTP = append(out.HTTP, fmt.Sprintf("%d replayed=%s", resp.StatusCode, resp.Header.Get("Idempotent-Replayed")))
	}
	out.HTTPCalls = int(httpCalls.Load())

	// An outbox row relayed: migrated normally (direct pool), then added and
	// relayed through pool.
	dob, err := outbox.New(direct, outbox.Config{Schema: e.schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := dob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(pool, outbox.Config{Schema: e.schema, TransactionPooler: pooled})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Add(ctx, tx, outbox.Message{Topic: "s28", Key: []byte("k"), Payload: []byte("row"), Headers: map[string]string{"h": "v"}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var relayed atomic.Int64
	cfg := fastRelay("s28")
	cfg.DisableListen = pooled
	r, err := outbox.NewRelay(ob, outbox.PublisherFunc(func(_ context.Context, b []outbox.Envelope) error {
		relayed.Add(int64(len(b)))
		return nil
	}), cfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	eventually(t, 60*time.Second, "the outbox row to be published", func() bool {
		var n int
		err := direct.QueryRow(ctx, `select count(*) from `+e.table("outbox")+` where published_at is not null`).Scan(&n)
		return err == nil && n == 1
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("relay: %v", err)
	}
	out.Relayed = int(relayed.Load())
	return out
}

// TestS28BehindAPooler runs S28's case list on pools in each of pgx's five
// query exec modes straight to Postgres, and through the PgBouncer of
// scripts/services.sh (transaction mode, default_pool_size = 4, ten
// clients) in the modes that work there (exec, simple_protocol). Every pool
// must give the same outcomes and dead letters, and finish: a poison message
// that could not be dead-lettered would be retried for ever, and the
// consumer would never catch up.
func TestS28BehindAPooler(t *testing.T) {
	t.Parallel()
	want := s28Outcome{
		Calls:       map[string]int{"m-new": 1, "m-poison": 2, "m-last": 1, "m-b1": 1, "m-b2": 1, "m-lease": 1},
		DeadLetters: []string{"m-conflict: " + dedup.ReasonPayloadConflict, "m-poison: " + dedup.ReasonAttemptsExhausted},
		Batch:       []string{"processed", "duplicate", "processed"},
		Lease:       "processed",
		HTTP:        []string{"201 replayed=", "201 replayed=true"},
		HTTPCalls:   1,
		Relayed:     1,
	}
	type pool struct {
		name   string
		dsn    func(testing.TB) string
		direct func(testing.TB) *pgxpool.Pool
		mode   pgx.QueryExecMode
		pooled bool
	}
	var pools []pool
	for _, em := range execModes {
		pools = append(pools, pool{"postgres/" + em.name, postgresDSN, testPool, em.mode, false})
	}
	pools = append(pools,
		pool{"pgbouncer/exec", pgbouncerDSN, pgbouncerBackend, pgx.QueryExecModeExec, true},
		pool{"pgbouncer/simple_protocol", pgbouncerDSN, pgbouncerBackend, pgx.QueryExecModeSimpleProtocol, true})
	for _, p := range pools {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			got := runS28(t, p.direct(t), modePool(t, p.dsn(t), p.mode, 10), p.pooled)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("outcomes:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

// The CLI behind a pooler: the dead-letter verbs (list, show, export,
// redrive, purge) through PgBouncer in transaction mode, with the
// connection string choosing the exec mode (default_query_exec_mode).
func TestCLIDeadLetterVerbsBehindPgBouncer(t *testing.T) {
	t.Parallel()
	bin := buildExample(t, "github.com/idemq/idemq/cmd/idemq")
	dsn := pgbouncerDSN(t)
	for _, mode := range []string{"exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			direct := pgbouncerBackend(t)
			e := setupOn(t, direct, direct, func(c *pgstore.Config) { c.MaxAttempts = 1 })
			for i := range cliDLs {
				res, err := e.store.Process(e.ctx, cliDLMessage(t, i), func(context.Context, pgx.Tx, *dedup.Message) error { return cliDLError(i) })
				if err != nil || res.Outcome != dedup.OutcomeDeadLetter {
					t.Fatalf("%s: %+v %v, want a dead letter", cliDLs[i].id, res, err)
				}
			}
			c := dlCLI{t: t, bin: bin, store: []string{"--dsn", dsn + "&default_query_exec_mode=" + mode, "--schema", e.schema}}
			checkDLVerbsCommon(t, c, func(scope, id string) dedup.Status { return e.record(scope, id).Status })
		})
	}
}
