package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/dedup/redisfast"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// statementLog is a pgx QueryTracer and BatchTracer recording every
// statement its connections send, pipelined ones included.
type statementLog struct {
	mu  sync.Mutex
	sql []string
}

func (l *statementLog) add(sql string) {
	l.mu.Lock()
	l.sql = append(l.sql, sql)
	l.mu.Unlock()
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, q pgx.TraceQueryStartData) context.Context {
	l.add(q.SQL)
	return ctx
}
func (l *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (l *statementLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (l *statementLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, q pgx.TraceBatchQueryData) {
	// A set-based batch claim (pgstore records_claim_set) claims every
	// message its $2 array holds in one statement: it is logged once per
	// message, so that claims counts the messages claimed in either shape.
	if ids, ok := setClaimIDs(q); ok {
		for range ids {
			l.add(q.SQL)
		}
		return
	}
	l.add(q.SQL)
}

// setClaimIDs are the message IDs of a set-based batch claim statement.
func setClaimIDs(q pgx.TraceBatchQueryData) ([]string, bool) {
	if !strings.Contains(q.SQL, "with found as") || !strings.Contains(q.SQL, "unnest(") || len(q.Args) < 2 {
		return nil, false
	}
	ids, ok := q.Args[1].([]string)
	return ids, ok
}
func (l *statementLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// take returns the statements recorded since the last take, and forgets
// them.
func (l *statementLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.sql
	l.sql = nil
	return out
}

// redisCalls is a go-redis hook counting the round trips that read or
// write fast-path keys (single commands and pipelines alike; a new
// connection's handshake is not counted).
type redisCalls struct{ n atomic.Int64 }

func fastPathCommand(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "get", "mget", "set":
		return true
	}
	return false
}

func (c *redisCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *redisCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if fastPathCommand(cmd) {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (c *redisCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && fastPathCommand(cmds[0]) {
			c.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// claims counts the record claims among stmts (the record_claim statement
// inserts into the records table behind a "found" CTE; so does the set-based
// claim of a batch, logged once per message it claims).
func claims(stmts []string) int {
	n := 0
	for _, s := range stmts {
		if strings.Contains(s, "with found as") {
			n++
		}
	}
	return n
}

// loggedStore is a second store on e's schema over a pool of its own whose
// every statement is logged, with fast path fast.
func loggedStore(t *testing.T, e *env, fast dedup.FastPath) (*pgstore.Store, *statementLog) {
	t.Helper()
	log := &statementLog{}
	cfg, err := pgxpool.ParseConfig(postgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns, cfg.ConnConfig.Tracer = 2, log
	p, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	st, err := pgstore.New(p, pgstore.Config{Schema: e.schema, Fingerprinter: testFingerprinter(t), FastPath: fast})
	if err != nil {
		t.Fatal(err)
	}
	return st, log
}

// A batch with a Redis fast path asks Redis once for the whole batch,
// before any transaction: a batch of hits only makes no Postgres round trip
// at all (not even BEGIN), and a mixed batch claims only the misses in
// Postgres, the hits answered as duplicates in order. A conflicting payload
// is no hit (it reaches Postgres and its dead-letter path), and with Redis
// down the batch falls back to Postgres with the same results.
func TestRedisFastPathBatchSkipsPostgres(t *testing.T) {
	t.Parallel()
	client := redisClient(t)
	calls := &redisCalls{}
	client.AddHook(calls)
	e, fast := setupFast(t, client)
	s := &spy{table: e.paymentsTable()}
	st, log := loggedStore(t, e, fast)
	batch := func(ids ...int) []*dedup.Message {
		var b []*dedup.Message
		for _, i := range ids {
			b = append(b, msg(t, "payments", fmt.Sprintf("m-%d", i), fmt.Sprintf("pay-%d", i), "40.00"))
		}
		return b
	}
	run := func(what string, b []*dedup.Message, want ...dedup.Outcome) {
		t.Helper()
		res, err := st.ProcessBatch(e.ctx, b, s.handle)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		for i, w := range want {
			if res[i].Outcome != w {
				t.Fatalf("%s: result %d = %+v, want %q", what, i, res[i], w)
			}
		}
	}
	processed, dup := dedup.OutcomeProcessed, dedup.OutcomeDuplicate

	run("new", batch(0, 1, 2, 3, 4), processed, processed, processed, processed, processed)
	if n := claims(log.take()); n != 5 {
		t.Fatalf("new batch: %d claims, want 5", n)
	}
	if n := calls.n.Swap(0); n != 2 {
		t.Fatalf("new batch: %d Redis round trips, want 2 (one lookup, one remember)", n)
	}
	hits0, _, _ := st.FastPathStats()

	run("all hits", batch(0, 1, 2, 3, 4, 2), dup, dup, dup, dup, dup, dup)
	if stmts := log.take(); len(stmts) != 0 {
		t.Fatalf("a batch of fast-path hits sent %d statements to Postgres, want 0, first: %q", len(stmts), stmts[0])
	}
	if hits, _, errs := st.FastPathStats(); hits-hits0 != 6 || errs != 0 {
		t.Fatalf("fast path hits %d errors %d, want 6 and 0", hits-hits0, errs)
	}
	if n := calls.n.Swap(0); n != 1 {
		t.Fatalf("all-hit batch: %d Redis round trips, want 1", n)
	}

	run("mixed", batch(0, 5, 1, 6, 2), dup, processed, dup, processed, dup)
	if n := claims(log.take()); n != 2 {
		t.Fatalf("mixed batch: %d claims, want 2 (the misses only)", n)
	}
	if s.calls.Load() != 7 {
		t.Fatalf("handler calls = %d, want 7", s.calls.Load())
	}

	// A conflicting payload under a remembered identity is no hit.
	conflict := batch(3, 7)
	conflict[0].Payload = []byte("45.00")
	run("conflict", conflict, dedup.OutcomeConflict, processed)
	if n := claims(log.take()); n != 2 || len(e.deadLetters("payments")) != 1 {
		t.Fatalf("conflict batch: %d claims, %d dead letters, want 2 and 1", n, len(e.deadLetters("payments")))
	}

	// Redis down (nothing listens on the port): Postgres answers.
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	downClient := redis.NewClient(redisfast.ClientOptions("127.0.0.1:" + strconv.Itoa(port)))
	t.Cleanup(func() { _ = downClient.Close() })
	down, err := redisfast.New(redisfast.Config{Client: downClient, Prefix: randomName("fp-")})
	if err != nil {
		t.Fatal(err)
	}
	dst, dlog := loggedStore(t, e, down)
	res, err := dst.ProcessBatch(e.ctx, batch(0, 1, 8), s.handle)
	if err != nil || res[0].Outcome != dup || res[1].Outcome != dup || res[2].Outcome != processed {
		t.Fatalf("redis down: %+v %v", res, err)
	}
	if n := claims(dlog.take()); n != 3 {
		t.Fatalf("redis down: %d claims, want 3", n)
	}
	if _, _, errs := dst.FastPathStats(); errs == 0 {
		t.Fatal("redis down: no fast-path error counted")
	}
}
