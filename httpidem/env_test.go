package httpidem

// The package tests run the middleware against real Postgres
// (TEST_POSTGRES_DSN): TestMain migrates a schema of its own once per test
// binary (a random name, dropped at the end); each test gets a tenant of its
// own (so its scopes and its cap are its own) and a schema for its business
// tables, and runs in parallel. Without TEST_POSTGRES_DSN they skip, saying
// how to start Postgres, except under CI=true, where they fail.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	dbPool     *pgxpool.Pool
	dbSchema   string
	dbSetupErr error
	testFP     *dedup.Fingerprinter
)

const startPostgres = "TEST_POSTGRES_DSN is not set: start Postgres with `make services-up` " +
	"(or `bash scripts/services.sh up`), then `eval \"$(bash scripts/services.sh env)\"` and run the tests again"

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	var err error
	testFP, err = dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "k1", Secret: []byte("0123456789abcdef0123456789abcdef")})
	if err != nil {
		panic(err)
	}
	dsn := os.Getenv("TEST_POSTGRES_DSN")
	if dsn == "" {
		return m.Run()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		dbSetupErr = err
		return m.Run()
	}
	cfg.MaxConns = 30 // 20 concurrent copies of a request, each with a connection
	if dbPool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		dbSetupErr = err
		return m.Run()
	}
	defer dbPool.Close()
	dbSchema = "httpidem_test_" + randomHex(6)
	st, err := pgstore.New(dbPool, pgstore.Config{Schema: dbSchema, Fingerprinter: testFP})
	if err == nil {
		err = st.Migrate(ctx)
	}
	if err != nil {
		dbSetupErr = fmt.Errorf("migrate schema %s: %w", dbSchema, err)
		return m.Run()
	}
	defer func() {
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		_, _ = dbPool.Exec(dctx, "drop schema "+pgx.Identifier{dbSchema}.Sanitize()+" cascade")
	}()
	return m.Run()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func needDB(t testing.TB) {
	t.Helper()
	if dbPool != nil && dbSetupErr == nil {
		return
	}
	switch {
	case dbSetupErr != nil:
		t.Fatalf("TEST_POSTGRES_DSN is set, but the test schema could not be prepared: %v", dbSetupErr)
	case os.Getenv("CI") == "true":
		t.Fatal(startPostgres + " (CI=true: these tests must run, not skip)")
	default:
		t.Skip(startPostgres)
	}
}

// env is one test's bundle: a payments API behind the middleware.
type env struct {
	t      testing.TB
	ctx    context.Context
	store  *pgstore.Store
	mw     *Middleware
	srv    *httptest.Server
	biz    string // business schema
	tenant string
	calls  atomic.Int64 // payment handler executions
	// before, when set, runs at the start of the payment handler with the
	// attempt; a non-zero status is answered instead of the payment.
	before func(r *http.Request, attempt int) int
	// after, when set, runs after the payment row was inserted.
	after func(r *http.Request)
	// provider counts the charges a fake payment provider received, by
	// downstream idempotency key (lease mode).
	providerMu sync.Mutex
	provider   map[string]int
	// current is the middleware the server runs (swapped by tests that
	// change its configuration between requests).
	current atomic.Pointer[Middleware]
}

// wrap runs h under the current middleware.
func (e *env) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.current.Load().Handler(h).ServeHTTP(w, r)
	})
}

// newEnv builds the env with tweak applied to the middleware's Config.
func newEnv(t testing.TB, tweak func(*Config)) *env {
	t.Helper()
	return newEnvStore(t, nil, tweak)
}

// newEnvStore is newEnv with storeTweak applied to the store's Config.
func newEnvStore(t testing.TB, storeTweak func(*pgstore.Config), tweak func(*Config)) *env {
	t.Helper()
	needDB(t)
	if tt, ok := t.(*testing.T); ok {
		tt.Parallel()
	}
	return buildEnv(t, storeTweak, tweak)
}

// newSerialEnv is newEnv for a test that must not run in parallel (it
// changes package state).
func newSerialEnv(t testing.TB, tweak func(*Config)) *env {
	t.Helper()
	needDB(t)
	return buildEnv(t, nil, tweak)
}

func buildEnv(t testing.TB, storeTweak func(*pgstore.Config), tweak func(*Config)) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	e := &env{t: t, ctx: ctx, biz: "httpidem_biz_" + randomHex(6), tenant: "t-" + randomHex(4)}
	e.store = e.newStore(storeTweak)
	e.exec(`create schema ` + e.biz)
	e.exec(`create table ` + e.biz + `.payments (id text primary key, ref text unique, amount text not null)`)
	e.exec(`create table ` + e.biz + `.refunds (id text primary key, amount text not null)`)
	t.Cleanup(func() {
		_, _ = dbPool.Exec(context.Background(), "drop schema "+e.biz+" cascade")
	})
	e.mw = e.newMiddleware(tweak)
	e.current.Store(e.mw)
	mux := http.NewServeMux()
	mux.Handle("POST /payments", e.wrap(http.HandlerFunc(e.createPayment)))
	mux.Handle("POST /refunds", e.wrap(http.HandlerFunc(e.createRefund)))
	mux.Handle("POST /charges", e.wrap(http.HandlerFunc(e.createCharge)))
	e.srv = httptest.NewServer(mux)
	t.Cleanup(e.srv.Close)
	return e
}

func (e *env) newStore(tweak func(*pgstore.Config)) *pgstore.Store {
	cfg := pgstore.Config{Schema: dbSchema, Fingerprinter: testFP, MaxAttempts: 5}
	if tweak != nil {
		tweak(&cfg)
	}
	st, err := pgstore.New(dbPool, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return st
}

func (e *env) newMiddleware(tweak func(*Config)) *Middleware {
	cfg := Config{
		Store: e.store, Fingerprinter: testFP,
		Tenant:    func(*http.Request) (string, error) { return e.tenant, nil },
		Principal: Header("X-User"),
	}
	if tweak != nil {
		tweak(&cfg)
	}
	mw, err := New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return mw
}

func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := dbPool.Exec(e.ctx, sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := dbPool.QueryRow(e.ctx, sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (e *env) payments() int { return e.count(`select count(*) from ` + e.biz + `.payments`) }

type paymentReq struct {
	Amount   string `json:"amount"`
	Currency string `json:"currency,omitempty"`
	Ref      string `json:"ref,omitempty"`
}

func (e *env) createPayment(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	info, _ := InfoFromContext(ctx)
	if e.before != nil {
		if st := e.before(r, info.Attempt); st != 0 {
			http.Error(w, "try again", st)
			return
		}
	}
	e.calls.Add(1)
	var p paymentReq
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if p.Amount == "" {
		WriteProblem(w, &Problem{Type: "urn:test:invalid", Title: "amount required", Status: http.StatusBadRequest})
		return
	}
	tx := FromContext(ctx)
	id := "pay_" + randomHex(4)
	var ref *string
	if p.Ref != "" {
		ref = &p.Ref
	}
	if _, err := tx.Exec(ctx, `insert into `+e.biz+`.payments (id, ref, amount) values ($1, $2, $3)`, id, ref, p.Amount); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" {
			http.Error(w, "duplicate payment reference", http.StatusConflict)
			return
		}
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if e.after != nil {
		e.after(r)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/payments/"+id)
	w.Header().Set(ResourceIDHeader, id)
	w.Header().Set("X-Not-Stored", "1")
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"id":%q,"amount":%q,"attempt":%d}`, id, p.Amount, info.Attempt)
}

// createCharge is a lease-mode handler: no transaction, a call to a
// provider with the request's downstream key.
func (e *env) createCharge(w http.ResponseWriter, r *http.Request) {
	info, _ := InfoFromContext(r.Context())
	if e.before != nil {
		if st := e.before(r, info.Attempt); st != 0 {
			http.Error(w, "try again", st)
			return
		}
	}
	if FromContext(r.Context()) != nil {
		http.Error(w, "lease mode has a transaction", http.StatusInternalServerError)
		return
	}
	key, _ := KeyFromContext(r.Context())
	e.calls.Add(1)
	e.providerMu.Lock()
	if e.provider == nil {
		e.provider = map[string]int{}
	}
	e.provider[key]++
	e.providerMu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"charge":%q,"attempt":%d}`, key, info.Attempt)
}

func (e *env) createRefund(w http.ResponseWriter, r *http.Request) {
	tx := FromContext(r.Context())
	id := "ref_" + randomHex(4)
	if _, err := tx.Exec(r.Context(), `insert into `+e.biz+`.refunds (id, amount) values ($1, '1')`, id); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"id":%q}`, id)
}

// resp is a response read whole.
type resp struct {
	status int
	header http.Header
	body   []byte
}

func (r resp) replayed() bool { return r.header.Get(ReplayHeader) == "true" }

func (r resp) problem(t testing.TB) Problem {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != ProblemContentType {
		t.Fatalf("status %d: Content-Type %q, want %s; body %s", r.status, ct, ProblemContentType, r.body)
	}
	var p Problem
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("problem body %s: %v", r.body, err)
	}
	if p.Status != r.status {
		t.Fatalf("problem status %d, response status %d", p.Status, r.status)
	}
	return p
}

// post sends a request; key "" sends no Idempotency-Key header.
func (e *env) post(path, user, key, body string) resp {
	e.t.Helper()
	return e.do(e.ctx, path, user, key, body, nil)
}

func (e *env) do(ctx context.Context, path, user, key, body string, hdr http.Header) resp {
	e.t.Helper()
	r, err := e.send(ctx, path, user, key, body, hdr)
	if err != nil {
		e.t.Fatalf("POST %s: %v", path, err)
	}
	return r
}

func (e *env) send(ctx context.Context, path, user, key, body string, hdr http.Header) (resp, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		return resp{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User", user)
	if key != "" {
		req.Header.Set(KeyHeader, key)
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		return resp{}, err
	}
	defer func() { _ = res.Body.Close() }()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return resp{}, err
	}
	return resp{status: res.StatusCode, header: res.Header, body: b}, nil
}

// record is the consumption record of (user, route, key) as stored.
func (e *env) record(user, route, key string) (status string, attempts int) {
	e.t.Helper()
	scope := Scope(e.tenant, user, http.MethodPost, route)
	err := dbPool.QueryRow(e.ctx, `select status, attempts from `+pgx.Identifier{dbSchema, "consumption_records"}.Sanitize()+
		` where scope = $1 and message_id = $2`, scope, key).Scan(&status, &attempts)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return status, attempts
}

func (e *env) httpTable() string {
	return pgx.Identifier{dbSchema, "consumption_records_http"}.Sanitize()
}

func mustEqual(t testing.TB, what string, got, want any) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

func bodyEqual(a, b []byte) bool { return bytes.Equal(a, b) }
