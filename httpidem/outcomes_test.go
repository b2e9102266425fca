package httpidem

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup/pgstore"
)

// A retry after a mid-request failure (a 503, a panic) runs the handler
// again, then succeeds: the failed attempt's writes rolled back, its
// attempt was counted, and only the successful one's row exists.
func TestRetryAfterMidRequestFailureRunsAgain(t *testing.T) {
	for _, failure := range []string{"503", "panic"} {
		t.Run(failure, func(t *testing.T) {
			e := newEnv(t, nil)
			e.after = func(r *http.Request) {
				if info, _ := InfoFromContext(r.Context()); info.Attempt == 1 {
					if failure == "panic" {
						panic("provider exploded")
					}
					panic(http.ErrAbortHandler) // replaced below for 503
				}
			}
			if failure == "503" {
				e.after = nil
				e.before = func(r *http.Request, attempt int) int {
					if attempt == 1 {
						// The row written before the failure must roll back.
						if _, err := FromContext(r.Context()).Exec(r.Context(), `insert into `+e.biz+`.payments (id, amount) values ('ghost', '0')`); err != nil {
							t.Error(err)
						}
						return http.StatusServiceUnavailable
					}
					return 0
				}
			}
			first := e.post("/payments", "alice", "K4", `{"amount":"30.00"}`)
			wantFirst := http.StatusServiceUnavailable
			if failure == "panic" {
				wantFirst = http.StatusInternalServerError
			}
			if first.status != wantFirst || first.replayed() {
				t.Fatalf("first: %d %s, want %d", first.status, first.body, wantFirst)
			}
			status, attempts := e.record("alice", "POST /payments", "K4")
			mustEqual(t, "record after the failure", status+"/"+strconv.Itoa(attempts), "FAILED_RETRYABLE/1")
			mustEqual(t, "payments rows after the failure", e.payments(), 0)

			second := e.post("/payments", "alice", "K4", `{"amount":"30.00"}`)
			if second.status != http.StatusCreated || second.replayed() || !strings.Contains(string(second.body), `"attempt":2`) {
				t.Fatalf("retry: %d replayed=%v %s, want a new 201 on attempt 2", second.status, second.replayed(), second.body)
			}
			third := e.post("/payments", "alice", "K4", `{"amount":"30.00"}`)
			if !third.replayed() || !bodyEqual(third.body, second.body) {
				t.Fatalf("third: %d replayed=%v %s", third.status, third.replayed(), third.body)
			}
			status, attempts = e.record("alice", "POST /payments", "K4")
			mustEqual(t, "record", status+"/"+strconv.Itoa(attempts), "SUCCEEDED/2")
			mustEqual(t, "payments rows", e.payments(), 1)
		})
	}
}

// A final 4xx (validation) is stored and replayed; the handler runs once.
func TestFinal4xxIsStoredAndReplayed(t *testing.T) {
	e := newEnv(t, nil)
	first := e.post("/payments", "alice", "K5", `{"currency":"EUR"}`)
	second := e.post("/payments", "alice", "K5", `{"currency":"EUR"}`)
	if first.status != http.StatusBadRequest || second.status != http.StatusBadRequest || !second.replayed() || !bodyEqual(first.body, second.body) {
		t.Fatalf("first %d %s, second %d replayed=%v %s", first.status, first.body, second.status, second.replayed(), second.body)
	}
	mustEqual(t, "handler calls", e.calls.Load(), 1)
	status, _ := e.record("alice", "POST /payments", "K5")
	mustEqual(t, "record", status, "SUCCEEDED")
}

// The attempts are bounded by the store's MaxAttempts: then FAILED_FINAL
// with a dead letter, and the key answers 409 without running the handler.
func TestAttemptsExhausted(t *testing.T) {
	e := newEnvStore(t, func(c *pgstore.Config) { c.MaxAttempts = 2 }, nil)
	e.before = func(*http.Request, int) int { return http.StatusBadGateway }
	for i := range 2 {
		if r := e.post("/payments", "alice", "K6", `{"amount":"1"}`); r.status != http.StatusBadGateway {
			t.Fatalf("attempt %d: %d %s", i+1, r.status, r.body)
		}
	}
	r := e.post("/payments", "alice", "K6", `{"amount":"1"}`)
	if r.status != http.StatusConflict || r.problem(t).Type != TypeKeyExhausted || r.header.Get("Retry-After") != "" {
		t.Fatalf("after the last attempt: %d %s", r.status, r.body)
	}
	status, attempts := e.record("alice", "POST /payments", "K6")
	mustEqual(t, "record", status+"/"+strconv.Itoa(attempts), "FAILED_FINAL/2")
	mustEqual(t, "dead letters", e.count(`select count(*) from `+quoted(dbSchema, "dead_letters")+` where scope = $1 and message_id = 'K6' and reason = 'attempts_exhausted'`,
		Scope(e.tenant, "alice", http.MethodPost, "POST /payments")), 1)
}

// Bad keys are refused with 400 and a problem body, before anything is
// recorded or the handler runs.
func TestBadKeys(t *testing.T) {
	e := newEnv(t, nil)
	for name, c := range map[string]struct {
		header http.Header
		want   string
	}{
		"missing":     {nil, TypeKeyMissing},
		"empty":       {http.Header{KeyHeader: {""}}, TypeKeyInvalid},
		"256 bytes":   {http.Header{KeyHeader: {strings.Repeat("k", 256)}}, TypeKeyInvalid},
		"non-ASCII":   {http.Header{KeyHeader: {"clé-1"}}, TypeKeyInvalid},
		"tab":         {http.Header{KeyHeader: {"a\tb"}}, TypeKeyInvalid},
		"repeated":    {http.Header{KeyHeader: {"a", "b"}}, TypeKeyInvalid},
		"bad sf-str":  {http.Header{KeyHeader: {`"a"b"`}}, TypeKeyInvalid},
		"empty quote": {http.Header{KeyHeader: {`""`}}, TypeKeyInvalid},
	} {
		r := e.do(e.ctx, "/payments", "alice", "", `{"amount":"1"}`, c.header)
		if r.status != http.StatusBadRequest || r.problem(t).Type != c.want {
			t.Errorf("%s: %d %s, want 400 %s", name, r.status, r.body, c.want)
		}
	}
	// Control characters other than tab do not pass Go's client: serve them directly.
	for _, k := range []string{"a\x01b", "a\x7fb", "\x00"} {
		req := httptest.NewRequestWithContext(e.ctx, http.MethodPost, "/payments", strings.NewReader(`{"amount":"1"}`))
		req.Header.Set("X-User", "alice")
		req.Header[KeyHeader] = []string{k}
		w := httptest.NewRecorder()
		e.srv.Config.Handler.ServeHTTP(w, req)
		if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), TypeKeyInvalid) {
			t.Errorf("key %q: %d %s", k, w.Code, w.Body)
		}
	}
	mustEqual(t, "handler calls", e.calls.Load(), 0)
	mustEqual(t, "records", e.count(`select count(*) from `+quoted(dbSchema, "consumption_records")+` where scope like $1`, "http|"+e.tenant+"|%"), 0)
	// The limits themselves are accepted: 255 bytes, space and tilde, and a
	// quoted sf-string (the draft's form) means its content.
	for _, k := range []string{strings.Repeat("k", 255), " ~x~ "} {
		if r := e.post("/payments", "alice", k, `{"amount":"1"}`); r.status != http.StatusCreated {
			t.Fatalf("key %q: %d %s", k, r.status, r.body)
		}
	}
	quoted := e.do(e.ctx, "/payments", "alice", "", `{"amount":"1"}`, http.Header{KeyHeader: {`"` + strings.Repeat("k", 255) + `"`}})
	if !quoted.replayed() {
		t.Fatalf("the quoted form of a key is not the same key: %d %s", quoted.status, quoted.body)
	}
}

// A body over MaxBodyBytes is answered 413 without the handler or a record.
func TestOversizedBody(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxBodyBytes = 64 })
	big := `{"amount":"1","pad":"` + strings.Repeat("x", 100) + `"}`
	r := e.post("/payments", "alice", "K7", big)
	if r.status != http.StatusRequestEntityTooLarge || r.problem(t).Type != TypeBodyTooLarge {
		t.Fatalf("%d %s", r.status, r.body)
	}
	// Chunked (no Content-Length): the limit holds while reading.
	req, _ := http.NewRequestWithContext(e.ctx, http.MethodPost, e.srv.URL+"/payments", strings.NewReader(big))
	req.ContentLength = -1
	req.TransferEncoding = []string{"chunked"}
	req.Header.Set(KeyHeader, "K7b")
	req.Header.Set("X-User", "alice")
	res, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	mustEqual(t, "chunked status", res.StatusCode, http.StatusRequestEntityTooLarge)
	mustEqual(t, "handler calls", e.calls.Load(), 0)
	if st, _ := e.record("alice", "POST /payments", "K7"); st != "" {
		t.Fatalf("a record was written: %s", st)
	}
	if r := e.post("/payments", "alice", "K8", `{"amount":"1"}`); r.status != http.StatusCreated {
		t.Fatalf("a body within the limit: %d %s", r.status, r.body)
	}
	if r := e.post("/payments", "alice", "K9", `{"amount":`); r.status != http.StatusBadRequest || r.problem(t).Type != TypeBodyMalformed {
		t.Fatalf("malformed JSON: %d %s", r.status, r.body)
	}
}

// The cap on unfinished keys: a principal with MaxUnfinished retryable
// records gets 429 + Retry-After for a new key; another principal does
// not; finishing one frees a place.
func TestUnfinishedKeysCap(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxUnfinished = 2; c.RetryAfter = 3 * time.Second })
	fail := true
	e.before = func(*http.Request, int) int {
		if fail {
			return http.StatusServiceUnavailable
		}
		return 0
	}
	for _, k := range []string{"u1", "u2"} {
		if r := e.post("/payments", "alice", k, `{"amount":"1"}`); r.status != http.StatusServiceUnavailable {
			t.Fatalf("%s: %d %s", k, r.status, r.body)
		}
	}
	r := e.post("/payments", "alice", "u3", `{"amount":"1"}`)
	if r.status != http.StatusTooManyRequests || r.problem(t).Type != TypeTooManyUnfinished || r.header.Get("Retry-After") != "3" {
		t.Fatalf("third key: %d %s Retry-After %q", r.status, r.body, r.header.Get("Retry-After"))
	}
	if st, _ := e.record("alice", "POST /payments", "u3"); st != "" {
		t.Fatalf("the refused key has a record: %s", st)
	}
	fail = false
	if r := e.post("/payments", "bob", "u3", `{"amount":"1"}`); r.status != http.StatusCreated {
		t.Fatalf("bob: %d %s", r.status, r.body)
	}
	// Retrying an unfinished key is never capped, and finishing it frees a place.
	if r := e.post("/payments", "alice", "u1", `{"amount":"1"}`); r.status != http.StatusCreated {
		t.Fatalf("retry of u1: %d %s", r.status, r.body)
	}
	if r := e.post("/payments", "alice", "u3", `{"amount":"1"}`); r.status != http.StatusCreated {
		t.Fatalf("u3 after u1 finished: %d %s", r.status, r.body)
	}
}

// Expiry: after retention (the record purged) the key is new again, while
// the business unique index still refuses the duplicate payment; the
// purge removed the stored response with the record.
func TestExpiryKeyIsNewAgainBusinessIndexHolds(t *testing.T) {
	e := newEnv(t, nil)
	body := `{"amount":"30.00","ref":"inv-9"}`
	if r := e.post("/payments", "alice", "K10", body); r.status != http.StatusCreated {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	scope := Scope(e.tenant, "alice", http.MethodPost, "POST /payments")
	var id int64
	if err := dbPool.QueryRow(e.ctx, `update `+quoted(dbSchema, "consumption_records")+` set expires_at = now() - interval '1 second'
where scope = $1 and message_id = 'K10' returning id`, scope).Scan(&id); err != nil {
		t.Fatal(err)
	}
	// Purge deletes expired records in batches; other tests' records do not expire.
	for {
		n, err := e.store.Purge(e.ctx, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	mustEqual(t, "stored responses of the purged record", e.count(`select count(*) from `+e.httpTable()+` where record_id = $1`, id), 0)
	r := e.post("/payments", "alice", "K10", body)
	if r.status != http.StatusConflict || r.replayed() {
		t.Fatalf("after expiry: %d replayed=%v %s, want the handler's 409 from the unique index", r.status, r.replayed(), r.body)
	}
	mustEqual(t, "handler calls", e.calls.Load(), 2)
	mustEqual(t, "payments rows", e.payments(), 1)
}

// Oversized stored responses keep status, headers and Resource-Id, and are
// replayed with the body-omitted marker.
func TestOversizedResponseReplaysWithoutBody(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxResponseBytes = 8 })
	first := e.post("/payments", "alice", "K11", `{"amount":"30.00"}`)
	second := e.post("/payments", "alice", "K11", `{"amount":"30.00"}`)
	if first.status != http.StatusCreated || len(first.body) <= 8 {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	if second.status != http.StatusCreated || !second.replayed() || second.header.Get(BodyOmittedHeader) != "true" || len(second.body) != 0 ||
		second.header.Get(ResourceIDHeader) != first.header.Get(ResourceIDHeader) || second.header.Get("Location") != first.header.Get("Location") {
		t.Fatalf("replay: %d %v %q", second.status, second.header, second.body)
	}
}

// A handler that leaves its transaction unusable (a failed statement it
// swallowed) and answers 201 has not succeeded: the client gets 500, never
// the 201, and the record is retryable; the retry succeeds.
func TestUnusableTransactionIsAFailure(t *testing.T) {
	e := newEnv(t, nil)
	e.after = func(r *http.Request) {
		if info, _ := InfoFromContext(r.Context()); info.Attempt == 1 {
			_, _ = FromContext(r.Context()).Exec(r.Context(), `select 1/0`) // error swallowed: the transaction is aborted
		}
	}
	first := e.post("/payments", "alice", "K12", `{"amount":"1"}`)
	if first.status != http.StatusInternalServerError {
		t.Fatalf("first: %d %s, want 500", first.status, first.body)
	}
	status, attempts := e.record("alice", "POST /payments", "K12")
	mustEqual(t, "record", status+"/"+strconv.Itoa(attempts), "FAILED_RETRYABLE/1")
	mustEqual(t, "payments rows", e.payments(), 0)
	if r := e.post("/payments", "alice", "K12", `{"amount":"1"}`); r.status != http.StatusCreated || r.replayed() {
		t.Fatalf("retry: %d %s", r.status, r.body)
	}
	mustEqual(t, "payments rows", e.payments(), 1)
}
