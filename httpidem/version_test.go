package httpidem

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// A canonicalization rule upgrade never turns a retry into a conflict: the
// retry is compared under the version stored with the record. The test
// plays an upgrade: the record says version 7 (today's JSON rules), and
// the current version's rules become "bytes as sent"; a retry with its
// members in another order must still be a replay. Not parallel: it
// changes the package's rule table.
func TestRetryComparedUnderTheStoredCanonicalVersion(t *testing.T) {
	e := newSerialEnv(t, nil)
	first := e.post("/payments", "alice", "KV", `{"amount":"30.00","currency":"EUR"}`)
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	scope := Scope(e.tenant, "alice", http.MethodPost, "POST /payments")
	e.exec(`update `+e.httpTable()+` set canon_version = 7 where record_id =
  (select id from `+quoted(dbSchema, "consumption_records")+` where scope = $1 and message_id = 'KV')`, scope)
	old := canonicalizers[CanonicalVersion]
	canonicalizers[7] = old
	canonicalizers[CanonicalVersion] = func(_ string, body []byte, _ []string) ([]byte, error) { return bytes.Clone(body), nil }
	t.Cleanup(func() {
		canonicalizers[CanonicalVersion] = old
		delete(canonicalizers, 7)
	})
	r := e.post("/payments", "alice", "KV", `{ "currency":"EUR", "amount":"30.00" }`)
	if r.status != http.StatusCreated || !r.replayed() || !bodyEqual(r.body, first.body) {
		t.Fatalf("retry after the rule upgrade: %d replayed=%v %s, want the replay of %s", r.status, r.replayed(), r.body, first.body)
	}
	mustEqual(t, "handler calls", e.calls.Load(), 1)
}

// Stored responses sealed with AES-GCM stay readable after a key
// rotation (old key kept), are not stored in plain text, and are refused
// (500, nothing re-executed) when the key that sealed them is gone.
func TestSealedResponsesAfterKeyRotation(t *testing.T) {
	k1, k2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	s1, err := NewAESGCM("k1", map[string][]byte{"k1": k1})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *Config) { c.Sealer = s1 })
	first := e.post("/payments", "alice", "KS", `{"amount":"30.00"}`)
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	var keyID string
	var blob []byte
	scope := Scope(e.tenant, "alice", http.MethodPost, "POST /payments")
	if err := dbPool.QueryRow(e.ctx, `select h.response_key_id, h.response from `+e.httpTable()+` h join `+quoted(dbSchema, "consumption_records")+
		` r on r.id = h.record_id where r.scope = $1 and r.message_id = 'KS'`, scope).Scan(&keyID, &blob); err != nil {
		t.Fatal(err)
	}
	if keyID != "k1" || bytes.Contains(blob, []byte("30.00")) || bytes.Contains(blob, []byte("pay_")) {
		t.Fatalf("stored with key %q in plain text: %q", keyID, blob)
	}
	s2, err := NewAESGCM("k2", map[string][]byte{"k1": k1, "k2": k2})
	if err != nil {
		t.Fatal(err)
	}
	e.current.Store(e.newMiddleware(func(c *Config) { c.Sealer = s2 }))
	r := e.post("/payments", "alice", "KS", `{"amount":"30.00"}`)
	if !r.replayed() || !bodyEqual(r.body, first.body) {
		t.Fatalf("replay after rotation: %d %s", r.status, r.body)
	}
	if r := e.post("/payments", "alice", "KS2", `{"amount":"31.00"}`); r.status != http.StatusCreated {
		t.Fatalf("new key after rotation: %d %s", r.status, r.body)
	}
	s3, err := NewAESGCM("k2", map[string][]byte{"k2": k2})
	if err != nil {
		t.Fatal(err)
	}
	e.current.Store(e.newMiddleware(func(c *Config) { c.Sealer = s3 }))
	if r := e.post("/payments", "alice", "KS", `{"amount":"30.00"}`); r.status != http.StatusInternalServerError || r.problem(t).Type != TypeUnavailable {
		t.Fatalf("replay without its key: %d %s", r.status, r.body)
	}
	if r := e.post("/payments", "alice", "KS2", `{"amount":"31.00"}`); !r.replayed() {
		t.Fatalf("k2's response: %d %s", r.status, r.body)
	}
	mustEqual(t, "handler calls", e.calls.Load(), 2)
}

// The middleware's server span carries the HTTP semantic-convention
// attributes and the outcome.
func TestServerSpanAttributes(t *testing.T) {
	tp := &spyProvider{}
	e := newEnv(t, func(c *Config) { c.TracerProvider = tp })
	e.post("/payments", "alice", "KT", `{"amount":"1"}`)
	e.post("/payments", "alice", "KT", `{"amount":"1"}`)
	spans := tp.ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans ended, want 2", len(spans))
	}
	for i, want := range []string{"executed", "replayed"} {
		s := spans[i]
		if s.name != "POST /payments" {
			t.Fatalf("span name %q", s.name)
		}
		for k, v := range map[string]string{"http.request.method": "POST", "http.route": "POST /payments", "http.response.status_code": "201",
			"url.path": "/payments", "url.scheme": "http", "idemq.http.outcome": want} {
			if got := s.attrs[attribute.Key(k)]; got != v {
				t.Fatalf("span %d: %s = %q, want %q (all: %v)", i, k, got, v, s.attrs)
			}
		}
	}
}

type spyProvider struct {
	noop.TracerProvider
	mu    sync.Mutex
	spans []*spySpan
}

func (p *spyProvider) Tracer(string, ...trace.TracerOption) trace.Tracer { return spyTracer{p: p} }

func (p *spyProvider) ended() []*spySpan {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*spySpan
	for _, s := range p.spans {
		if s.done {
			out = append(out, s)
		}
	}
	return out
}

type spyTracer struct {
	noop.Tracer
	p *spyProvider
}

func (t spyTracer) Start(ctx context.Context, name string, _ ...trace.SpanStartOption) (context.Context, trace.Span) {
	s := &spySpan{name: name, attrs: map[attribute.Key]string{}}
	t.p.mu.Lock()
	t.p.spans = append(t.p.spans, s)
	t.p.mu.Unlock()
	return trace.ContextWithSpan(ctx, s), s
}

type spySpan struct {
	noop.Span
	name  string
	attrs map[attribute.Key]string
	done  bool
}

func (s *spySpan) IsRecording() bool { return true }
func (s *spySpan) SetName(n string)  { s.name = n }
func (s *spySpan) SetAttributes(kv ...attribute.KeyValue) {
	for _, a := range kv {
		s.attrs[a.Key] = a.Value.String()
	}
}
func (s *spySpan) SetStatus(codes.Code, string)            {}
func (s *spySpan) End(...trace.SpanEndOption)              { s.done = true }
func (s *spySpan) RecordError(error, ...trace.EventOption) {}

// A record stored under canonicalization version 1 (before the target was
// part of the fingerprint) is compared on version 1's input after the
// upgrade: its retry replays (no 422 storm on deploy), another body is
// still a conflict. New records are version 2: the same key sent with
// another query is a conflict.
func TestVersion1RecordAfterTheTargetUpgrade(t *testing.T) {
	e := newEnv(t, nil)
	const body = `{"amount":"30.00"}`
	first := e.post("/payments", "alice", "KV1", body)
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	// Rewrite the record as version 1 wrote it: version 1's input, without
	// the target.
	_, canon, err := canonicalBody("application/json", []byte(body), nil)
	if err != nil {
		t.Fatal(err)
	}
	v1 := request{route: "POST /payments", mediaType: "application/json", tenant: e.tenant, principal: "alice"}
	sum, keyID, err := testFP.Sum(fingerprintInput(1, http.MethodPost, v1, canon))
	if err != nil {
		t.Fatal(err)
	}
	scope := Scope(e.tenant, "alice", http.MethodPost, "POST /payments")
	records := quoted(dbSchema, "consumption_records")
	e.exec(`update `+records+` set fingerprint = $2, fingerprint_key_id = $3 where scope = $1 and message_id = 'KV1'`, scope, sum, keyID)
	e.exec(`update `+e.httpTable()+` set canon_version = 1 where record_id = (select id from `+records+` where scope = $1 and message_id = 'KV1')`, scope)

	if r := e.post("/payments", "alice", "KV1", body); r.status != http.StatusCreated || !r.replayed() || !bodyEqual(r.body, first.body) {
		t.Fatalf("retry of the version 1 record: %d replayed=%v %s, want the replay of %s", r.status, r.replayed(), r.body, first.body)
	}
	if r := e.post("/payments", "alice", "KV1", `{"amount":"31.00"}`); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("version 1 record, another body: %d %s, want 422", r.status, r.body)
	}
	if r := e.post("/payments", "alice", "KV2", body); r.status != http.StatusCreated || r.replayed() {
		t.Fatalf("new key: %d %s", r.status, r.body)
	}
	if r := e.post("/payments?currency=EUR", "alice", "KV2", body); r.status != http.StatusUnprocessableEntity || r.problem(t).Type != TypeKeyReused {
		t.Fatalf("version 2 record, another query: %d replayed=%v %s, want 422", r.status, r.replayed(), r.body)
	}
	mustEqual(t, "payments rows", e.payments(), 2)
	mustEqual(t, "canon_version of the new record", e.count(`select canon_version from `+e.httpTable()+` where record_id = (select id from `+records+
		` where scope = $1 and message_id = 'KV2')`, scope), CanonicalVersion)
}

// Config.IgnoreQuery leaves a parameter out of the target: a retry that
// differs only in it is a replay; every other parameter still counts.
func TestIgnoreQueryParameters(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.IgnoreQuery = []string{"_"} })
	const body = `{"amount":"30.00"}`
	first := e.post("/payments?_=1&channel=web", "alice", "KQ", body)
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	if r := e.post("/payments?channel=web&_=2", "alice", "KQ", body); !r.replayed() || !bodyEqual(r.body, first.body) {
		t.Fatalf("retry with another cache buster: %d replayed=%v %s", r.status, r.replayed(), r.body)
	}
	if r := e.post("/payments?channel=app", "alice", "KQ", body); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("retry with another channel: %d %s, want 422", r.status, r.body)
	}
	mustEqual(t, "payments rows", e.payments(), 1)
}
