package integration

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/kafkapub"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

// obEnv is a test schema holding the dedup tables and an outbox.
type obEnv struct {
	*env
	ob *outbox.Outbox
}

func setupOutbox(t testing.TB) *obEnv {
	t.Helper()
	e := setup(t, nil)
	ob, err := outbox.New(e.pool, outbox.Config{Schema: e.schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(e.ctx); err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(e.ctx); err != nil { // idempotent
		t.Fatal(err)
	}
	return &obEnv{env: e, ob: ob}
}

func obKafkaPub(t testing.TB) *kafkapub.Publisher {
	t.Helper()
	p, err := kafkapub.New(kafkapub.Config{Brokers: kafkaBrokers(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// fastRelay is a relay config for tests: quick polls and retries.
func fastRelay(name string) outbox.RelayConfig {
	return outbox.RelayConfig{Name: name, PollInterval: 200 * time.Millisecond, RetryInitial: 100 * time.Millisecond,
		RetryMax: time.Second, MaxAttempts: 1000, ShutdownGrace: 5 * time.Second}
}

// runningRelay is a Relay.Run in the background.
type runningRelay struct {
	r      *outbox.Relay
	kill   context.CancelFunc // ends Run's context; safe from any goroutine
	cancel context.CancelFunc // owned by stop
	done   chan error
}

func (o *obEnv) startRelay(t testing.TB, pub outbox.Publisher, cfg outbox.RelayConfig) *runningRelay {
	t.Helper()
	return o.startRelayOn(t, o.ob, pub, cfg)
}

// startRelayOn is startRelay through ob (e.g. o.relayOutbox: the test's
// table through a pool of the relay's own).
func (o *obEnv) startRelayOn(t testing.TB, ob *outbox.Outbox, pub outbox.Publisher, cfg outbox.RelayConfig) *runningRelay {
	t.Helper()
	r, err := outbox.NewRelay(ob, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rr := &runningRelay{r: r, kill: cancel, cancel: cancel, done: make(chan error, 1)}
	go func() { rr.done <- r.Run(ctx) }()
	t.Cleanup(func() { rr.stop(t) })
	return rr
}

func (rr *runningRelay) stop(t testing.TB) {
	t.Helper()
	if rr.cancel == nil {
		return
	}
	rr.cancel()
	rr.cancel = nil
	select {
	case err := <-rr.done:
		if err != nil {
			t.Errorf("relay.Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("relay.Run did not return 30s after cancel")
	}
}

// tracker wraps a Publisher shared by several relays: it records every
// publish per message ID and relay, detects a row being published by two
// relays at once, and can fail envelopes (fail returns non-nil). With rounds
// set it hides the inner publisher's ChainPublisher side, so relays publish
// in rounds of one row per key.
type tracker struct {
	inner  outbox.Publisher
	fail   func(e outbox.Envelope) error
	rounds bool

	mu       sync.Mutex
	inflight map[uuid.UUID]string
	overlaps []string
	count    map[uuid.UUID]int
	byRelay  map[string]int
	failures int
}

func newTracker(inner outbox.Publisher) *tracker {
	return &tracker{inner: inner, inflight: map[uuid.UUID]string{}, count: map[uuid.UUID]int{}, byRelay: map[string]int{}}
}

// trackedChains is the ChainPublisher face of a tracker.
type trackedChains struct {
	outbox.PublisherFunc
	tr    *tracker
	relay string
}

// as returns the Publisher a relay named relay uses.
func (tr *tracker) as(relay string) outbox.Publisher {
	pf := tr.plain(relay)
	if _, ok := tr.inner.(outbox.ChainPublisher); ok && !tr.rounds {
		return trackedChains{PublisherFunc: pf, tr: tr, relay: relay}
	}
	return pf
}

func (tr *tracker) enter(relay string, envs []outbox.Envelope) (fail func(outbox.Envelope) error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, e := range envs {
		if other, ok := tr.inflight[e.ID]; ok {
			tr.overlaps = append(tr.overlaps, fmt.Sprintf("%s by %s and %s", e.ID, other, relay))
		}
		tr.inflight[e.ID] = relay
	}
	return tr.fail
}

// leave ends a publish call: acked says which envelopes were acknowledged,
// failures is how many publishes failed (rows behind a failed row of their
// chain were not attempted).
func (tr *tracker) leave(relay string, envs []outbox.Envelope, acked func(i int) bool, failures int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.failures += failures
	for i, e := range envs {
		if tr.inflight[e.ID] == relay {
			delete(tr.inflight, e.ID)
		}
		if acked(i) {
			tr.count[e.ID]++
			tr.byRelay[relay]++
		}
	}
}

// PublishChains sends each chain's prefix before its first injected failure
// to the inner ChainPublisher.
func (t trackedChains) PublishChains(ctx context.Context, chains [][]outbox.Envelope) []outbox.ChainResult {
	var all []outbox.Envelope
	for _, c := range chains {
		all = append(all, c...)
	}
	fail := t.tr.enter(t.relay, all)
	prefixes := make([][]outbox.Envelope, len(chains))
	injected := make([]error, len(chains))
	for i, c := range chains {
		prefixes[i] = c
		if fail == nil {
			continue
		}
		for j, e := range c {
			if err := fail(e); err != nil {
				prefixes[i], injected[i] = c[:j], err
				break
			}
		}
	}
	res := t.tr.inner.(outbox.ChainPublisher).PublishChains(ctx, prefixes)
	for i := range res {
		if res[i].Err == nil && res[i].Acked == len(prefixes[i]) && injected[i] != nil {
			res[i].Err = injected[i]
		}
	}
	var ackedFlat []bool
	failures := 0
	for i, c := range chains {
		for j := range c {
			ackedFlat = append(ackedFlat, j < res[i].Acked)
		}
		if res[i].Err != nil {
			failures++
		}
	}
	t.tr.leave(t.relay, all, func(i int) bool { return ackedFlat[i] }, failures)
	return res
}

func (tr *tracker) plain(relay string) outbox.PublisherFunc {
	return outbox.PublisherFunc(func(ctx context.Context, batch []outbox.Envelope) error {
		fail := tr.enter(relay, batch)
		errs := make(outbox.PublishErrors, len(batch))
		var send []outbox.Envelope
		var idx []int
		for i, e := range batch {
			if fail != nil {
				errs[i] = fail(e)
			}
			if errs[i] == nil {
				send, idx = append(send, e), append(idx, i)
			}
		}
		if len(send) > 0 {
			err := tr.inner.Publish(ctx, send)
			var pe outbox.PublishErrors
			for j, i := range idx {
				switch {
				case err == nil:
				case errors.As(err, &pe) && len(pe) == len(send):
					errs[i] = pe[j]
				default:
					errs[i] = err
				}
			}
		}
		failures := 0
		for _, err := range errs {
			if err != nil {
				failures++
			}
		}
		tr.leave(relay, batch, func(i int) bool { return errs[i] == nil }, failures)
		if failures > 0 {
			return errs
		}
		return nil
	})
}

func (tr *tracker) snapshot() (count map[uuid.UUID]int, byRelay map[string]int, overlaps []string, failures int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	count = make(map[uuid.UUID]int, len(tr.count))
	for k, v := range tr.count {
		count[k] = v
	}
	byRelay = make(map[string]int, len(tr.byRelay))
	for k, v := range tr.byRelay {
		byRelay[k] = v
	}
	return count, byRelay, append([]string(nil), tr.overlaps...), tr.failures
}

// downstream is an idemq consumer on a topic whose handler writes one effect
// row per message, in the handler's transaction.
type downstream struct {
	table   string
	group   string // the consumer group (and dedup scope)
	metrics *consumer.Counters
	mu      sync.Mutex
	calls   map[string]int
	cancel  context.CancelFunc
	done    chan error
}

func (o *obEnv) startDownstream(t testing.TB, topic string) *downstream {
	t.Helper()
	tbl := o.table(randomName("effects_"))
	o.exec(`create table ` + tbl + ` (n bigint generated always as identity primary key,
  message_id text not null, key text not null, payload text not null)`)
	group := randomName("ob-down-")
	d := &downstream{table: tbl, group: group, metrics: &consumer.Counters{}, calls: map[string]int{}, done: make(chan error, 1)}
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{Reader: kafka.ReaderConfig{
		Brokers: kafkaBrokers(t), GroupID: group, Topic: topic, StartOffset: kafka.FirstOffset,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: time.Second, RebalanceTimeout: 6 * time.Second,
		MaxWait: 100 * time.Millisecond,
	}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(consumer.Config{
		Scope: group, Store: o.store, Metrics: d.metrics,
		CommitEvery: 200, CommitInterval: 200 * time.Millisecond,
		RetryInitial: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond,
		Handler: func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
			d.mu.Lock()
			d.calls[m.Identity.MessageID]++
			d.mu.Unlock()
			_, err := tx.Exec(ctx, `insert into `+tbl+` (message_id, key, payload) values ($1, $2, $3)`,
				m.Identity.MessageID, string(m.Key), string(m.Payload))
			return err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	go func() { d.done <- c.Run(ctx, src) }()
	t.Cleanup(func() { d.stop(t) })
	return d
}

func (d *downstream) stop(t testing.TB) {
	t.Helper()
	if d.cancel == nil {
		return
	}
	d.cancel()
	d.cancel = nil
	select {
	case err := <-d.done:
		if err != nil {
			t.Errorf("downstream consumer: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Error("downstream consumer did not stop within 60s")
	}
}

func (d *downstream) callsFor(id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[id]
}

func (d *downstream) totalCalls() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, c := range d.calls {
		n += c
	}
	return n
}

// effect is one committed downstream effect, in commit order.
type effect struct {
	messageID, key, payload string
}

func (o *obEnv) effects(t testing.TB, d *downstream) []effect {
	t.Helper()
	rows, err := o.pool.Query(o.ctx, `select message_id, key, payload from `+d.table+` order by n`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (effect, error) {
		var e effect
		return e, r.Scan(&e.messageID, &e.key, &e.payload)
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// checkEffects asserts exactly-once effects for want (message ID -> key) and
// per-key order: within a key, effects appear in the order of the outbox seq.
func (o *obEnv) checkEffects(t testing.TB, d *downstream, want map[string]string) {
	t.Helper()
	eff := o.effects(t, d)
	if len(eff) != len(want) {
		t.Fatalf("downstream effects = %d, want %d", len(eff), len(want))
	}
	seqOf := map[string]int64{}
	rows, err := o.pool.Query(o.ctx, `select id::text, seq from `+pgx.Identifier{o.schema, "outbox"}.Sanitize())
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var seq int64
		if err := rows.Scan(&id, &seq); err != nil {
			t.Fatal(err)
		}
		seqOf[id] = seq
	}
	rows.Close()
	seen := map[string]bool{}
	last := map[string]int64{}
	for _, e := range eff {
		if seen[e.messageID] {
			t.Fatalf("effect for %s applied twice", e.messageID)
		}
		seen[e.messageID] = true
		k, ok := want[e.messageID]
		if !ok {
			t.Fatalf("unexpected effect for %s", e.messageID)
		}
		if k != e.key {
			t.Fatalf("effect %s has key %q, want %q", e.messageID, e.key, k)
		}
		seq := seqOf[e.messageID]
		if seq <= last[e.key] {
			t.Fatalf("key %s: row seq %d (%s) applied after seq %d: per-key order broken", e.key, seq, e.messageID, last[e.key])
		}
		last[e.key] = seq
	}
}

// obReadAll reads every message of topic (all partitions) from the start,
// returned per partition in offset order.
func obReadAll(t testing.TB, topic string, partitions int) [][]kafka.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := make([][]kafka.Message, partitions)
	for p := range partitions {
		conn, err := kafka.DialLeader(ctx, "tcp", kafkaBrokers(t)[0], topic, p)
		if err != nil {
			t.Fatal(err)
		}
		first, last, err := conn.ReadOffsets()
		_ = conn.Close()
		if err != nil {
			t.Fatal(err)
		}
		if last <= first {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: kafkaBrokers(t), Topic: topic, Partition: p, MaxWait: 100 * time.Millisecond})
		if err := r.SetOffset(first); err != nil {
			t.Fatal(err)
		}
		for {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				_ = r.Close()
				t.Fatalf("read %s/%d: %v", topic, p, err)
			}
			out[p] = append(out[p], m)
			if m.Offset >= last-1 {
				break
			}
		}
		_ = r.Close()
	}
	return out
}

func header(m kafka.Message, name string) string {
	v := ""
	for _, h := range m.Headers {
		if h.Key == name {
			v = string(h.Value)
		}
	}
	return v
}

// outboxRows returns the outbox rows of the test schema in seq order.
func (o *obEnv) outboxRows(t testing.TB) []outbox.Row {
	t.Helper()
	rows, err := o.ob.List(o.ctx, outbox.ListOptions{Limit: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

func (o *obEnv) stats(t testing.TB) outbox.Stats {
	t.Helper()
	s, err := o.ob.Stats(o.ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// addRows writes n rows over keys keys in transactions of at most 1000 rows
// and returns message ID -> key. Row i has key "key-<i mod keys>".
func (o *obEnv) addRows(t testing.TB, topic string, n, keys int, tag string) map[string]string {
	t.Helper()
	want := map[string]string{}
	for start := 0; start < n; start += 1000 {
		end := min(start+1000, n)
		msgs := make([]outbox.Message, 0, end-start)
		for i := start; i < end; i++ {
			k := fmt.Sprintf("key-%02d", i%keys)
			msgs = append(msgs, outbox.Message{Topic: topic, Key: []byte(k),
				Headers: map[string]string{"test": tag}, Payload: []byte(fmt.Sprintf(`{"key":%q,"n":%d}`, k, i))})
		}
		tx, err := o.pool.Begin(o.ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := o.ob.AddBatch(o.ctx, tx, msgs)
		if err != nil {
			_ = tx.Rollback(o.ctx)
			t.Fatal(err)
		}
		if err := tx.Commit(o.ctx); err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			want[id.String()] = string(msgs[i].Key)
		}
	}
	return want
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
