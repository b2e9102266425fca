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
