package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// trail records the steps of one test, in order, from many goroutines.
type trail struct {
	mu    sync.Mutex
	steps []string
}

func (tr *trail) add(s string) {
	tr.mu.Lock()
	tr.steps = append(tr.steps, s)
	tr.mu.Unlock()
}

func (tr *trail) get() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.steps...)
}

func (tr *trail) reset() {
	tr.mu.Lock()
	tr.steps = nil
	tr.mu.Unlock()
}

// fakeStore is a TxStore (and Store) without a database: the handler runs
// with a nil tx (or as a lease handler); its error is a retry until
// maxAttempts, then a dead letter. It records whether its own ctx (the
// claim's) had a deadline.
type fakeStore struct {
	tr          *trail
	maxAttempts int

	mu       sync.Mutex
	attempts map[string]int
}

func newFakeStore(tr *trail) *fakeStore {
	return &fakeStore{tr: tr, maxAttempts: 3, attempts: map[string]int{}}
}

func (s *fakeStore) run(ctx context.Context, msg *dedup.Message, h func(context.Context) error) dedup.Result {
	if _, ok := ctx.Deadline(); ok {
		s.tr.add("store: claim ctx has a deadline")
	}
	s.mu.Lock()
	s.attempts[msg.Identity.MessageID]++
	n := s.attempts[msg.Identity.MessageID]
	s.mu.Unlock()
	if err := h(ctx); err != nil {
		if n >= s.maxAttempts {
			return dedup.Result{Outcome: dedup.OutcomeDeadLetter, Err: err, Attempts: n, HandlerCalled: true, Reason: dedup.ReasonAttemptsExhausted}
		}
		return dedup.Result{Outcome: dedup.OutcomeRetry, Err: err, Attempts: n, HandlerCalled: true}
	}
	return dedup.Result{Outcome: dedup.OutcomeProcessed, Attempts: n, HandlerCalled: true}
}

func (s *fakeStore) Process(ctx context.Context, msg *dedup.Message, h dedup.TxHandler[pgx.Tx]) (dedup.Result, error) {
	return s.run(ctx, msg, func(ctx context.Context) error { return h(ctx, nil, msg) }), nil
}

func (s *fakeStore) ProcessBatch(ctx context.Context, msgs []*dedup.Message, h dedup.TxHandler[pgx.Tx]) ([]dedup.Result, error) {
	out := make([]dedup.Result, len(msgs))
	for i, m := range msgs {
		out[i], _ = s.Process(ctx, m, h)
	}
	return out, nil
}

func (s *fakeStore) ProcessLeased(ctx context.Context, msg *dedup.Message, h dedup.LeaseHandler, _ dedup.LeaseOptions) (dedup.Result, error) {
	return s.run(ctx, msg, func(ctx context.Context) error { return h(ctx, msg) }), nil
}

func (s *fakeStore) Reject(context.Context, *dedup.Message, string, error) (dedup.Result, error) {
	return dedup.Result{Outcome: dedup.OutcomeDeadLetter, Reason: dedup.ReasonBadInput}, nil
}

func (s *fakeStore) ValidateRetention(h time.Duration) error {
	if h > s.SucceededRetention() {
		return fmt.Errorf("%w: horizon %s", dedup.ErrRetentionTooShort, h)
	}
	return nil
}
func (s *fakeStore) MaxAttempts() int                  { return s.maxAttempts }
func (s *fakeStore) SucceededRetention() time.Duration { return 24 * time.Hour }

// trailMetrics records each counted outcome.
type trailMetrics struct{ tr *trail }

func (m trailMetrics) Delivery(_ string, o dedup.Outcome, _ dedup.MatchedBy) {
	m.tr.add("metrics " + string(o))
}

// trailLog records each log record's message at Debug and above.
type trailLog struct{ tr *trail }

func (h trailLog) Enabled(context.Context, slog.Level) bool { return true }
func (h trailLog) Handle(_ context.Context, r slog.Record) error {
	h.tr.add("log " + r.Message)
	return nil
}
func (h trailLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h trailLog) WithGroup(string) slog.Handler      { return h }

// trailTracer records span starts and ends.
type trailTracer struct {
	noop.TracerProvider
	tr *trail
}

func (p trailTracer) Tracer(string, ...trace.TracerOption) trace.Tracer { return trailSpans{tr: p.tr} }

type trailSpans struct {
	noop.Tracer
	tr *trail
}

func (t trailSpans) Start(ctx context.Context, name string, _ ...trace.SpanStartOption) (context.Context, trace.Span) {
	t.tr.add("span start")
	ctx, s := noop.NewTracerProvider().Tracer("").Start(ctx, name)
	return ctx, trailSpan{Span: s, tr: t.tr}
}

type trailSpan struct {
	trace.Span
	tr *trail
}

func (s trailSpan) End(...trace.SpanEndOption) { s.tr.add("span end") }

// named is a user middleware recording before and after next.
func named(tr *trail, name string) Middleware {
	return func(next ProcessFunc) ProcessFunc {
		return func(ctx context.Context, d *Delivery) (dedup.Result, error) {
			if _, ok := ctx.Deadline(); ok {
				tr.add(name + ": ctx has a deadline")
			}
			tr.add(name + " in")
			res, err := next(ctx, d)
			tr.add(name + " out " + string(res.Outcome))
			return res, err
		}
	}
}

func trailConsumer(t *testing.T, tr *trail, cfg Config) *Consumer {
	t.Helper()
	cfg.Scope = "s"
	if cfg.Store == nil {
		cfg.Store = newFakeStore(tr)
	}
	cfg.Metrics = trailMetrics{tr}
	cfg.Logger = slog.New(trailLog{tr})
	cfg.TracerProvider = trailTracer{tr: tr}
	cfg.CrashLoop.Off = true
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func msgDelivery(id string, off int64) Delivery {
	return Delivery{Message: &dedup.Message{Topic: "t", Payload: []byte("x")}, MessageID: id,
		Position: fmt.Sprintf("t/0/%d", off), Lane: "t/0", Offset: off}
}

// listSource hands out ds, then blocks until ctx ends; done is closed when
// every delivery was committed.
type listSource struct {
	mu   sync.Mutex
	ds   []Delivery
	left int
	done chan struct{}
	// closed is set by Close.
	closed bool
}

func newListSource(ds ...Delivery) *listSource {
	return &listSource{ds: ds, left: len(ds), done: make(chan struct{})}
}

func (s *listSource) Fetch(ctx context.Context) (Delivery, error) {
	s.mu.Lock()
	if len(s.ds) > 0 {
		d := s.ds[0]
		s.ds = s.ds[1:]
		s.mu.Unlock()
		return d, nil
	}
	s.mu.Unlock()
	<-ctx.Done()
	return Delivery{}, ctx.Err()
}

func (s *listSource) Commit(_ context.Context, done []Delivery) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range done {
		if d.Offset == 0 && s.left > 0 {
			s.left = 0
			close(s.done)
		}
	}
	return nil
}

func (s *listSource) Close() error { s.mu.Lock(); s.closed = true; s.mu.Unlock(); return nil }

// Every delivery of both drive modes runs through one chain in the
// documented order: tracing, recover, logging, metrics, Config.Middleware
// (first outermost), timeout, core; the timeout bounds the handler alone.
func TestMiddlewareOrderBothDriveModes(t *testing.T) {
	tr := &trail{}
	h := func(ctx context.Context, _ pgx.Tx, _ *dedup.Message) error {
		if _, ok := ctx.Deadline(); ok {
			tr.add("handler (bounded)")
		} else {
			tr.add("handler")
		}
		return nil
	}
	c := trailConsumer(t, tr, Config{Handler: h, MaxHandlerDuration: time.Minute,
		Middleware: []Middleware{named(tr, "first"), named(tr, "second")}})
	want := []string{"span start", "first in", "second in", "handler (bounded)", "second out processed", "first out processed",
		"metrics processed", "log idemq: delivery", "span end"}

	// Push: Pusher.Handle.
	p, err := c.Push(PushConfig{CallTimeout: time.Hour, MaxRedeliveries: 16})
	if err != nil {
		t.Fatal(err)
	}
	tr.reset()
	if v, res, err := p.Handle(context.Background(), msgDelivery("push-1", 0)); err != nil || v != Ack || res.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("push: %v %+v %v", v, res, err)
	}
	if got := tr.get(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("push order:\n got %q\nwant %q", got, want)
	}

	// Pull: Run.
	tr.reset()
	src := newListSource(msgDelivery("pull-1", 0))
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx, src) }()
	select {
	case <-src.done:
	case <-time.After(30 * time.Second):
		t.Fatal("pull delivery not committed")
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if got := tr.get(); len(got) < len(want) || strings.Join(got[:len(want)], "|") != strings.Join(want, "|") {
		t.Fatalf("pull order:\n got %q\nwant %q", got, want)
	}
}

// MaxHandlerDuration gives the handler (not the claim, not the user
// middleware) a deadline; a handler that fails after it is a failed
// attempt of class "timeout", in atomic and lease mode, and a push copy
// answers RetryLater.
func TestTimeoutMiddleware(t *testing.T) {
	slow := func(ctx context.Context) error {
		if _, ok := ctx.Deadline(); !ok {
			return errors.New("the handler got no deadline")
		}
		<-ctx.Done()
		return errors.New("query canceled") // a driver's own error after the deadline
	}
	for _, mode := range []string{"atomic", "lease"} {
		t.Run(mode, func(t *testing.T) {
			tr := &trail{}
			cfg := Config{MaxHandlerDuration: 20 * time.Millisecond, Middleware: []Middleware{named(tr, "user")}}
			if mode == "atomic" {
				cfg.Handler = func(ctx context.Context, _ pgx.Tx, _ *dedup.Message) error { return slow(ctx) }
			} else {
				cfg.LeaseHandler = func(ctx context.Context, _ *dedup.Message) error { return slow(ctx) }
			}
			c := trailConsumer(t, tr, cfg)
			p, err := c.Push(PushConfig{CallTimeout: time.Hour, MaxRedeliveries: 16})
			if err != nil {
				t.Fatal(err)
			}
			v, res, err := p.Handle(context.Background(), msgDelivery("slow", 0))
			if err != nil || v != RetryLater || res.Outcome != dedup.OutcomeRetry {
				t.Fatalf("Handle = %v %+v %v; want RetryLater, a recorded retry", v, res, err)
			}
			if !errors.Is(res.Err, context.DeadlineExceeded) || dedup.ErrorClass(res.Err) != "timeout" ||
				!strings.Contains(res.Err.Error(), "MaxHandlerDuration 20ms") || !strings.Contains(res.Err.Error(), "query canceled") {
				t.Fatalf("res.Err = %v (class %s)", res.Err, dedup.ErrorClass(res.Err))
			}
			for _, s := range tr.get() {
				if strings.Contains(s, "deadline") {
					t.Fatalf("only the handler is bounded: %s", s)
				}
			}
		})
	}
	// Without MaxHandlerDuration the handler has no deadline.
	tr := &trail{}
	c := trailConsumer(t, tr, Config{Handler: func(ctx context.Context, _ pgx.Tx, _ *dedup.Message) error {
		if _, ok := ctx.Deadline(); ok {
			return errors.New("unexpected deadline")
		}
		return nil
	}})
	if res, err := c.Handle(context.Background(), msgDelivery("free", 0)); err != nil || res.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("unbounded: %+v %v", res, err)
	}
}

// A panic below the recover middleware (a user middleware, a Metrics
// implementation) never crashes the process: the delivery answers an error
// wrapping *dedup.PanicError and is not acknowledged; the span records it.
func TestRecoverMiddleware(t *testing.T) {
	tr := &trail{}
	boom := func(ProcessFunc) ProcessFunc {
		return func(context.Context, *Delivery) (dedup.Result, error) { panic("boom") }
	}
	c := trailConsumer(t, tr, Config{Handler: func(context.Context, pgx.Tx, *dedup.Message) error { return nil },
		Middleware: []Middleware{boom}})
	p, err := c.Push(PushConfig{CallTimeout: time.Hour, MaxRedeliveries: 16})
	if err != nil {
		t.Fatal(err)
	}
	tr.reset()
	v, _, err := p.Handle(context.Background(), msgDelivery("panics", 0))
	var pe *dedup.PanicError
	if v != RetryLater || !errors.As(err, &pe) || pe.Value != "boom" {
		t.Fatalf("Handle = %v, %v; want RetryLater and a *dedup.PanicError", v, err)
	}
	for _, s := range tr.get() {
		if strings.HasPrefix(s, "metrics") {
			t.Fatalf("a panicked delivery was counted: %q", tr.get())
		}
	}
	if got := tr.get(); got[0] != "span start" || got[len(got)-1] != "span end" {
		t.Fatalf("span: %q", got)
	}

	// A panicking Metrics implementation, under the same guard.
	c2, err := New(Config{Scope: "s", Store: newFakeStore(tr), Handler: func(context.Context, pgx.Tx, *dedup.Message) error { return nil },
		Metrics: panicMetrics{}, Logger: slog.New(trailLog{tr}), CrashLoop: CrashLoopConfig{Off: true}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Handle(context.Background(), msgDelivery("metrics-panic", 0)); !errors.As(err, &pe) {
		t.Fatalf("metrics panic: %v", err)
	}
}

type panicMetrics struct{}

func (panicMetrics) Delivery(string, dedup.Outcome, dedup.MatchedBy) { panic("metrics") }

// The push entry point: one attempt per copy (RetryLater on a retry); the
// broker's last copy is retried in place until durable; copies of one
// message ID run one at a time.
func TestPusherVerdicts(t *testing.T) {
	tr := &trail{}
	var mu sync.Mutex
	fails := map[string]int{"flaky": 2}
	h := func(_ context.Context, _ pgx.Tx, m *dedup.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if fails[m.Identity.MessageID] > 0 {
			fails[m.Identity.MessageID]--
			return errors.New("downstream busy")
		}
		return nil
	}
	st := newFakeStore(tr)
	c := trailConsumer(t, tr, Config{Store: st, Handler: h, RetryInitial: time.Millisecond, RetryMax: 2 * time.Millisecond})
	p, err := c.Push(PushConfig{CallTimeout: time.Hour, MaxRedeliveries: 3})
	if err != nil {
		t.Fatal(err)
	}
	d := msgDelivery("flaky", 0)
	if v, res, err := p.Handle(context.Background(), d); err != nil || v != RetryLater || res.Attempts != 1 {
		t.Fatalf("first copy: %v %+v %v; want RetryLater after one attempt", v, res, err)
	}
	last := msgDelivery("flaky", 0)
	last.Message.ReconsumeTimes = 3
	if v, res, err := p.Handle(context.Background(), last); err != nil || v != Ack || res.Outcome != dedup.OutcomeProcessed || res.Attempts != 3 {
		t.Fatalf("last copy: %v %+v %v; want Ack after retrying in place", v, res, err)
	}
}

func TestPushConfigValidation(t *testing.T) {
	st := newFakeStore(&trail{})
	st.maxAttempts = 5
	base := Config{Scope: "s", Store: st, Handler: func(context.Context, pgx.Tx, *dedup.Message) error { return nil }}
	cases := []struct {
		name string
		cfg  func(*Config)
		pc   PushConfig
		want []string
	}{
		{"ok", nil, PushConfig{CallTimeout: time.Minute, MaxRedeliveries: 4}, nil},
		{"call timeout", nil, PushConfig{CallTimeout: time.Millisecond, MaxRedeliveries: 4}, []string{"PushConfig.CallTimeout 1ms"}},
		{"redeliveries", nil, PushConfig{CallTimeout: time.Minute, MaxRedeliveries: 3}, []string{"PushConfig.MaxRedeliveries 3", "4 deliveries", "MaxAttempts 5"}},
		{"no redeliveries", nil, PushConfig{CallTimeout: time.Minute}, []string{"PushConfig.MaxRedeliveries 0"}},
		{"handler bound", func(c *Config) { c.MaxHandlerDuration = 20 * time.Second },
			PushConfig{CallTimeout: time.Minute, DeliveriesPerCall: 4, MaxRedeliveries: 4}, []string{"MaxHandlerDuration 20s", "DeliveriesPerCall 4", "1m20s", "CallTimeout 1m0s"}},
		{"batch size", func(c *Config) { c.BatchSize = 10 }, PushConfig{CallTimeout: time.Minute, MaxRedeliveries: 4}, []string{"BatchSize 10"}},
		{"lease TTL", func(c *Config) {
			c.Handler, c.LeaseHandler, c.Lease = nil, func(context.Context, *dedup.Message) error { return nil }, dedup.LeaseOptions{TTL: 2 * time.Minute}
		}, PushConfig{CallTimeout: time.Minute, MaxRedeliveries: 4}, []string{"Lease", "2m0s", "1m0s"}},
	}
	for _, tc := range cases {
		cfg := base
		if tc.cfg != nil {
			tc.cfg(&cfg)
		}
		c, err := New(cfg)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		_, err = c.Push(tc.pc)
		if tc.want == nil {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v does not wrap ErrInvalidConfig", tc.name, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not name %q", tc.name, err, w)
			}
		}
	}
	c, _ := New(base)
	if _, err := c.Push(PushConfig{CallTimeout: time.Minute, MaxRedeliveries: 4, RedeliveryHorizon: 48 * time.Hour}); !errors.Is(err, dedup.ErrRetentionTooShort) {
		t.Errorf("horizon: %v", err)
	}
	for _, bad := range []Config{
		{MaxHandlerDuration: -time.Second},
		{Middleware: []Middleware{nil}},
		{Middleware: []Middleware{named(&trail{}, "x")}, BatchSize: 2},
	} {
		bad.Scope, bad.Store, bad.Handler = base.Scope, base.Store, base.Handler
		if _, err := New(bad); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v", bad, err)
		}
	}
}

func TestKeyLocksSerializeOneKey(t *testing.T) {
	k := keyLocks{m: map[string]*keyLock{}}
	unlock, err := k.lock(context.Background(), "U1")
	if err != nil {
		t.Fatal(err)
	}
	other, err := k.lock(context.Background(), "U2")
	if err != nil {
		t.Fatal("another key must not wait:", err)
	}
	other()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := k.lock(ctx, "U1"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second lock of U1: %v, want to wait", err)
	}
	unlock()
	unlock2, err := k.lock(context.Background(), "U1")
	if err != nil {
		t.Fatal(err)
	}
	unlock2()
	if len(k.m) != 0 {
		t.Fatalf("locks leaked: %d", len(k.m))
	}
}
