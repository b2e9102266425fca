package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/httpidem"
)

// httpAnswer is one response read whole.
type httpAnswer struct {
	status int
	header http.Header
	body   string
}

func (a httpAnswer) replayed() bool { return a.header.Get(httpidem.ReplayHeader) == "true" }

// problem decodes a problem+json body, failing the test when it is not one.
func (a httpAnswer) problem(t *testing.T) httpidem.Problem {
	t.Helper()
	if ct := a.header.Get("Content-Type"); ct != httpidem.ProblemContentType {
		t.Fatalf("status %d: Content-Type %q, want %s; body %s", a.status, ct, httpidem.ProblemContentType, a.body)
	}
	var p httpidem.Problem
	if err := json.Unmarshal([]byte(a.body), &p); err != nil || p.Status != a.status {
		t.Fatalf("problem body %s (status %d): %v", a.body, a.status, err)
	}
	return p
}

// httpSend posts body to url with the headers (name, value pairs).
func httpSend(t *testing.T, e *env, client *http.Client, url, body string, headers ...string) httpAnswer {
	t.Helper()
	req, err := http.NewRequestWithContext(e.ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = res.Body.Close() }()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return httpAnswer{status: res.StatusCode, header: res.Header, body: string(b)}
}

// S23 One key, two targets: route POST /invoices/{invoice}/credits, the
// handler credits (invoice, cents) with cents from ?cents= (default 250) and
// answers 201 {"credited":"<invoice>"}. (a) Key cr-23a to inv-901, then the
// same key and body to inv-902; (b) key cr-23b to inv-903?cents=7, then
// ?cents=700. The second of each pair is 422 (TypeKeyReused, a problem
// body), never the first's 201: keys are per route pattern and the concrete
// target (path and canonical query) is part of the fingerprint. A retry of
// the first to its own target, with its query parameters in another order,
// is a replay. The credits table holds exactly what each caller was told was
// done. In atomic and lease mode.
func TestS23OneKeyTwoTargets(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"atomic", "lease"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testS23(t, mode)
		})
	}
}

func testS23(t *testing.T, mode string) {
	e := setup(t, nil)
	credits := e.table("credits")
	e.exec(`create table ` + credits + ` (invoice text not null, cents int not null)`)
	fp := e.store.Config().Fingerprinter // lease mode fingerprints through the store
	cfg := httpidem.Config{Store: e.store, Fingerprinter: fp, Principal: httpidem.Header("X-Account")}
	if mode == "lease" {
		cfg.Lease = &dedup.LeaseOptions{TTL: time.Minute}
	}
	mw, err := httpidem.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("POST /invoices/{invoice}/credits", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		cents := 250
		if c := r.URL.Query().Get("cents"); c != "" {
			n, err := strconv.Atoi(c)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			cents = n
		}
		invoice := r.PathValue("invoice")
		var err error
		if tx := httpidem.FromContext(r.Context()); tx != nil {
			_, err = tx.Exec(r.Context(), `insert into `+credits+` (invoice, cents) values ($1, $2)`, invoice, cents)
		} else {
			_, err = e.pool.Exec(r.Context(), `insert into `+credits+` (invoice, cents) values ($1, $2)`, invoice, cents)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"credited":%q}`, invoice) //nolint:gosec // a test server's JSON answer, %q-quoted
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	const body = `{"note":"goodwill"}`
	post := func(target, key string) httpAnswer {
		t.Helper()
		return httpSend(t, e, srv.Client(), srv.URL+target, body, "X-Account", "p-23", httpidem.KeyHeader, key)
	}
	rows := func() string {
		t.Helper()
		r, err := e.pool.Query(e.ctx, `select invoice, cents from `+credits+` order by invoice, cents`)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		var out []string
		for r.Next() {
			var inv string
			var c int
			if err := r.Scan(&inv, &c); err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("%s:%d", inv, c))
		}
		if err := r.Err(); err != nil {
			t.Fatal(err)
		}
		return strings.Join(out, ",")
	}
	wantCreated := func(what string, a httpAnswer, invoice string, replay bool) {
		t.Helper()
		if a.status != http.StatusCreated || a.body != `{"credited":"`+invoice+`"}` || a.replayed() != replay {
			t.Errorf("%s: %d replayed=%v %s, want 201 {\"credited\":%q} replayed=%v", what, a.status, a.replayed(), a.body, invoice, replay)
		}
	}
	wantReused := func(what string, a httpAnswer) {
		t.Helper()
		if a.status != http.StatusUnprocessableEntity || a.replayed() {
			t.Errorf("%s: %d replayed=%v %s, want 422 (the key was used for another target), never the first request's answer", what, a.status, a.replayed(), a.body)
			return
		}
		if p := a.problem(t); p.Type != httpidem.TypeKeyReused {
			t.Fatalf("%s: problem type %q, want %q", what, p.Type, httpidem.TypeKeyReused)
		}
	}

	// (a) one key, two invoices.
	wantCreated("(a) cr-23a to inv-901", post("/invoices/inv-901/credits", "cr-23a"), "inv-901", false)
	wantReused("(a) cr-23a to inv-902", post("/invoices/inv-902/credits", "cr-23a"))
	wantCreated("(a) cr-23a to inv-901 again", post("/invoices/inv-901/credits", "cr-23a"), "inv-901", true)
	if got := rows(); got != "inv-901:250" {
		t.Errorf("(a) credits %q, want inv-901:250 only (inv-902 was told nothing was done)", got)
	}

	// (b) one key, one invoice, two amounts.
	wantCreated("(b) cr-23b ?cents=7", post("/invoices/inv-903/credits?cents=7&reason=late", "cr-23b"), "inv-903", false)
	wantReused("(b) cr-23b ?cents=700", post("/invoices/inv-903/credits?cents=700&reason=late", "cr-23b"))
	wantReused("(b) cr-23b without the query", post("/invoices/inv-903/credits", "cr-23b"))
	wantCreated("(b) cr-23b ?cents=7, parameters reordered", post("/invoices/inv-903/credits?reason=late&cents=7", "cr-23b"), "inv-903", true)
	if got := rows(); got != "inv-901:250,inv-903:7" {
		t.Errorf("(b) credits %q, want inv-901:250,inv-903:7", got)
	}
	if t.Failed() {
		return
	}
	mustCount(t, "handler calls", int(calls.Load()), 2)
	scope := httpidem.Scope("", "p-23", http.MethodPost, "POST /invoices/{invoice}/credits")
	for _, key := range []string{"cr-23a", "cr-23b"} {
		if r := e.record(scope, key); r.Status != dedup.StatusSucceeded {
			t.Fatalf("record %s: %s, want SUCCEEDED", key, r.Status)
		}
	}
	mustCount(t, "HTTP records", e.count(`select count(*) from `+e.table("consumption_records_http")), 2)
	mustCount(t, "payload_conflict dead letters", e.count(`select count(*) from `+e.table("dead_letters")+` where scope = $1 and reason = 'payload_conflict'`, scope), 3)
}

func mustCount(t *testing.T, what string, got, want int) {
	t.Helper()
	if got != want {
		t.Fatalf("%s = %d, want %d", what, got, want)
	}
}

// S24 No caller: Principal is Header("X-Account"). Two requests without
// X-Account (and one with a blank one), from different sessions, each with
// key gift-24 and body {"card":"welcome"}; the handler answers 201 with a
// secret of the caller's session. All are refused 401 with a problem body
// (TypeUnauthenticated) before anything is written: no record, no stored
// response, no dead letter, no business row, the handler never called, so
// no caller is ever served another's response. A configured Tenant that is
// blank is refused the same way (400, TypeUnidentified). In atomic and lease
// mode.
func TestS24NoCaller(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"atomic", "lease"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testS24(t, mode)
		})
	}
}

func testS24(t *testing.T, mode string) {
	e := setup(t, nil)
	gifts := e.table("gifts")
	e.exec(`create table ` + gifts + ` (session text not null, secret text not null)`)
	var calls atomic.Int64
	srv := httptest.NewServer(giftMux(t, e, gifts, &calls, mode, nil))
	t.Cleanup(srv.Close)
	const body = `{"card":"welcome"}`
	for i, h := range [][]string{
		{"Cookie", "session=s-24-a"},
		{"Cookie", "session=s-24-b"},
		{"Cookie", "session=s-24-c", "X-Account", " \t"},
	} {
		a := httpSend(t, e, srv.Client(), srv.URL+"/gifts", body, append(h, httpidem.KeyHeader, "gift-24")...)
		if a.status != http.StatusUnauthorized || strings.Contains(a.body, "secret") {
			t.Errorf("caller %d (%s) without an account: %d replayed=%v %s, want 401 (never a response of another caller)", i, h[1], a.status, a.replayed(), a.body)
			continue
		}
		if p := a.problem(t); p.Type != httpidem.TypeUnauthenticated {
			t.Fatalf("caller %d: problem type %q, want %q", i, p.Type, httpidem.TypeUnauthenticated)
		}
	}
	a := httpSend(t, e, srv.Client(), srv.URL+"/tenants/gifts", body, "Cookie", "session=s-24-a", "X-Account", "acct-1", httpidem.KeyHeader, "gift-24")
	if a.status != http.StatusBadRequest {
		t.Errorf("blank tenant: %d %s, want 400", a.status, a.body)
	} else if p := a.problem(t); p.Type != httpidem.TypeUnidentified {
		t.Errorf("blank tenant: problem type %q, want %q", p.Type, httpidem.TypeUnidentified)
	}
	if t.Failed() {
		t.Fatalf("rows written: %d records, %d gifts", e.count(`select count(*) from `+e.table("consumption_records")), e.count(`select count(*) from `+gifts))
	}
	mustCount(t, "handler calls", int(calls.Load()), 0)
	mustCount(t, "gift rows", e.count(`select count(*) from `+gifts), 0)
	mustCount(t, "consumption records", e.count(`select count(*) from `+e.table("consumption_records")), 0)
	mustCount(t, "stored responses", e.count(`select count(*) from `+e.table("consumption_records_http")), 0)
	mustCount(t, "dead letters", e.count(`select count(*) from `+e.table("dead_letters")), 0)

	// With an account the same request runs.
	a = httpSend(t, e, srv.Client(), srv.URL+"/gifts", body, "Cookie", "session=s-24-a", "X-Account", "acct-1", httpidem.KeyHeader, "gift-24")
	if a.status != http.StatusCreated || a.body != `{"secret":"secret-of-s-24-a"}` {
		t.Fatalf("with an account: %d %s", a.status, a.body)
	}
	mustCount(t, "gift rows", e.count(`select count(*) from `+gifts), 1)
}

// giftMux serves POST /gifts (Principal X-Account; tweak may change the
// config) and POST /tenants/gifts (Tenant X-Tenant, never sent). The
// handler stores and answers a secret of the caller's session cookie.
func giftMux(t *testing.T, e *env, gifts string, calls *atomic.Int64, mode string, tweak func(*httpidem.Config)) http.Handler {
	mw := func(tweak func(*httpidem.Config)) *httpidem.Middleware {
		t.Helper()
		cfg := httpidem.Config{Store: e.store, Fingerprinter: e.store.Config().Fingerprinter, Principal: httpidem.Header("X-Account")}
		if mode == "lease" {
			cfg.Lease = &dedup.LeaseOptions{TTL: time.Minute}
		}
		if tweak != nil {
			tweak(&cfg)
		}
		m, err := httpidem.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	gift := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		c, err := r.Cookie("session")
		if err != nil {
			http.Error(w, "no session", http.StatusBadRequest)
			return
		}
		secret := "secret-of-" + c.Value
		if tx := httpidem.FromContext(r.Context()); tx != nil {
			_, err = tx.Exec(r.Context(), `insert into `+gifts+` (session, secret) values ($1, $2)`, c.Value, secret)
		} else {
			_, err = e.pool.Exec(r.Context(), `insert into `+gifts+` (session, secret) values ($1, $2)`, c.Value, secret)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"secret":%q}`, secret) //nolint:gosec // a test server's JSON answer, %q-quoted
	})
	mux := http.NewServeMux()
	mux.Handle("POST /gifts", mw(tweak).Handler(gift))
	mux.Handle("POST /tenants/gifts", mw(func(c *httpidem.Config) { c.Tenant = httpidem.Header("X-Tenant") }).Handler(gift))
	return mux
}

// S24, the route that is anonymous on purpose: Config.Anonymous =
// Cookie("session") scopes callers without an account by their session, in
// a key space of their own. Two sessions with key gift-24 each get their own
// secret (two rows, two records); a retry of one replays its own; an
// account whose ID equals a session's value is not that session (its own
// record); a caller with neither is refused 401, nothing written. `idemq
// inspect --http-anonymous` finds the session's record.
func TestS24AnonymousRouteScopesByOwner(t *testing.T) {
	t.Parallel()
	bin := buildExample(t, "github.com/idemq/idemq/cmd/idemq")
	e := setup(t, nil)
	gifts := e.table("gifts")
	e.exec(`create table ` + gifts + ` (session text not null, secret text not null)`)
	var calls atomic.Int64
	srv := httptest.NewServer(giftMux(t, e, gifts, &calls, "atomic", func(c *httpidem.Config) { c.Anonymous = httpidem.Cookie("session") }))
	t.Cleanup(srv.Close)
	const body = `{"card":"welcome"}`
	send := func(headers ...string) httpAnswer {
		t.Helper()
		return httpSend(t, e, srv.Client(), srv.URL+"/gifts", body, append(headers, httpidem.KeyHeader, "gift-24")...)
	}
	want := func(what string, a httpAnswer, secret string, replay bool) {
		t.Helper()
		if a.status != http.StatusCreated || a.body != `{"secret":"`+secret+`"}` || a.replayed() != replay {
			t.Fatalf("%s: %d replayed=%v %s, want 201 %s replayed=%v", what, a.status, a.replayed(), a.body, secret, replay)
		}
	}
	want("session a", send("Cookie", "session=s-24-a"), "secret-of-s-24-a", false)
	want("session b", send("Cookie", "session=s-24-b"), "secret-of-s-24-b", false)
	want("session a again", send("Cookie", "session=s-24-a"), "secret-of-s-24-a", true)
	want("account s-24-a (session z)", send("Cookie", "session=s-24-z", "X-Account", "s-24-a"), "secret-of-s-24-z", false)
	a := send()
	if a.status != http.StatusUnauthorized || a.problem(t).Type != httpidem.TypeUnauthenticated {
		t.Fatalf("neither account nor session: %d %s, want 401", a.status, a.body)
	}
	mustCount(t, "handler calls", int(calls.Load()), 3)
	mustCount(t, "gift rows", e.count(`select count(*) from `+gifts), 3)
	mustCount(t, "consumption records", e.count(`select count(*) from `+e.table("consumption_records")), 3)
	const route = "POST /gifts"
	for scope, st := range map[string]dedup.Status{
		httpidem.AnonymousScope("", "s-24-a", http.MethodPost, route): dedup.StatusSucceeded,
		httpidem.AnonymousScope("", "s-24-b", http.MethodPost, route): dedup.StatusSucceeded,
		httpidem.Scope("", "s-24-a", http.MethodPost, route):          dedup.StatusSucceeded,
	} {
		if r := e.record(scope, "gift-24"); r.Status != st {
			t.Fatalf("record %s: %s, want %s", scope, r.Status, st)
		}
	}
	out, errOut, code := cliRun(t, bin, "inspect", "--http-anonymous", "s-24-b", "--http-method", "POST", "--http-route", route, "--message-id", "gift-24",
		"--show-body", "--dsn", postgresDSN(t), "--schema", e.schema)
	var in cliInspect
	if code != 0 || json.Unmarshal([]byte(out), &in) != nil || in.HTTP == nil || in.HTTP.Response == nil || in.HTTP.Response.Body == nil ||
		*in.HTTP.Response.Body != `{"secret":"secret-of-s-24-b"}` {
		t.Fatalf("inspect --http-anonymous s-24-b: exit %d\n%s%s", code, out, errOut)
	}
}
