package httpidem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/httpidem"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// newStore is a store on a pool that connects lazily: nothing here touches
// the database.
func newStore() (*pgstore.Store, *dedup.Fingerprinter) {
	fp, _ := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "k1", Secret: []byte("a secret of 16+ bytes")})
	pool, _ := pgxpool.New(context.Background(), "postgres://app@127.0.0.1:5432/app")
	store, err := pgstore.New(pool, pgstore.Config{Fingerprinter: fp})
	if err != nil {
		panic(err)
	}
	return store, fp
}

// accountKey is where the example's authentication middleware puts the
// account it verified.
type accountKey struct{}

// accountID is the account the authentication middleware verified, "" when
// the request had no valid credentials.
func accountID(ctx context.Context) string {
	id, _ := ctx.Value(accountKey{}).(string)
	return id
}

// A middleware on a ServeMux route: the handler writes through the
// record's transaction, and its response is sent after COMMIT. The
// principal comes from the verified credentials; a request without one is
// refused 401 before anything is recorded, never put in a key space shared
// by every anonymous caller.
func ExampleNew() {
	store, fp := newStore()
	mw, err := httpidem.New(httpidem.Config{
		Store:         store, // store.Migrate(ctx) at start creates the tables
		Fingerprinter: fp,
		// Who calls, from the verified credentials (your auth middleware
		// runs first). Blank: 401, never a key space shared by every caller.
		Principal:    func(r *http.Request) (string, error) { return accountID(r.Context()), nil },
		APIVersion:   httpidem.Header("Api-Version"),
		IgnoreFields: []string{"traceId"},
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx := httpidem.FromContext(r.Context()) // business rows commit with the record
		if _, err := tx.Exec(r.Context(), `insert into payments (id, amount) values ($1, $2)`, "pay_1", "30.00"); err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable) // 5xx: the retry runs again
			return
		}
		w.Header().Set(httpidem.ResourceIDHeader, "pay_1")
		w.WriteHeader(http.StatusCreated)
	})))
	c := mw.Config()
	fmt.Println(c.Methods, c.ConflictStatus, c.MaxUnfinished, c.RetryWindow, c.MaxBodyBytes)

	// No credentials: refused before the store is asked.
	req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":"30.00"}`))
	req.Header.Set(httpidem.KeyHeader, "pay-7")
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, req)
	fmt.Println(w.Code, strings.Contains(w.Body.String(), httpidem.TypeUnauthenticated))

	// Errors name the field; a retention shorter than the retry window is refused.
	_, err = httpidem.New(httpidem.Config{Store: store, Fingerprinter: fp, Principal: httpidem.Header("X-User"), RetryWindow: 30 * 24 * time.Hour})
	fmt.Println(errors.Is(err, dedup.ErrRetentionTooShort))
	fmt.Println(err)
	// Output:
	// [POST PATCH] 422 100 24h0m0s 1048576
	// 401 true
	// true
	// idemq: retention shorter than the broker's redelivery horizon: httpidem: Store SucceededRetention 168h0m0s < RetryWindow 720h0m0s: a retry after the record was purged would run the handler again
}

// Requests without a valid Idempotency-Key are refused with RFC 9457
// problem bodies before anything is recorded.
func ExampleValidateKey() {
	for _, k := range []string{"8e03978e-40d5-43e8-bc93-6894a57f9324", "", strings.Repeat("k", 256), "naïve", "a\tb"} {
		fmt.Println(httpidem.ValidateKey(k) == nil)
	}
	store, fp := newStore()
	mw, _ := httpidem.New(httpidem.Config{Store: store, Fingerprinter: fp, Principal: httpidem.Header("X-User")})
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handler(http.NotFoundHandler()))
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{}`)))
	fmt.Println(w.Code, w.Header().Get("Content-Type"))
	fmt.Print(w.Body.String())
	// Output:
	// true
	// false
	// false
	// false
	// false
	// 400 application/problem+json
	// {"type":"urn:idemq:problem:idempotency-key-missing","title":"Idempotency-Key missing","status":400,"detail":"POST requests on this route require an Idempotency-Key header"}
}

// Scope is the record's scope of a request, for `idemq inspect`; its parts
// are escaped so that two identities never share one.
func ExampleScope() {
	fmt.Println(httpidem.Scope("acme", "alice", "POST", "POST /payments"))
	fmt.Println(httpidem.Scope("a|b", "c", "POST", "/x") != httpidem.Scope("a", "b|c", "POST", "/x"))
	// Output:
	// http|acme|alice|POST|POST /payments
	// true
}

// Metrics are a collector per middleware; const labels tell several apart
// in one registry.
func ExampleNewMetrics() {
	reg := prometheus.NewRegistry()
	payments := httpidem.NewMetrics(prometheus.Labels{"api": "payments"})
	refunds := httpidem.NewMetrics(prometheus.Labels{"api": "refunds"})
	reg.MustRegister(payments, refunds)
	families, _ := reg.Gather()
	fmt.Println(families[0].GetName(), len(families[0].GetMetric()))
	fmt.Println(payments.Count(httpidem.OutcomeReplayed))
	// Output:
	// idemq_http_requests_total 18
	// 0
}

// A handler that calls a payment provider passes the request's downstream
// key, the same on every retry of the request and different across
// principals and routes, so the provider deduplicates too.
func ExampleKeyFromContext() {
	handler := func(_ http.ResponseWriter, r *http.Request) {
		key, _ := httpidem.KeyFromContext(r.Context())
		req, _ := http.NewRequestWithContext(r.Context(), http.MethodPost, "https://provider.example/charges", nil)
		req.Header.Set("Idempotency-Key", key)
		// … send req; a 5xx answer leaves the record retryable.
	}
	_ = handler
	fmt.Println(httpidem.Info{Scope: "http|acme|alice|POST|POST /payments", Key: "K1"}.DownstreamKey())
	// Output:
	// idemq-ce06bba30b3fdd7077cde674682a65b9
}

// Routers that do not set Request.Pattern (chi, echo, gin) give the
// middleware a Route extractor. Here a router's own middleware stores the
// matched route in the request context first, as echo's and gin's adapters
// do (chi: chi.RouteContext(r.Context()).RoutePattern()).
func Example_router() {
	type routeKey struct{}
	withRoute := func(pattern string, h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), routeKey{}, pattern)))
		})
	}
	store, fp := newStore()
	mw, _ := httpidem.New(httpidem.Config{
		Store: store, Fingerprinter: fp, Principal: httpidem.Header("X-User"),
		Route: func(r *http.Request) (string, error) {
			if p, ok := r.Context().Value(routeKey{}).(string); ok {
				return p, nil
			}
			return "", errors.New("no route")
		},
	})
	// The router's route for /payments/{id}/capture, wrapped like any
	// net/http middleware:
	h := withRoute("/payments/{id}/capture", mw.Handler(http.NotFoundHandler()))
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/payments/7/capture", nil)
	r.Header.Set(httpidem.KeyHeader, "bad\x01key")
	h.ServeHTTP(w, r)
	fmt.Println(w.Code)
	// Output:
	// 400
}

// Lease mode, for a handler that calls a payment provider: the claim
// commits first, the handler runs without a transaction, and the
// provider gets the same idempotency key on every run of the request
// (also after a takeover from an owner that died).
func ExampleConfig_lease() {
	store, fp := newStore() // lease mode fingerprints through the store: the same Fingerprinter
	mw, err := httpidem.New(httpidem.Config{
		Store: store, Fingerprinter: fp, Principal: httpidem.Header("X-User"),
		Lease: &dedup.LeaseOptions{TTL: 30 * time.Second}, // heartbeats every 10s
	})
	if err != nil {
		panic(err)
	}
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, _ := httpidem.KeyFromContext(r.Context())
		_ = key // Idempotency-Key of the provider call
		w.WriteHeader(http.StatusCreated)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /charges", mw.Handler(charge))
	fmt.Println(mw.Config().Lease.TTL)
	// Output:
	// 30s
}

// An Extractor that fails with a *Problem has it written as the answer:
// here an unauthenticated request gets 401 before anything is recorded.
func ExampleExtractor() {
	principal := func(r *http.Request) (string, error) {
		if u := r.Header.Get("X-User"); u != "" {
			return u, nil
		}
		return "", &httpidem.Problem{Type: "about:blank", Title: "Unauthorized", Status: http.StatusUnauthorized}
	}
	store, fp := newStore()
	mw, _ := httpidem.New(httpidem.Config{Store: store, Fingerprinter: fp, Principal: principal})
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handler(http.NotFoundHandler()))
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{}`))
	r.Header.Set(httpidem.KeyHeader, "K1")
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, r)
	fmt.Print(w.Code, " ", w.Body.String())
	// Output:
	// 401 {"type":"about:blank","title":"Unauthorized","status":401}
}

// Asynchronous routes: copies of a request that is still running get 202
// Accepted with a status URL the service serves, instead of 409.
func ExampleConfig_asyncStatus() {
	store, fp := newStore()
	mw, _ := httpidem.New(httpidem.Config{
		Store: store, Fingerprinter: fp, Principal: httpidem.Header("X-User"),
		AsyncStatus: func(_ *http.Request, info httpidem.Info) string {
			return "/operations/" + info.DownstreamKey() // GET /operations/{id} reports the progress
		},
	})
	fmt.Println(mw.Config().AsyncStatus(nil, httpidem.Info{Scope: "http|acme|alice|POST|POST /exports", Key: "K1"}))
	// Output:
	// /operations/idemq-385b2043536c1f6796f9d13d056dc3ea
}
