package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq/wire"
)

func env(topic, key string, n int) item {
	var k []byte
	if key != "" {
		k = []byte(key)
	}
	return item{seq: int64(n), env: Envelope{ID: uuid.Must(uuid.NewV7()), Topic: topic, Key: k, Payload: []byte(fmt.Sprint(n))}}
}

// recorder is a Publisher that records calls and fails envelopes chosen by
// fail.
type recorder struct {
	mu    sync.Mutex
	calls [][]string
	fail  func(call int, e Envelope) error
}

func (r *recorder) Publish(_ context.Context, batch []Envelope) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var names []string
	errs := make(PublishErrors, len(batch))
	failed := false
	for i, e := range batch {
		names = append(names, string(e.Key)+":"+string(e.Payload))
		if r.fail != nil {
			if errs[i] = r.fail(len(r.calls), e); errs[i] != nil {
				failed = true
			}
		}
	}
	r.calls = append(r.calls, names)
	if failed {
		return errs
	}
	return nil
}

func TestPublishChainsRoundsKeepKeyOrder(t *testing.T) {
	chains := [][]item{
		{env("t", "a", 1), env("t", "a", 3), env("t", "a", 5)},
		{env("t", "b", 2), env("t", "b", 4)},
		{env("t", "", 6)},
	}
	r := &recorder{}
	pub, failed := publishChains(context.Background(), r, chains, time.Second, nil)
	if len(failed) != 0 || len(pub) != 6 {
		t.Fatalf("published %d failed %d", len(pub), len(failed))
	}
	want := "[[a:1 b:2 :6] [a:3 b:4] [a:5]]"
	if got := fmt.Sprint(r.calls); got != want {
		t.Fatalf("rounds = %s, want %s", got, want)
	}
}

func TestPublishChainsFailureStopsItsKeyOnly(t *testing.T) {
	chains := [][]item{
		{env("t", "a", 1), env("t", "a", 3), env("t", "a", 5)},
		{env("t", "b", 2), env("t", "b", 4)},
	}
	r := &recorder{fail: func(_ int, e Envelope) error {
		if string(e.Payload) == "3" {
			return errors.New("broker said no")
		}
		return nil
	}}
	pub, failed := publishChains(context.Background(), r, chains, time.Second, nil)
	var got []string
	for _, it := range pub {
		got = append(got, string(it.env.Payload))
	}
	if strings.Join(got, ",") != "1,2,4" {
		t.Fatalf("published %v, want 1,2,4", got)
	}
	if len(failed) != 1 || string(failed[0].env.Payload) != "3" || !strings.Contains(failed[0].err.Error(), "broker said no") {
		t.Fatalf("failed = %+v", failed)
	}
	// Row 5 was never sent: it waits behind 3.
	if fmt.Sprint(r.calls) != "[[a:1 b:2] [a:3 b:4]]" {
		t.Fatalf("calls = %v", r.calls)
	}
}

func TestPublishChainsWholeBatchErrorAndPanic(t *testing.T) {
	chains := [][]item{{env("t", "a", 1), env("t", "a", 2)}, {env("t", "b", 3)}}
	pub, failed := publishChains(context.Background(), PublisherFunc(func(context.Context, []Envelope) error {
		return errors.New("connection refused")
	}), chains, time.Second, nil)
	if len(pub) != 0 || len(failed) != 2 {
		t.Fatalf("published %d failed %d, want 0 and 2 (the heads)", len(pub), len(failed))
	}
	pub, failed = publishChains(context.Background(), PublisherFunc(func(context.Context, []Envelope) error {
		panic("boom")
	}), chains, time.Second, nil)
	if len(pub) != 0 || len(failed) != 2 || !strings.Contains(failed[0].err.Error(), "panic: boom") {
		t.Fatalf("panic: published %d failed %+v", len(pub), failed)
	}
}

func TestPublishChainsShutdownIsNotAnAttempt(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	chains := [][]item{{env("t", "a", 1), env("t", "a", 2)}}
	calls := 0
	pub, failed := publishChains(ctx, PublisherFunc(func(ctx context.Context, _ []Envelope) error {
		calls++
		if calls == 2 {
			cancel()
			return ctx.Err()
		}
		return nil
	}), chains, time.Second, nil)
	if len(pub) != 1 || len(failed) != 0 {
		t.Fatalf("published %d failed %d, want 1 and 0", len(pub), len(failed))
	}
}

func TestPublishChainsTimeoutIsAFailure(t *testing.T) {
	chains := [][]item{{env("t", "a", 1)}}
	pub, failed := publishChains(context.Background(), PublisherFunc(func(ctx context.Context, _ []Envelope) error {
		<-ctx.Done()
		return ctx.Err()
	}), chains, 20*time.Millisecond, nil)
	if len(pub) != 0 || len(failed) != 1 || !errors.Is(failed[0].err, context.DeadlineExceeded) {
		t.Fatalf("published %d failed %+v", len(pub), failed)
	}
}

func TestRetryDelay(t *testing.T) {
	cases := []struct {
		attempt int
		rnd     float64
		want    time.Duration
	}{
		{1, 0.5, time.Second},
		{2, 0.5, 2 * time.Second},
		{4, 0.5, 8 * time.Second},
		{1, 0, 800 * time.Millisecond},
		{1, 0.999999, 1199999600 * time.Nanosecond},
		{20, 0.5, time.Minute},
		{20, 0.999, time.Minute}, // jitter never exceeds the cap
		{20, 0, 48 * time.Second},
		{1000, 0.5, time.Minute},
		{0, 0.5, time.Second},
	}
	for _, c := range cases {
		got := retryDelay(c.attempt, time.Second, time.Minute, c.rnd)
		if d := got - c.want; d < -time.Microsecond || d > time.Microsecond {
			t.Errorf("retryDelay(%d, rnd %v) = %s, want %s", c.attempt, c.rnd, got, c.want)
		}
	}
}

func TestPerEnvelopeMapsErrors(t *testing.T) {
	batch := make([]Envelope, 3)
	bad := errors.New("bad")
	// Wrong length: the whole batch failed.
	errs := perEnvelope(context.Background(), PublisherFunc(func(context.Context, []Envelope) error {
		return PublishErrors{nil, bad}
	}), batch)
	for i, err := range errs {
		if err == nil {
			t.Fatalf("errs[%d] nil for a malformed PublishErrors", i)
		}
	}
	errs = perEnvelope(context.Background(), PublisherFunc(func(context.Context, []Envelope) error {
		return fmt.Errorf("wrapped: %w", PublishErrors{nil, bad, nil})
	}), batch)
	if errs[0] != nil || errs[1] != bad || errs[2] != nil {
		t.Fatalf("errs = %v", errs)
	}
	pe := PublishErrors{nil, bad, errors.New("worse")}
	if !errors.Is(pe, bad) || !strings.Contains(pe.Error(), "2 of 3 failed; first: bad") {
		t.Fatalf("PublishErrors = %q", pe.Error())
	}
}

func TestConfigValidation(t *testing.T) {
	// Every error wraps ErrInvalidConfig and names the field at fault.
	for _, tc := range []struct {
		c     Config
		field string
	}{
		{Config{Schema: "Bad"}, "Schema"},
		{Config{Table: "x;drop"}, "Table"},
		{Config{Schema: strings.Repeat("a", 41)}, "Schema"},
		{Config{MessageIDHeader: "h", CausationHeader: "h"}, "CausationHeader"},
		{Config{MessageIDHeader: strings.Repeat("h", 256)}, "MessageIDHeader"},
		{Config{CausationHeader: "a\x00b"}, "CausationHeader"},
		// "-" used to mean "no causation header"; it is refused now, with a
		// pointer to the explicit field.
		{Config{CausationHeader: "-"}, "DisableCausation"},
		{Config{CausationHeader: "cause", DisableCausation: true}, "DisableCausation"},
	} {
		_, err := New(nil, tc.c)
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(fmt.Sprint(err), tc.field) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig naming %s", tc.c, err, tc.field)
		}
	}
	if c := mustNew(t, Config{}).Config(); c.MessageIDHeader != wire.MessageIDHeader || c.CausationHeader != wire.CausationHeader || c.DisableCausation {
		t.Fatalf("header defaults = %q %q %v, want the wire names", c.MessageIDHeader, c.CausationHeader, c.DisableCausation)
	}
	if c := mustNew(t, Config{DisableCausation: true}).Config(); c.CausationHeader != "" {
		t.Fatalf("CausationHeader with DisableCausation = %q, want empty", c.CausationHeader)
	}
	o, err := New(nil, Config{Schema: strings.Repeat("s", 40), Table: strings.Repeat("t", 40)})
	if err != nil {
		t.Fatal(err)
	}
	if ch := o.cfg.channel(); len(ch) != 63 || !strings.HasPrefix(ch, "idemq_outbox:sss") {
		t.Fatalf("channel %q (%d bytes)", ch, len(ch))
	}
	if ch := (Config{Schema: "idemq", Table: "outbox"}).channel(); ch != "idemq_outbox:idemq.outbox" {
		t.Fatalf("channel %q", ch)
	}
	for _, tc := range []struct {
		rc    RelayConfig
		field string
	}{
		{RelayConfig{BatchSize: -1}, "BatchSize"}, {RelayConfig{BatchSize: 10_001}, "BatchSize"},
		{RelayConfig{Workers: 65}, "Workers"}, {RelayConfig{PollInterval: time.Millisecond}, "PollInterval"},
		{RelayConfig{PublishTimeout: time.Millisecond}, "PublishTimeout"},
		{RelayConfig{StatementTimeout: time.Millisecond}, "StatementTimeout"}, {RelayConfig{StatementTimeout: 2 * time.Hour}, "StatementTimeout"},
		{RelayConfig{RetryInitial: time.Minute, RetryMax: time.Second}, "RetryMax"},
		{RelayConfig{MaxAttempts: -1}, "MaxAttempts"}, {RelayConfig{MaxErrorBytes: 10}, "MaxErrorBytes"},
		{RelayConfig{OutageBackoffInitial: time.Millisecond}, "OutageBackoffInitial"},
		{RelayConfig{OutageBackoffInitial: time.Minute, OutageBackoffMax: time.Second}, "OutageBackoffMax"},
		{RelayConfig{OutageBackoffMax: 2 * time.Hour}, "OutageBackoffMax"},
		{RelayConfig{PurgeInterval: time.Millisecond}, "PurgeInterval"}, {RelayConfig{PurgeBatch: -5}, "PurgeBatch"},
		{RelayConfig{ShutdownGrace: -time.Second}, "ShutdownGrace"}, {RelayConfig{Name: strings.Repeat("n", 256)}, "Name"},
		{RelayConfig{BatchSize: 10, MaxKeys: 11}, "MaxKeys"}, {RelayConfig{MaxKeys: -1}, "MaxKeys"},
		{RelayConfig{FallbackPollInterval: time.Millisecond}, "FallbackPollInterval"},
		{RelayConfig{PollInterval: time.Second, FallbackPollInterval: 2 * time.Second}, "FallbackPollInterval"},
		// A negative Retention used to mean "never purge": refused now, with
		// a pointer to the explicit field.
		{RelayConfig{Retention: -time.Second}, "DisablePurge"},
		{RelayConfig{DisablePurge: true, Retention: time.Hour}, "DisablePurge"},
		{RelayConfig{DisablePurge: true, PurgeInterval: time.Hour}, "DisablePurge"},
		{RelayConfig{DisablePurge: true, PurgeBatch: 10}, "DisablePurge"},
		{RelayConfig{DisablePurge: true, ShutdownGrace: -time.Second}, "ShutdownGrace"},
	} {
		err := tc.rc.withDefaults().validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(fmt.Sprint(err), tc.field) {
			t.Errorf("RelayConfig %+v: %v, want ErrInvalidConfig naming %s", tc.rc, err, tc.field)
		}
	}
	if d := (RelayConfig{DisablePurge: true}).withDefaults(); d.validate() != nil || d.Retention != 0 || d.PurgeInterval != 0 || d.PurgeBatch != 0 {
		t.Fatalf("DisablePurge: %+v, %v; want valid, with no purge settings", d, d.validate())
	}
	if _, err := NewRelay(nil, PublisherFunc(nil), RelayConfig{}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("NewRelay(nil, …) = %v, want ErrInvalidConfig", err)
	}
	d := RelayConfig{}.withDefaults()
	if d.BatchSize != 500 || d.MaxKeys != 500 || d.Workers != 1 || d.PollInterval != time.Second || d.MaxAttempts != 25 ||
		d.Retention != 24*time.Hour || d.RetryInitial != time.Second || d.RetryMax != 5*time.Minute || d.Name == "" ||
		d.OutageBackoffInitial != time.Second || d.OutageBackoffMax != time.Minute {
		t.Fatalf("defaults = %+v", d)
	}
	if err := d.validate(); err != nil {
		t.Fatal(err)
	}
	// The fallback poll defaults to 1s, never above PollInterval.
	for poll, want := range map[time.Duration]time.Duration{0: time.Second, time.Hour: time.Second, 100 * time.Millisecond: 100 * time.Millisecond} {
		if got := (RelayConfig{PollInterval: poll}).withDefaults().FallbackPollInterval; got != want {
			t.Errorf("PollInterval %s: FallbackPollInterval %s, want %s", poll, got, want)
		}
	}
	if _, err := NewRelay(o, PublisherFunc(nil), RelayConfig{}); !errors.Is(err, ErrNoPool) {
		t.Fatalf("NewRelay without pool: %v", err)
	}
}

func TestMessageValidation(t *testing.T) {
	o, _ := New(nil, Config{})
	ok := Message{Topic: "orders", Key: []byte("k"), Headers: map[string]string{"trace": "x"}, Payload: []byte("{}")}
	if err := o.validate(&ok); err != nil {
		t.Fatal(err)
	}
	bad := []Message{
		{},
		{Topic: strings.Repeat("t", 250)},
		{Topic: "a\x00b"},
		{Topic: "t", Key: make([]byte, MaxKeyBytes+1)},
		{Topic: "t", Headers: map[string]string{"": "x"}},
		{Topic: "t", Headers: map[string]string{"h": "a\x00"}},
		{Topic: "t", Headers: map[string]string{wire.MessageIDHeader: "mine"}},
		{Topic: "t", Headers: map[string]string{wire.CausationHeader: "mine"}},
		{Topic: "t", CausationID: string([]byte{0xff})},
		{Topic: "t", Delay: -time.Second},
	}
	for _, m := range bad {
		if err := o.validate(&m); !errors.Is(err, ErrInvalidMessage) {
			t.Errorf("validate(%+v) = %v, want ErrInvalidMessage", m, err)
		}
	}
	if _, err := o.AddBatch(context.Background(), nil, []Message{ok}); !errors.Is(err, ErrNilTx) {
		t.Fatalf("nil tx: %v", err)
	}
	noCause := mustNew(t, Config{DisableCausation: true})
	if err := noCause.validate(&Message{Topic: "t", Headers: map[string]string{wire.CausationHeader: "free"}}); err != nil {
		t.Fatalf("causation header free when disabled: %v", err)
	}
	// With DisableCausation the envelope carries no causation header, and
	// the row's own header of that name (allowed above) passes through.
	env := noCause.Envelope(Row{Topic: "t", CausationID: "s/m-1", Headers: map[string]string{"h": "v"}})
	if _, ok := env.Headers[wire.CausationHeader]; ok || env.Headers["h"] != "v" || env.Headers[wire.MessageIDHeader] == "" {
		t.Fatalf("envelope headers with DisableCausation = %v", env.Headers)
	}
	env = mustNew(t, Config{}).Envelope(Row{Topic: "t", CausationID: "s/m-1"})
	if env.Headers[wire.CausationHeader] != "s/m-1" {
		t.Fatalf("envelope headers = %v, want the causation header", env.Headers)
	}
}

func TestClip(t *testing.T) {
	if got := clip("héllo wörld", 8); got != "héll…" {
		t.Fatalf("clip = %q", got)
	}
	if got := clip("a\x00b", 10); got != "a\uFFFDb" {
		t.Fatalf("clip = %q", got)
	}
}

func TestBuildChains(t *testing.T) {
	f := func(it item, ready bool) follower { return follower{item: it, ready: ready} }
	heads := []item{env("t", "a", 1), env("t", "b", 2), env("t", "", 3), env("u", "a", 4)}
	chains := buildChains(heads, []follower{
		f(env("t", "a", 5), true),
		f(env("t", "b", 6), false), // delayed: holds b back
		f(env("t", "a", 7), true),
		f(env("t", "b", 8), true), // behind the delayed row: not taken
		f(env("u", "a", 9), true), // same key, other topic: its own chain
		f(env("t", "zz", 10), true),
	})
	var got []string
	for _, c := range chains {
		var s []string
		for _, it := range c {
			s = append(s, fmt.Sprint(it.seq))
		}
		got = append(got, strings.Join(s, ","))
	}
	if want := "1,5,7|2|3|4,9"; strings.Join(got, "|") != want {
		t.Fatalf("chains = %s, want %s", strings.Join(got, "|"), want)
	}
}

// chainPub is a ChainPublisher double.
type chainPub struct {
	PublisherFunc
	res func(chains [][]Envelope) []ChainResult
}

func (c chainPub) PublishChains(_ context.Context, chains [][]Envelope) []ChainResult {
	return c.res(chains)
}

func TestPublishChainsUsesChainPublisher(t *testing.T) {
	chains := [][]item{
		{env("t", "a", 1), env("t", "a", 2), env("t", "a", 3)},
		{env("t", "b", 4), env("t", "b", 5)},
		{env("t", "", 6)},
	}
	calls := 0
	cp := chainPub{res: func(cs [][]Envelope) []ChainResult {
		calls++
		if len(cs) != 3 || len(cs[0]) != 3 {
			t.Fatalf("chains %v", cs)
		}
		return []ChainResult{{Acked: 1, Err: errors.New("timeout")}, {Acked: 2}, {Acked: 0, Err: errors.New("no leader")}}
	}}
	pub, failed := publishChains(context.Background(), cp, chains, time.Second, nil)
	var got []string
	for _, it := range pub {
		got = append(got, string(it.env.Payload))
	}
	if calls != 1 || strings.Join(got, ",") != "1,4,5" {
		t.Fatalf("calls %d published %v", calls, got)
	}
	if len(failed) != 2 || string(failed[0].env.Payload) != "2" || string(failed[1].env.Payload) != "6" {
		t.Fatalf("failed %+v", failed)
	}
	// Malformed results and panics fail every chain.
	bad := chainPub{res: func([][]Envelope) []ChainResult { return nil }}
	if pub, failed := publishChains(context.Background(), bad, chains, time.Second, nil); len(pub) != 0 || len(failed) != 3 {
		t.Fatalf("malformed: %d %d", len(pub), len(failed))
	}
	boom := chainPub{res: func([][]Envelope) []ChainResult { panic("boom") }}
	if pub, failed := publishChains(context.Background(), boom, chains, time.Second, nil); len(pub) != 0 || len(failed) != 3 {
		t.Fatalf("panic: %d %d", len(pub), len(failed))
	}
	// An acked prefix without an error still fails the next row.
	silent := chainPub{res: func([][]Envelope) []ChainResult { return []ChainResult{{Acked: 1}, {Acked: 2}, {Acked: 1}} }}
	if _, failed := publishChains(context.Background(), silent, chains, time.Second, nil); len(failed) != 1 || failed[0].err == nil {
		t.Fatalf("silent partial: %+v", failed)
	}
}

func mustNew(t *testing.T, c Config) *Outbox {
	t.Helper()
	o, err := New(nil, c)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// trim keeps the chains whose heads have been due the longest, in seq
// order, and cuts followers (never a head) to the row limit.
func TestTrimKeepsLongestDue(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	mk := func(seq int64, due time.Duration, followers int) []item {
		c := []item{{seq: seq, dueAt: t0.Add(due)}}
		for i := range followers {
			c = append(c, item{seq: seq + 100 + int64(i), dueAt: t0})
		}
		return c
	}
	// Seq 1 and 2 are old heads due again late (retried); 5 and 6 were
	// due earlier.
	chains := [][]item{mk(1, 9*time.Second, 2), mk(2, 8*time.Second, 2), mk(5, time.Second, 1), mk(6, 2*time.Second, 0)}
	got := trim(chains, 3, 4)
	var heads []int64
	rows := 0
	for _, c := range got {
		heads = append(heads, c[0].seq)
		rows += len(c)
	}
	if !slices.Equal(heads, []int64{2, 5, 6}) || rows != 4 {
		t.Fatalf("trim kept heads %v, %d rows; want [2 5 6] (due the longest, in seq order) and 4 rows", heads, rows)
	}
	if got := trim([][]item{mk(1, 0, 3)}, 3, 10); len(got) != 1 || len(got[0]) != 4 {
		t.Fatalf("trim under the limits changed the chains: %v", got)
	}
}
