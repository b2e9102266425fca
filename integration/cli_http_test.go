package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/httpidem"
)

// cliInspect is the part of `idemq inspect`'s JSON the HTTP tests read.
type cliInspect struct {
	Scope     string       `json:"scope"`
	MessageID string       `json:"message_id"`
	Status    dedup.Status `json:"status"`
	Attempts  int          `json:"attempts"`
	HTTP      *struct {
		CanonVersion int  `json:"canon_version"`
		Unfinished   bool `json:"unfinished"`
		Response     *struct {
			Status      int         `json:"status"`
			Sealed      bool        `json:"sealed"`
			KeyID       string      `json:"key_id"`
			Oversized   *bool       `json:"oversized"`
			ResourceID  string      `json:"resource_id"`
			Headers     http.Header `json:"headers"`
			StoredBytes int         `json:"stored_bytes"`
			BodyBytes   *int        `json:"body_bytes"`
			Body        *string     `json:"body"`
		} `json:"response"`
	} `json:"http"`
}

// The operator's CLI on HTTP requests (package httpidem) actually served:
// inspect names a request by its tenant, principal, method, route and key
// (the scope composed, escaped, by httpidem.Scope) and shows the stored
// response's status, sealing, size and canonicalization version, its body
// only with --show-body and never a sealed one; dead-letters lists an HTTP
// route's conflicts and exhausted keys, or every HTTP scope's
// (--scope-prefix 'http|'); redrive takes the same flags; purge removes
// expired HTTP records and their stored responses go with them (ON DELETE
// CASCADE: without it the purge fails). Usage errors exit 2, runtime errors 1, with a message.
func TestCLIHTTPScopes(t *testing.T) {
	t.Parallel()
	bin := buildExample(t, "github.com/idemq/idemq/cmd/idemq")
	e := setup(t, func(c *pgstore.Config) { c.MaxAttempts = 2 })
	idemq := func(args ...string) (stdout, stderr string, code int) {
		t.Helper()
		return cliRun(t, bin, append(args, "--dsn", postgresDSN(t), "--schema", e.schema)...)
	}
	run := func(args ...string) string {
		t.Helper()
		out, errOut, code := idemq(args...)
		if code != 0 {
			t.Fatalf("idemq %v: exit %d\n%s%s", args, code, out, errOut)
		}
		return out
	}
	inspect := func(args ...string) cliInspect {
		t.Helper()
		out := run(append([]string{"inspect"}, args...)...)
		var in cliInspect
		if err := json.Unmarshal([]byte(out), &in); err != nil {
			t.Fatalf("inspect %v: %v\n%s", args, err, out)
		}
		return in
	}
	const tenant, user, secret = "acme", "a|lice", "tok_SECRET_4242"
	httpFlags := func(route string) []string {
		return []string{"--http-tenant", tenant, "--http-principal", user, "--http-method", http.MethodPost, "--http-route", route}
	}

	// The service: four routes behind the middleware on the test's store.
	sealer, err := httpidem.NewAESGCM("k-2026", map[string][]byte{"k-2026": bytes.Repeat([]byte{7}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	mw := func(tweak func(*httpidem.Config)) *httpidem.Middleware {
		cfg := httpidem.Config{Store: e.store, Fingerprinter: testFingerprinter(t),
			Tenant: func(*http.Request) (string, error) { return tenant, nil }, Principal: httpidem.Header("X-User")}
		if tweak != nil {
			tweak(&cfg)
		}
		m, err := httpidem.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	created := func(id, body string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set(httpidem.ResourceIDHeader, id)
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, body)
		})
	}
	var flakyCalls atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw(nil).Handler(created("pay_1", `{"id":"pay_1","amount":"10.00"}`)))
	mux.Handle("POST /cards", mw(func(c *httpidem.Config) { c.Sealer = sealer }).Handler(created("card_1", `{"id":"card_1","token":"`+secret+`"}`)))
	mux.Handle("POST /reports", mw(func(c *httpidem.Config) { c.MaxResponseBytes = 16 }).Handler(created("rep_1", `{"id":"rep_1","rows":"`+strings.Repeat("x", 100)+`"}`)))
	mux.Handle("POST /flaky", mw(nil).Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		flakyCalls.Add(1)
		http.Error(w, "upstream down", http.StatusServiceUnavailable)
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	post := func(path, key, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(e.ctx, http.MethodPost, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-User", user)
		req.Header.Set(httpidem.KeyHeader, key)
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = res.Body.Close() }()
		b, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		return res.StatusCode, string(b)
	}
	wantStatus := func(what string, got, want int) {
		t.Helper()
		if got != want {
			t.Fatalf("%s: status %d, want %d", what, got, want)
		}
	}
	st, payBody := post("/payments", "K1", `{"amount":"10.00"}`)
	wantStatus("payment", st, http.StatusCreated)
	st, _ = post("/payments", "K1", `{"amount":"99.00"}`)
	wantStatus("payment, same key, other amount", st, http.StatusUnprocessableEntity)
	st, _ = post("/cards", "C1", `{"pan":"4242"}`)
	wantStatus("card", st, http.StatusCreated)
	st, _ = post("/reports", "R1", `{}`)
	wantStatus("report", st, http.StatusCreated)
	st, _ = post("/flaky", "F1", `{}`)
	wantStatus("flaky, attempt 1", st, http.StatusServiceUnavailable)
	// A consumer group's dead letter, which the HTTP listings leave out.
	if res, err := e.store.Process(e.ctx, msg(t, "billing", "m-dl", "", "x"), (&spy{fail: func(int64, *dedup.Message) error {
		return dedup.Permanent(errors.New("address invalid"))
	}}).handle); err != nil || res.Outcome != dedup.OutcomeDeadLetter {
		t.Fatalf("%+v %v", res, err)
	}

	// inspect by the request's parts: the escaped scope, the stored response
	// described, its body withheld.
	payScope := httpidem.Scope(tenant, user, http.MethodPost, "POST /payments")
	in := inspect(append(httpFlags("POST /payments"), "--message-id", "K1")...)
	if in.Scope != payScope || !strings.Contains(in.Scope, "a%7Clice") || in.Status != dedup.StatusSucceeded || in.HTTP == nil || in.HTTP.Response == nil {
		t.Fatalf("inspect payment: %+v", in)
	}
	r := in.HTTP.Response
	if in.HTTP.CanonVersion != httpidem.CanonicalVersion || in.HTTP.Unfinished || r.Status != http.StatusCreated || r.Sealed || r.Oversized == nil || *r.Oversized ||
		r.ResourceID != "pay_1" || r.Headers.Get("Content-Type") != "application/json" || r.BodyBytes == nil || *r.BodyBytes != len(payBody) || r.Body != nil {
		t.Fatalf("inspect payment, http part: %+v response %+v", in.HTTP, r)
	}
	// -show-body prints the plain body as the client got it; -scope with the
	// composed scope names the same record.
	in = inspect("--scope", payScope, "--message-id", "K1", "--show-body")
	if in.HTTP == nil || in.HTTP.Response == nil || in.HTTP.Response.Body == nil || *in.HTTP.Response.Body != payBody {
		t.Fatalf("inspect -show-body: %+v", in.HTTP)
	}

	// A key as sent, even one that a message ID could not be ("sha256:…",
	// the prefix of hashed message IDs, is a valid Idempotency-Key).
	st, _ = post("/payments", "sha256:k2", `{"amount":"20.00"}`)
	wantStatus("payment with key sha256:k2", st, http.StatusCreated)
	if in = inspect(append(httpFlags("POST /payments"), "--message-id", "sha256:k2")...); in.MessageID != "sha256:k2" || in.Status != dedup.StatusSucceeded || in.HTTP == nil {
		t.Fatalf("inspect sha256:k2: %+v", in)
	}

	// A sealed response: its key ID, never its body, not even with -show-body.
	out, errOut, code := idemq(append([]string{"inspect"}, append(httpFlags("POST /cards"), "--message-id", "C1", "--show-body")...)...)
	if code != 0 || strings.Contains(out, secret) || strings.Contains(out, `"body"`) || !strings.Contains(errOut, "sealed (key k-2026)") {
		t.Fatalf("inspect of a sealed response: exit %d\n%s%s", code, out, errOut)
	}
	in = inspect(append(httpFlags("POST /cards"), "--message-id", "C1")...)
	if r := in.HTTP.Response; r == nil || !r.Sealed || r.KeyID != "k-2026" || r.Status != http.StatusCreated || r.Oversized != nil || r.BodyBytes != nil || r.StoredBytes == 0 {
		t.Fatalf("inspect sealed: %+v", in.HTTP.Response)
	}

	// An oversized response: status and resource ID, no body to show.
	in = inspect(append(httpFlags("POST /reports"), "--message-id", "R1", "--show-body")...)
	if r := in.HTTP.Response; r == nil || r.Oversized == nil || !*r.Oversized || r.ResourceID != "rep_1" || r.Body != nil || r.BodyBytes != nil || r.Sealed {
		t.Fatalf("inspect oversized: %+v", in.HTTP.Response)
	}

	// A retryable failure: unfinished, no response stored. The next attempt
	// exhausts MaxAttempts (2): FAILED_FINAL with a dead letter.
	in = inspect(append(httpFlags("POST /flaky"), "--message-id", "F1")...)
	if in.Status != dedup.StatusFailedRetryable || in.HTTP == nil || !in.HTTP.Unfinished || in.HTTP.Response != nil {
		t.Fatalf("inspect retryable: %+v %+v", in, in.HTTP)
	}
	post("/flaky", "F1", `{}`)
	if in = inspect(append(httpFlags("POST /flaky"), "--message-id", "F1")...); in.Status != dedup.StatusFailedFinal || in.HTTP.Unfinished {
		t.Fatalf("inspect exhausted: %+v %+v", in, in.HTTP)
	}

	// dead-letters: every HTTP scope's with -scope-prefix (with the SCOPE
	// column), one route's with the -http-* flags.
	out = run("dead-letters", "list", "--scope-prefix", httpidem.ScopePrefix)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[0], "SCOPE") ||
		!strings.Contains(out, payScope) || !strings.Contains(out, "payload_conflict") ||
		!strings.Contains(out, "attempts_exhausted") || strings.Contains(out, "billing") || strings.Contains(out, "m-dl") {
		t.Fatalf("dead-letters -scope-prefix 'http|':\n%s", out)
	}
	out = run(append([]string{"dead-letters", "list"}, httpFlags("POST /payments")...)...)
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 || !strings.Contains(lines[1], "K1") || !strings.Contains(lines[1], "payload_conflict") {
		t.Fatalf("dead-letters -http-*:\n%s", out)
	}

	// redrive by the request's parts: the key runs its handler again.
	run(append([]string{"redrive"}, append(httpFlags("POST /flaky"), "--message-id", "F1")...)...)
	if in = inspect(append(httpFlags("POST /flaky"), "--message-id", "F1")...); in.Status != dedup.StatusFailedRetryable {
		t.Fatalf("after redrive: %+v", in)
	}
	before := flakyCalls.Load()
	post("/flaky", "F1", `{}`)
	if flakyCalls.Load() != before+1 {
		t.Fatalf("the re-driven key did not run its handler again: %d calls, want %d", flakyCalls.Load(), before+1)
	}

	// Usage errors exit 2, runtime errors 1, and both say why.
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{append([]string{"inspect", "--scope", payScope, "--message-id", "K1"}, httpFlags("POST /payments")...), 2, "not both"},
		{[]string{"inspect", "--http-tenant", tenant, "--http-principal", user, "--message-id", "K1"}, 2, "--http-method and --http-route are required"},
		{append([]string{"inspect", "--message-id", "nope"}, httpFlags("POST /payments")...), 3, "not found"},
		{[]string{"inspect", "--message-id", "K1"}, 2, "--scope is required"},
		{[]string{"dead-letters", "list", "--scope-prefix", "http|", "--scope", "billing"}, 2, "not both"},
	} {
		if out, errOut, code := idemq(c.args...); code != c.code || !strings.Contains(errOut, c.want) {
			t.Fatalf("idemq %v: exit %d, want %d with %q\n%s%s", c.args, code, c.code, c.want, out, errOut)
		}
	}

	// purge: the four SUCCEEDED requests have expired (their expiry moved
	// into the past: the store's shortest retention is a minute); they go,
	// and their stored responses with them.
	httpTable := e.table("consumption_records_http")
	var ids []int64
	rows, err := e.pool.Query(e.ctx, `update `+e.table("consumption_records")+` set expires_at = now() - interval '1 second'
		where status = 'SUCCEEDED' and starts_with(scope, 'http|') returning id`)
	if err == nil {
		for rows.Next() {
			var id int64
			if err = rows.Scan(&id); err != nil {
				break
			}
			ids = append(ids, id)
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil || len(ids) != 4 {
		t.Fatalf("expire the HTTP records: %v (%d rows)", err, len(ids))
	}
	if n := e.count(`select count(*) from `+httpTable+` where record_id = any($1)`, ids); n != 4 {
		t.Fatalf("%d stored-response rows of the expired records before purge, want 4", n)
	}
	if out, errOut, code := idemq("purge"); code != 0 || !strings.Contains(out, "purged 4 expired records") {
		t.Fatalf("purge: exit %d\n%s%s", code, out, errOut)
	}
	if n := e.count(`select count(*) from `+httpTable+` where record_id = any($1)`, ids); n != 0 {
		t.Fatalf("%d stored-response rows left of the purged records, want 0", n)
	}
	if n := e.count(`select count(*) from ` + httpTable); n != 1 {
		t.Fatalf("%d stored-response rows left, want 1 (the unfinished F1)", n)
	}
	if out, errOut, code := idemq(append([]string{"inspect", "--message-id", "K1"}, httpFlags("POST /payments")...)...); code != 3 || !strings.Contains(errOut, "not found") {
		t.Fatalf("inspect after purge: exit %d\n%s%s", code, out, errOut)
	}
}
