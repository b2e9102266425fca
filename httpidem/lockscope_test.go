package httpidem

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
)

// Advisory locks are database-wide: one request in flight in one records
// table must not make the same tenant, principal, route and key in another
// records table (another schema: a second service, or tests side by side)
// answer 409 "in flight". Each table's request runs its handler once.
func TestSameKeyInAnotherRecordsTableIsNotInFlight(t *testing.T) {
	needDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	other := "httpidem_other_" + randomHex(6)
	stB, err := pgstore.New(dbPool, pgstore.Config{Schema: other, Fingerprinter: testFP})
	if err != nil {
		t.Fatal(err)
	}
	if err := stB.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = dbPool.Exec(context.Background(), "drop schema "+pgx.Identifier{other}.Sanitize()+" cascade")
	})
	stA, err := pgstore.New(dbPool, pgstore.Config{Schema: dbSchema, Fingerprinter: testFP})
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	server := func(st *pgstore.Store, block bool) *httptest.Server {
		mw, err := New(Config{Store: st, Fingerprinter: testFP, Principal: Header("X-User")})
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		mux.Handle("POST /orders", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			if block {
				close(started)
				<-release
			}
			w.WriteHeader(http.StatusCreated)
		})))
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		return srv
	}
	a, b := server(stA, true), server(stB, false)
	key := "lock-scope-" + randomHex(4)
	post := func(srv *httptest.Server) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"n":1}`))
		req.Header.Set(KeyHeader, key)
		req.Header.Set("X-User", "u-1")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	first := make(chan int, 1)
	go func() { code, _ := post(a); first <- code }()
	select {
	case <-started: // A's request holds its key's lock, in its transaction
	case <-ctx.Done():
		t.Fatal("the first request's handler never ran")
	}
	code, body := post(b)
	close(release)
	if code != http.StatusCreated {
		t.Fatalf("the same key in another records table: %d %s, want 201 (its own request, not in flight)", code, body)
	}
	if code := <-first; code != http.StatusCreated {
		t.Fatalf("the first request: %d, want 201", code)
	}
}
