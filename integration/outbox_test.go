package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/wire"
	"github.com/jackc/pgx/v5"
)

// invoiceHandler is the S15 upstream handler: one invoice row and two
// outbox rows E1, E2 per call, all in the handler's transaction.
type invoiceHandler struct {
	o     *obEnv
	topic string
	calls atomic.Int64
	ids   [][]uuid.UUID
	mu    sync.Mutex
}

func (h *invoiceHandler) handle(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
	h.calls.Add(1)
	if _, err := tx.Exec(ctx, `insert into `+h.o.table("invoices")+` (message_id, body) values ($1, $2)`,
		m.Identity.MessageID, string(m.Payload)); err != nil {
		return err
	}
	ids, err := h.o.ob.AddBatch(ctx, tx, []outbox.Message{
		{Topic: h.topic, Key: []byte("invoice-1000"), Payload: []byte(`{"event":"E1","invoice":"invoice-1000"}`), CausationID: outbox.Causation(m)},
		{Topic: h.topic, Key: []byte("invoice-1000"), Payload: []byte(`{"event":"E2","invoice":"invoice-1000"}`), CausationID: outbox.Causation(m)},
	})
	if err == nil {
		h.mu.Lock()
		h.ids = append(h.ids, ids)
		h.mu.Unlock()
	}
	return err
}

// S15: a duplicate input publishes nothing new.
func TestOutboxS15DuplicateInputPublishesNothingNew(t *testing.T) {
	t.Parallel()
	for _, variant := range []string{"redelivered after the relay ran", "redelivered before the relay ran"} {
		t.Run(variant, func(t *testing.T) {
			t.Parallel()
			before := strings.Contains(variant, "before")
			o := setupOutbox(t)
			o.exec(`create table ` + o.table("invoices") + ` (message_id text not null, body text not null)`)
			topic := newTopic(t, 3)
			h := &invoiceHandler{o: o, topic: topic}
			in := msg(t, "billing", "m-1000", "", `{"invoice":"invoice-1000","amount":"12.50"}`)
			res, err := o.store.Process(o.ctx, in, h.handle)
			if err != nil || res.Outcome != dedup.OutcomeProcessed {
				t.Fatalf("first delivery: %+v %v", res, err)
			}
			redeliver := func() {
				t.Helper()
				res, err := o.store.Process(o.ctx, msg(t, "billing", "m-1000", "", `{"invoice":"invoice-1000","amount":"12.50"}`), h.handle)
				if err != nil || res.Outcome != dedup.OutcomeDuplicate || res.HandlerCalled {
					t.Fatalf("redelivery: %+v %v", res, err)
				}
			}
			if before {
				redeliver()
			}
			down := o.startDownstream(t, topic)
			tr := newTracker(obKafkaPub(t))
			relayOb, polls := o.polledOutbox(t)
			rr := o.startRelayOn(t, relayOb, tr.as("relay-a"), fastRelay("relay-a"))
			e1, e2 := h.ids[0][0].String(), h.ids[0][1].String()
			eventually(t, 60*time.Second, "E1 and E2 downstream", func() bool { return down.totalCalls() >= 2 })
			if !before {
				redeliver()
			}
			// A republish, if one were to happen, is on the topic and
			// handled downstream before the checks: both rows are marked,
			// the relay has been through the table twice more since the
			// redelivery and is stopped (nothing more can be published),
			// and the downstream group has caught up with the topic.
			eventually(t, 60*time.Second, "E1 and E2 marked", func() bool { return o.stats(t).Published >= 2 })
			polls.waitMore(t, 2, "two relay polls after the redelivery")
			rr.stop(t)
			down.settle(t, topic)

			if got := h.calls.Load(); got != 1 {
				t.Fatalf("upstream handler calls = %d, want 1", got)
			}
			if n := o.count(`select count(*) from ` + o.table("outbox")); n != 2 {
				t.Fatalf("outbox rows = %d, want 2", n)
			}
			if n := o.count(`select count(*) from ` + o.table("invoices")); n != 1 {
				t.Fatalf("invoices = %d, want 1", n)
			}
			if down.callsFor(e1) != 1 || down.callsFor(e2) != 1 || down.totalCalls() != 2 {
				t.Fatalf("downstream calls E1 %d E2 %d total %d, want 1 1 2", down.callsFor(e1), down.callsFor(e2), down.totalCalls())
			}
			o.checkEffects(t, down, map[string]string{e1: "invoice-1000", e2: "invoice-1000"})
			var onTopic int
			for _, p := range obReadAll(t, topic, 3) {
				onTopic += len(p)
			}
			if onTopic != 2 {
				t.Fatalf("messages on %s = %d, want 2", topic, onTopic)
			}
			for _, r := range o.outboxRows(t) {
				if r.PublishedAt == nil || r.CausationID != "billing/m-1000" {
					t.Fatalf("row %s: published %v causation %q", r.ID, r.PublishedAt, r.CausationID)
				}
			}
		})
	}
}

// S16: published, but marking failed.
func TestOutboxS16PublishedButMarkFailed(t *testing.T) {
	t.Parallel()
	t.Run("relay restarts", func(t *testing.T) {
		t.Parallel()
		o := setupOutbox(t)
		topic := newTopic(t, 3)
		down := o.startDownstream(t, topic)
		ids := o.addE7E8(t, topic)
		e7, e8 := ids[0], ids[1]

		var fired atomic.Int32
		tr := newTracker(obKafkaPub(t))
		cfg := fastRelay("relay-1")
		cfg.BatchSize = 1 // E7 alone: the failed mark is E7's
		// The relay "dies" right after E7's publish, before its mark: its
		// claim transaction's backend is terminated and its context ends,
		// so it claims nothing more.
		var r1 *runningRelay
		var r1Ready = make(chan struct{})
		app := randomName("relay-1-")
		ml := &markLoss{o: o, app: app, id: e7, fired: &fired, onFire: func() { <-r1Ready; r1.kill() }}
		r1 = o.startRelayOn(t, o.relayOutbox(t, app), ml.wrap(tr.as("relay-1")), cfg)
		close(r1Ready)
		eventually(t, 30*time.Second, "E7 published and its claim transaction broken", func() bool { return fired.Load() == 2 })
		r1.stop(t)
		ml.check(t)
		row, err := o.ob.Get(o.ctx, e7)
		if err != nil || row.PublishedAt != nil {
			t.Fatalf("E7 after the failed mark: published_at %v, err %v; want unpublished", row.PublishedAt, err)
		}
		// Failed publishes before the lost one count (a fresh topic can
		// answer NOT_LEADER_OR_FOLLOWER once); the lost publish does not.
		attemptsBefore := row.Attempts
		if st := r1.r.Stats(); st.DBErrors < 1 || st.Published != 0 {
			t.Fatalf("relay-1 stats %+v, want a lost batch and nothing marked", st)
		}

		cfg2 := fastRelay("relay-2")
		cfg2.BatchSize = 1
		r2 := o.startRelay(t, tr.as("relay-2"), cfg2)
		eventually(t, 30*time.Second, "E7 and E8 marked", func() bool { return o.stats(t).Published == 2 })
		eventually(t, 60*time.Second, "E7 and E8 downstream", func() bool { return down.totalCalls() >= 2 })
		r2.stop(t)
		down.settle(t, topic)

		o.checkS16(t, topic, down, tr, e7, e8)
		row7, _ := o.ob.Get(o.ctx, e7)
		if row7.PublishedBy != "relay-2" || row7.Attempts != attemptsBefore+1 {
			t.Fatalf("E7 published_by %q attempts %d, want relay-2 and %d (failed attempts before %d, plus relay-2's publish; the lost publish is not counted)",
				row7.PublishedBy, row7.Attempts, attemptsBefore+1, attemptsBefore)
		}
	})
	t.Run("two relays", func(t *testing.T) {
		t.Parallel()
		o := setupOutbox(t)
		topic := newTopic(t, 3)
		down := o.startDownstream(t, topic)
		// Background rows on other keys keep both relays busy around E7.
		want := o.addRows(t, topic, 300, 10, "background")
		ids := o.addE7E8(t, topic)
		e7, e8 := ids[0], ids[1]
		want[e7.String()], want[e8.String()] = "order-7", "order-7"
		want2 := o.addRows(t, topic, 300, 10, "background-2")
		for k, v := range want2 {
			want[k] = v
		}

		var fired atomic.Int32
		tr := newTracker(obKafkaPub(t))
		tr.rounds = true // this test covers the rounds path (plain Publishers)
		var losses []*markLoss
		for _, name := range []string{"relay-a", "relay-b"} {
			cfg := fastRelay(name)
			cfg.BatchSize, cfg.MaxKeys = 20, 4
			app := randomName(name + "-")
			ml := &markLoss{o: o, app: app, id: e7, fired: &fired}
			losses = append(losses, ml)
			o.startRelayOn(t, o.relayOutbox(t, app), ml.wrap(tr.as(name)), cfg)
		}
		eventually(t, 60*time.Second, "all rows marked", func() bool { return o.stats(t).Published == int64(len(want)) })
		eventually(t, 120*time.Second, "all rows downstream", func() bool { return down.totalCalls() >= len(want) })
		down.settle(t, topic)
		if fired.Load() != 2 {
			t.Fatal("the mark of E7's batch was never broken")
		}
		for _, ml := range losses {
			ml.check(t)
		}
		o.checkS16(t, topic, down, tr, e7, e8)
		o.checkEffects(t, down, want)
		_, byRelay, _, _ := tr.snapshot()
		t.Logf("publishes by relay: %v; downstream duplicates absorbed: %d", byRelay, down.metrics.Get("duplicate"))
		if len(byRelay) < 2 {
			t.Fatalf("publishes by relay = %v: both relays must have published for the overlap check to mean anything", byRelay)
		}
	})
}

// addE7E8 writes E7 then E8 with key order-7 in one transaction.
func (o *obEnv) addE7E8(t testing.TB, topic string) []uuid.UUID {
	t.Helper()
	tx, err := o.pool.Begin(o.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(o.ctx) }()
	ids, err := o.ob.AddBatch(o.ctx, tx, []outbox.Message{
		{Topic: topic, Key: []byte("order-7"), Headers: map[string]string{"event": "E7"}, Payload: []byte(`{"event":"E7","order":"order-7","status":"paid"}`)},
		{Topic: topic, Key: []byte("order-7"), Headers: map[string]string{"event": "E8"}, Payload: []byte(`{"event":"E8","order":"order-7","status":"shipped"}`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(o.ctx); err != nil {
		t.Fatal(err)
	}
	return ids
}

// checkS16 asserts the S16 expectations on the topic and downstream.
func (o *obEnv) checkS16(t testing.TB, topic string, down *downstream, tr *tracker, e7, e8 uuid.UUID) {
	t.Helper()
	count, _, overlaps, _ := tr.snapshot()
	if len(overlaps) > 0 {
		t.Fatalf("rows published by two relays at once: %v", overlaps)
	}
	if count[e7] < 2 || count[e8] < 1 {
		t.Fatalf("publishes: E7 %d E8 %d, want E7 at least 2 (published, mark lost, republished) and E8 at least 1", count[e7], count[e8])
	}
	// On the topic: E7's copies are identical (message ID, key, headers,
	// value), and E8 comes after E7's first copy, in the same partition.
	var e7Copies, e8Copies []int64
	var first7, first8 int64 = -1, -1
	p7, p8 := -1, -1
	var ref []byte
	for pi, part := range obReadAll(t, topic, 3) {
		for _, m := range part {
			switch header(m, wire.MessageIDHeader) {
			case e7.String():
				if string(m.Key) != "order-7" || header(m, "event") != "E7" {
					t.Fatalf("E7 copy at offset %d: key %q event %q", m.Offset, m.Key, header(m, "event"))
				}
				b := []byte(fmt.Sprintf("%s|%v|%s", m.Key, m.Headers, m.Value))
				if ref == nil {
					ref = b
				} else if !bytes.Equal(ref, b) {
					t.Fatalf("E7 copies differ:\n%s\n%s", ref, b)
				}
				e7Copies = append(e7Copies, m.Offset)
				p7 = pi
				if first7 < 0 {
					first7 = m.Offset
				}
			case e8.String():
				p8 = pi
				e8Copies = append(e8Copies, m.Offset)
				if first8 < 0 {
					first8 = m.Offset
				}
			}
		}
	}
	// Every publish round of key order-7 writes E7 before E8: the i-th copy
	// of E8 follows the i-th copy of E7, in the same partition. (A lost mark
	// can republish both, so E7, E8, E7, E8 is in order; E8 before any E7,
	// or an E8 copy without an earlier E7 copy of its round, is not.)
	inOrder := len(e7Copies) >= 2 && len(e8Copies) >= 1 && p7 == p8 && len(e8Copies) <= len(e7Copies)
	for i := 0; inOrder && i < len(e8Copies); i++ {
		inOrder = e7Copies[i] < e8Copies[i] && (i+1 >= len(e7Copies) || e8Copies[i] < e7Copies[i+1] || i+1 >= len(e8Copies))
	}
	if !inOrder {
		t.Fatalf("E7 copies at offsets %v (partition %d), E8 copies at %v (partition %d): want at least 2 copies of E7 and each copy of E8 after the matching copy of E7, in one partition", e7Copies, p7, e8Copies, p8)
	}
	if down.callsFor(e7.String()) != 1 || down.callsFor(e8.String()) != 1 {
		t.Fatalf("downstream handler: E7 %d calls, E8 %d calls; want 1 and 1", down.callsFor(e7.String()), down.callsFor(e8.String()))
	}
	if d := down.metrics.Get("duplicate"); d < 1 {
		t.Fatalf("downstream duplicates = %d, want at least 1 (E7's republish)", d)
	}
	eff := o.effects(t, down)
	i7, i8 := -1, -1
	for i, e := range eff {
		switch e.messageID {
		case e7.String():
			i7 = i
		case e8.String():
			i8 = i
		}
	}
	if i7 < 0 || i8 < 0 || i8 < i7 {
		t.Fatalf("downstream effects: E7 at %d, E8 at %d; want E7 before E8", i7, i8)
	}
}

// A handler that adds outbox rows and then fails leaves no row, and the
// relay publishes nothing.
func TestOutboxRollbackLeavesNoRow(t *testing.T) {
	t.Parallel()
	o := setupOutbox(t)
	topic := newTopic(t, 1)
	calls := 0
	failing := func(fail error) pgstore.Handler {
		return func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
			calls++
			for i := range 3 {
				if _, err := outboxAdd(ctx, o, tx, outbox.Message{Topic: topic, Key: []byte("k"), Payload: []byte(fmt.Sprint(i))}); err != nil {
					return err
				}
			}
			return fail
		}
	}
	res, err := o.store.Process(o.ctx, msg(t, "orders", "m-rb-1", "", "x"), failing(errors.New("inventory service timeout")))
	if err != nil || res.Outcome != dedup.OutcomeRetry {
		t.Fatalf("retryable: %+v %v", res, err)
	}
	res, err = o.store.Process(o.ctx, msg(t, "orders", "m-rb-2", "", "x"), failing(dedup.Permanent(errors.New("order invalid"))))
	if err != nil || res.Outcome != dedup.OutcomeDeadLetter {
		t.Fatalf("permanent: %+v %v", res, err)
	}
	res, err = o.store.Process(o.ctx, msg(t, "orders", "m-rb-3", "", "x"), func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
		calls++
		if _, err := o.ob.Add(ctx, tx, outbox.Message{Topic: topic, Payload: []byte("p")}); err != nil {
			return err
		}
		panic("handler bug")
	})
	if err != nil || res.Outcome != dedup.OutcomeRetry {
		t.Fatalf("panic: %+v %v", res, err)
	}
	if calls != 3 {
		t.Fatalf("handler calls = %d", calls)
	}
	if n := o.count(`select count(*) from ` + o.table("outbox")); n != 0 {
		t.Fatalf("outbox rows after rollbacks = %d, want 0", n)
	}
	tr := newTracker(obKafkaPub(t))
	r, err := outbox.NewRelay(o.ob, tr.as("relay"), fastRelay("relay"))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := r.RunOnce(o.ctx); err != nil || b != (outbox.BatchResult{}) {
		t.Fatalf("RunOnce = %+v, %v; want nothing", b, err)
	}
	// A running relay publishes nothing either: a sentinel row committed
	// after the rollbacks is the only row it ever publishes (its mark is
	// the durable proof that the relay has been through the table).
	rr := o.startRelay(t, tr.as("relay-run"), fastRelay("relay-run"))
	tx, err := o.pool.Begin(o.ctx)
	if err != nil {
		t.Fatal(err)
	}
	sentinel, err := o.ob.Add(o.ctx, tx, outbox.Message{Topic: topic, Payload: []byte("sentinel")})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(o.ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the sentinel row published", func() bool { return o.stats(t).Published == 1 })
	rr.stop(t)
	count, _, _, _ := tr.snapshot()
	if len(count) != 1 || count[sentinel] != 1 {
		t.Fatalf("published %v, want only the sentinel %s", count, sentinel)
	}
	if msgs := obReadAll(t, topic, 1); len(msgs[0]) != 1 || string(msgs[0][0].Value) != "sentinel" {
		t.Fatalf("topic holds %d messages, want only the sentinel", len(msgs[0]))
	}
}

// outboxAdd is Add through a *obEnv's outbox (kept as a function so the
// rollback test reads like a handler).
func outboxAdd(ctx context.Context, o *obEnv, tx pgx.Tx, m outbox.Message) (uuid.UUID, error) {
	return o.ob.Add(ctx, tx, m)
}

// Two relays, 10,000 rows over 50 keys: every row published, per-key order
// at the consumer, never one row published by both relays at once, effects
// exactly once.
func TestRelayTwoRelays10000RowsOver50Keys(t *testing.T) {
	t.Parallel()
	o := setupOutbox(t)
	topic := newTopic(t, 3)
	down := o.startDownstream(t, topic)
	want := o.addRows(t, topic, 10_000, 50, "bulk")
	tr := newTracker(obKafkaPub(t))
	start := time.Now()
	var relays []*runningRelay
	for _, name := range []string{"relay-a", "relay-b"} {
		cfg := fastRelay(name)
		cfg.BatchSize, cfg.MaxKeys = 250, 20 // 50 keys: both relays get work
		relays = append(relays, o.startRelay(t, tr.as(name), cfg))
	}
	eventually(t, 120*time.Second, "10,000 rows marked", func() bool { return o.stats(t).Published == 10_000 })
	relayed := time.Since(start)
	eventually(t, 240*time.Second, "10,000 effects downstream", func() bool { return down.totalCalls() >= 10_000 })
	consumed := time.Since(start)
	// Final counts: the relays are stopped (they publish nothing more) and
	// the downstream group has handled every copy on the topic.
	for _, r := range relays {
		r.stop(t)
	}
	down.settle(t, topic)

	count, byRelay, overlaps, failures := tr.snapshot()
	for _, name := range []string{"relay-a", "relay-b"} {
		if byRelay[name] == 0 {
			t.Fatalf("publishes by relay = %v: %s published nothing", byRelay, name)
		}
	}
	if len(overlaps) > 0 {
		t.Fatalf("%d rows published by two relays at once, e.g. %s", len(overlaps), overlaps[0])
	}
	republished := 0
	for _, id := range sortedKeys(want) {
		n := count[uuid.MustParse(id)]
		if n < 1 {
			t.Fatalf("row %s never published", id)
		}
		if n > 1 {
			republished++
		}
	}
	o.checkEffects(t, down, want)
	if got := down.totalCalls(); got != 10_000 {
		t.Fatalf("downstream handler calls = %d, want 10000", got)
	}
	if s := o.stats(t); s.Pending != 0 || s.Parked != 0 || s.Published != 10_000 {
		t.Fatalf("outbox stats %+v", s)
	}
	t.Logf("relayed 10,000 rows in %s (%.0f rows/s), consumed in %s; publishes by relay %v; republished %d; publish failures %d; downstream duplicates %d",
		relayed.Round(time.Millisecond), 10_000/relayed.Seconds(), consumed.Round(time.Millisecond), byRelay, republished, failures, down.metrics.Get("duplicate"))
}

// The broker is unreachable while rows are relayed (a Publisher wrapper fails
// every publish, as a relay sees a down broker), and flaky before and after:
// rows wait and retry, nothing is lost or parked, order per key holds,
// effects exactly once. The outage lasts until the head of every key has
// failed outageFailures times (its retry delay grown to RetryMax, a few
// seconds of outage), counted on the rows, not on a clock.
func TestRelayBrokerOutage(t *testing.T) {
	t.Parallel()
	o := setupOutbox(t)
	topic := newTopic(t, 3)
	down := o.startDownstream(t, topic)
	var outage atomic.Bool
	var flakes atomic.Int64
	tr := newTracker(obKafkaPub(t))
	seen := sync.Map{}
	tr.fail = func(e outbox.Envelope) error {
		if outage.Load() {
			return errors.New("dial tcp 127.0.0.1:9092: connect: connection refused (simulated outage)")
		}
		// Flaky outside the outage: the first publish of rows whose n ends
		// in 1 or 8 fails ('1' and '8' are 0 mod 7).
		if e.Headers["test"] == "during" {
			return nil
		}
		if _, again := seen.LoadOrStore(e.ID, true); !again && e.Payload[len(e.Payload)-2]%7 == 0 {
			flakes.Add(1)
			return errors.New("NOT_ENOUGH_REPLICAS (simulated)")
		}
		return nil
	}
	cfg := fastRelay("relay-a")
	cfg.BatchSize, cfg.MaxKeys = 100, 10
	cfg.RetryInitial, cfg.RetryMax = 200*time.Millisecond, 2*time.Second
	cfg.MaxAttempts = 50
	r := o.startRelay(t, tr.as("relay-a"), cfg)
	cfgB := cfg
	cfgB.Name = "relay-b"
	rB := o.startRelay(t, tr.as("relay-b"), cfgB)

	want := o.addRows(t, topic, 500, 20, "before")
	eventually(t, 60*time.Second, "first wave marked", func() bool { return o.stats(t).Published == 500 })

	outage.Store(true)
	outageStart := time.Now()
	during := o.addRows(t, topic, 500, 20, "during")
	for k, v := range during {
		want[k] = v
	}
	// 200ms, 400ms, 800ms, 1.6s, then RetryMax (2s): by its 5th failure a
	// head waits RetryMax between tries. Rows behind a failed head are not
	// tried, so the heads carry the attempts.
	const outageFailures = 5
	eventually(t, 120*time.Second, fmt.Sprintf("every key's head failed %d times in the outage", outageFailures), func() bool {
		heads := map[string]bool{}
		for _, row := range o.outboxRows(t) {
			if row.PublishedAt != nil || heads[string(row.Key)] {
				continue
			}
			heads[string(row.Key)] = true
			if row.Attempts < outageFailures || !strings.Contains(row.LastError, "simulated outage") {
				return false
			}
		}
		return len(heads) == 20
	})
	s := o.stats(t)
	var waiting, withError int
	for _, row := range o.outboxRows(t) {
		if row.PublishedAt == nil {
			waiting++
			if row.Attempts > 0 && strings.Contains(row.LastError, "simulated outage") {
				withError++
			}
		}
	}
	if s.Pending != 500 || s.Parked != 0 || withError == 0 {
		t.Fatalf("after an outage of %s: stats %+v, %d waiting, %d with the outage error", time.Since(outageStart).Round(time.Millisecond), s, waiting, withError)
	}
	outage.Store(false)
	outageEnd := time.Now()
	outageLasted := outageEnd.Sub(outageStart)
	after := o.addRows(t, topic, 200, 20, "after")
	for k, v := range after {
		want[k] = v
	}
	eventually(t, 60*time.Second, "all rows marked after the outage", func() bool { return o.stats(t).Published == int64(len(want)) })
	recovered := time.Since(outageEnd)
	eventually(t, 120*time.Second, "all effects downstream", func() bool { return down.totalCalls() >= len(want) })
	// Final counts: both relays are stopped (they publish nothing more) and
	// the downstream group has handled every copy on the topic.
	r.stop(t)
	rB.stop(t)
	down.settle(t, topic)

	_, _, overlaps, failures := tr.snapshot()
	if len(overlaps) > 0 {
		t.Fatalf("rows published by two relays at once: %v", overlaps[:1])
	}
	if s := o.stats(t); s.Parked != 0 || s.Pending != 0 {
		t.Fatalf("final stats %+v", s)
	}
	o.checkEffects(t, down, want)
	if got := down.totalCalls(); got != len(want) {
		t.Fatalf("downstream handler calls = %d, want %d", got, len(want))
	}
	t.Logf("outage %s; publish failures %d (flaky %d); caught up %s after the outage; relay-a stats %+v",
		outageLasted.Round(time.Millisecond), failures, flakes.Load(), recovered.Round(time.Millisecond), r.r.Stats())
}

// Rows that keep failing are parked with their error, hold back their key,
// and are published, in order, after Unpark. Other keys flow meanwhile.
func TestRelayParksAndUnparks(t *testing.T) {
	t.Parallel()
	o := setupOutbox(t)
	topic := newTopic(t, 1)
	var broken atomic.Bool
	broken.Store(true)
	tr := newTracker(obKafkaPub(t))
	tr.fail = func(e outbox.Envelope) error {
		if broken.Load() && string(e.Key) == "key-00" {
			return errors.New("MESSAGE_TOO_LARGE (simulated)")
		}
		return nil
	}
	cfg := fastRelay("relay")
	cfg.RetryInitial, cfg.RetryMax, cfg.MaxAttempts = 10*time.Millisecond, 20*time.Millisecond, 3
	relayOb, polls := o.polledOutbox(t)
	r := o.startRelayOn(t, relayOb, tr.as("relay"), cfg)
	want := o.addRows(t, topic, 20, 2, "park") // key-00 and key-01, 10 rows each
	eventually(t, 30*time.Second, "key-00's head parked and key-01 published", func() bool {
		s := o.stats(t)
		return s.Parked == 1 && s.Published == 10
	})
	parked, err := o.ob.Parked(o.ctx, 10)
	if err != nil || len(parked) != 1 || parked[0].Attempts != 3 || !strings.Contains(parked[0].LastError, "MESSAGE_TOO_LARGE") {
		t.Fatalf("parked = %+v, %v", parked, err)
	}
	// Held back, not merely not yet reached: the relay has been through the
	// table three more times since the head was parked.
	polls.waitMore(t, 3, "three relay polls while key-00's head is parked")
	if s := o.stats(t); s.Published != 10 || s.Pending != 9 {
		t.Fatalf("while parked: %+v, want key-00's 9 later rows waiting", s)
	}
	broken.Store(false)
	if n, err := o.ob.Unpark(o.ctx, parked[0].ID); err != nil || n != 1 {
		t.Fatalf("Unpark = %d, %v", n, err)
	}
	eventually(t, 30*time.Second, "all published after Unpark", func() bool { return o.stats(t).Published == 20 })
	var keyOrder []string
	for _, m := range obReadAll(t, topic, 1)[0] {
		if string(m.Key) == "key-00" {
			keyOrder = append(keyOrder, header(m, wire.MessageIDHeader))
		}
	}
	var wantOrder []string
	for _, row := range o.outboxRows(t) {
		if string(row.Key) == "key-00" {
			wantOrder = append(wantOrder, row.ID.String())
		}
	}
	if strings.Join(keyOrder, ",") != strings.Join(wantOrder, ",") {
		t.Fatalf("key-00 on the topic:\n%v\nwant\n%v", keyOrder, wantOrder)
	}
	if st := r.r.Stats(); st.Parked != 1 || st.Failed != 3 {
		t.Fatalf("relay stats %+v", st)
	}
	_ = want
}

// Published rows are purged after the retention, in batches; unpublished
// rows are kept.
func TestRelayPurgesPublishedRows(t *testing.T) {
	t.Parallel()
	o := setupOutbox(t)
	topic := newTopic(t, 1)
	o.addRows(t, topic, 250, 5, "purge")
	r, err := outbox.NewRelay(o.ob, obKafkaPub(t), fastRelay("relay"))
	if err != nil {
		t.Fatal(err)
	}
	for o.stats(t).Published < 250 {
		if _, err := r.RunOnce(o.ctx); err != nil {
			t.Fatal(err)
		}
	}
	tx, _ := o.pool.Begin(o.ctx)
	if _, err := o.ob.Add(o.ctx, tx, outbox.Message{Topic: topic, Payload: []byte("later"), Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	_ = tx.Commit(o.ctx)
	n, err := o.ob.Purge(o.ctx, time.Hour, 100)
	if err != nil || n != 0 {
		t.Fatalf("purge within retention = %d, %v", n, err)
	}
	// Purge compares published_at with the database's now(): wait until
	// every published row is more than 10ms old by that clock.
	eventually(t, 60*time.Second, "every published row older than 10ms in database time", func() bool {
		return o.count(`select count(*) from `+o.table("outbox")+` where published_at > now() - interval '10 milliseconds'`) == 0
	})
	n, err = o.ob.Purge(o.ctx, 10*time.Millisecond, 100)
	if err != nil || n != 250 {
		t.Fatalf("purge = %d, %v; want 250", n, err)
	}
	if s := o.stats(t); s.Published != 0 || s.Pending != 1 {
		t.Fatalf("after purge: %+v", s)
	}
}

// Add and AddBatch store what they are given, in order, with UUIDv7 message
// IDs; a validation error writes nothing and leaves the transaction usable;
// the NOTIFY is delivered at commit and never for a rollback.
func TestOutboxAddStoresRows(t *testing.T) {
	t.Parallel()
	o := setupOutbox(t)
	lc, err := o.pool.Acquire(o.ctx)
	if err != nil {
		t.Fatal(err)
	}
	listener := lc.Hijack()
	defer listener.Close(context.Background())
	if _, err := listener.Exec(o.ctx, `listen "idemq_outbox:`+o.schema+`.outbox"`); err != nil {
		t.Fatal(err)
	}
	notified := func() bool {
		ctx, cancel := context.WithTimeout(o.ctx, 300*time.Millisecond)
		defer cancel()
		_, err := listener.WaitForNotification(ctx)
		return err == nil
	}

	tx, err := o.pool.Begin(o.ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = o.ob.AddBatch(o.ctx, tx, []outbox.Message{{Topic: "a"}, {Topic: ""}})
	if !errors.Is(err, outbox.ErrInvalidMessage) || !strings.Contains(err.Error(), "message 1") {
		t.Fatalf("invalid batch: %v", err)
	}
	ids, err := o.ob.AddBatch(o.ctx, tx, []outbox.Message{
		{Topic: "t1", Key: []byte("k"), Headers: map[string]string{"h": "v"}, Payload: []byte("one"), CausationID: "s/m-1"},
		{Topic: "t1", Key: []byte{}, Payload: nil},
		{Topic: "t2", Key: []byte("k"), Payload: []byte("three"), Delay: time.Hour},
	})
	if err != nil {
		t.Fatalf("AddBatch after a validation error: %v", err)
	}
	if notified() {
		t.Fatal("notification before commit")
	}
	if err := tx.Commit(o.ctx); err != nil {
		t.Fatal(err)
	}
	if !notified() {
		t.Fatal("no notification after commit")
	}
	rows := o.outboxRows(t)
	if len(rows) != 3 {
		t.Fatalf("rows = %d", len(rows))
	}
	for i, r := range rows {
		if r.ID != ids[i] || r.ID.Version() != 7 || (i > 0 && r.Seq <= rows[i-1].Seq) {
			t.Fatalf("row %d: id %s (v%d) seq %d, want %s v7 in order", i, r.ID, r.ID.Version(), r.Seq, ids[i])
		}
	}
	if r := rows[0]; string(r.Key) != "k" || r.Headers["h"] != "v" || string(r.Payload) != "one" || r.CausationID != "s/m-1" || r.Attempts != 0 || r.PublishedAt != nil {
		t.Fatalf("row 0 = %+v", r)
	}
	if r := rows[1]; r.Key != nil || r.Payload != nil || len(r.Headers) != 0 {
		t.Fatalf("row 1 = %+v, want no key (empty key stored as none), NULL payload", r)
	}
	if d := rows[2].AvailableAt.Sub(rows[2].CreatedAt); d < 59*time.Minute || d > 61*time.Minute {
		t.Fatalf("row 2 delayed by %s, want 1h", d)
	}
	got, err := o.ob.Get(o.ctx, ids[0])
	if err != nil || got.Seq != rows[0].Seq {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	if _, err := o.ob.Get(o.ctx, uuid.Must(uuid.NewV7())); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("Get unknown: %v", err)
	}
	env := o.ob.Envelope(rows[0])
	if env.Headers[wire.MessageIDHeader] != ids[0].String() || env.Headers[wire.CausationHeader] != "s/m-1" || env.Headers["h"] != "v" {
		t.Fatalf("envelope headers %v", env.Headers)
	}

	tx, _ = o.pool.Begin(o.ctx)
	if _, err := outbox.Add(o.ctx, tx, outbox.Message{Topic: "t"}); err == nil {
		// The default table ("idemq"."outbox") may exist in a shared
		// database; only the rollback matters here.
		t.Log("default table exists")
	}
	_ = tx.Rollback(o.ctx)
	tx, _ = o.pool.Begin(o.ctx)
	if _, err := o.ob.Add(o.ctx, tx, outbox.Message{Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(o.ctx)
	if notified() {
		t.Fatal("notification for a rolled-back insert")
	}
	if n := o.count(`select count(*) from ` + o.table("outbox")); n != 3 {
		t.Fatalf("rows after rollback = %d", n)
	}
}

// LISTEN/NOTIFY wakes an idle relay at once; with LISTEN off, polling finds
// the rows. Each relay is idle before the rows are written: the listener has
// finished a poll begun after its LISTEN (PollInterval is an hour, so only a
// notification makes it look again), and the poller has finished its first
// poll (so a later poll finds the rows).
func TestRelayWakesOnNotifyAndPolls(t *testing.T) {
	t.Parallel()
	o := setupOutbox(t)
	topic := newTopic(t, 1)
	pub := obKafkaPub(t)
	notifyCfg := fastRelay("listener")
	notifyCfg.PollInterval = time.Hour
	listenOb, listenPolls := o.polledOutbox(t)
	rr := o.startRelayOn(t, listenOb, pub, notifyCfg)
	listenPolls.waitIdleListening(t)
	start := time.Now()
	o.addRows(t, topic, 5, 5, "notify")
	eventually(t, 10*time.Second, "published through NOTIFY", func() bool { return o.stats(t).Published == 5 })
	t.Logf("NOTIFY: published %s after commit", time.Since(start).Round(time.Millisecond))
	rr.stop(t)

	pollCfg := fastRelay("poller")
	pollCfg.DisableListen, pollCfg.PollInterval = true, 300*time.Millisecond
	pollOb, pollPolls := o.polledOutbox(t)
	o.startRelayOn(t, pollOb, pub, pollCfg)
	pollPolls.waitMore(t, 1, "the poller's first poll")
	o.addRows(t, topic, 5, 5, "poll")
	eventually(t, 10*time.Second, "published by polling", func() bool { return o.stats(t).Published == 10 })
}

// A deep backlog on one blocked key (its head parked, 2,000 rows behind it,
// all older than everything else) does not starve other keys or keyless
// rows: the relay's key walk reaches them although the oldest rows are all
// blocked. After Unpark the key drains in order.
func TestRelayDeepBlockedKeyDoesNotStarveOthers(t *testing.T) {
	t.Parallel()
	o := setupOutbox(t)
	topic := newTopic(t, 1)
	var broken atomic.Bool
	broken.Store(true)
	tr := newTracker(obKafkaPub(t))
	tr.fail = func(e outbox.Envelope) error {
		if broken.Load() && string(e.Key) == "hot" {
			return errors.New("RECORD_LIST_TOO_LARGE (simulated)")
		}
		return nil
	}
	hot := make([]outbox.Message, 2000)
	for i := range hot {
		hot[i] = outbox.Message{Topic: topic, Key: []byte("hot"), Payload: []byte(fmt.Sprint(i))}
	}
	var others []outbox.Message
	for i := range 30 {
		others = append(others, outbox.Message{Topic: topic, Key: []byte(fmt.Sprintf("cold-%d", i%3)), Payload: []byte(fmt.Sprint(i))})
	}
	for i := range 5 {
		others = append(others, outbox.Message{Topic: topic, Payload: []byte(fmt.Sprint("keyless-", i))})
	}
	for _, batch := range [][]outbox.Message{hot, others} {
		tx, err := o.pool.Begin(o.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := o.ob.AddBatch(o.ctx, tx, batch); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(o.ctx); err != nil {
			t.Fatal(err)
		}
	}
	cfg := fastRelay("relay")
	cfg.BatchSize, cfg.MaxKeys, cfg.MaxAttempts = 50, 5, 1 // window: the 10 oldest rows, all "hot"
	o.startRelay(t, tr.as("relay"), cfg)
	eventually(t, 30*time.Second, "the other keys and keyless rows published", func() bool {
		s := o.stats(t)
		return s.Published == 35 && s.Parked == 1
	})
	if s := o.stats(t); s.Pending != 1999 {
		t.Fatalf("stats %+v, want hot's 1,999 later rows waiting", s)
	}
	parked, _ := o.ob.Parked(o.ctx, 10)
	broken.Store(false)
	if n, err := o.ob.Unpark(o.ctx, parked[0].ID); err != nil || n != 1 {
		t.Fatalf("Unpark = %d, %v", n, err)
	}
	eventually(t, 60*time.Second, "hot drained", func() bool { return o.stats(t).Published == 2035 })
	var got []string
	for _, m := range obReadAll(t, topic, 1)[0] {
		if string(m.Key) == "hot" {
			got = append(got, string(m.Value))
		}
	}
	if len(got) != 2000 {
		t.Fatalf("hot messages on the topic = %d, want 2000", len(got))
	}
	for i, v := range got {
		if v != fmt.Sprint(i) {
			t.Fatalf("hot message %d is %s: per-key order broken", i, v)
		}
	}
}

// Two transactions add rows of one key: the second waits for the first to
// end, so the relay publishes the key in commit order and never sees the
// later row while the earlier one is in flight.
func TestOutboxConcurrentWritersOfOneKeyTakeTurns(t *testing.T) {
	t.Parallel()
	o := setupOutbox(t)
	t1, err := o.pool.Begin(o.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = t1.Rollback(o.ctx) }()
	if _, err := o.ob.Add(o.ctx, t1, outbox.Message{Topic: "t", Key: []byte("K"), Payload: []byte("first")}); err != nil {
		t.Fatal(err)
	}
	added := make(chan error, 1)
	pid := make(chan uint32, 1)
	go func() {
		t2, err := o.pool.Begin(o.ctx)
		if err == nil {
			pid <- t2.Conn().PgConn().PID()
			if _, err = o.ob.Add(o.ctx, t2, outbox.Message{Topic: "t", Key: []byte("K"), Payload: []byte("second")}); err == nil {
				err = t2.Commit(o.ctx)
			}
		}
		close(pid)
		added <- err
	}()
	// The second writer's backend waits for a lock the first holds (not a
	// fixed time: on a busy machine the second may not have started yet).
	p, ok := <-pid
	if !ok {
		t.Fatalf("second writer: %v", <-added)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		var waiting bool
		if err := o.pool.QueryRow(o.ctx, `select exists (select from pg_stat_activity where pid = $1 and wait_event_type = 'Lock')`, p).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case err := <-added:
			t.Fatalf("the second writer of key K did not wait for the first (err %v)", err)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the second writer of key K is not waiting for a lock after a minute, and has not finished either")
		}
	}
	// Meanwhile a relay sees nothing of K: the first row is uncommitted and
	// the second is not written yet.
	var got []string
	pub := outbox.PublisherFunc(func(_ context.Context, batch []outbox.Envelope) error {
		for _, e := range batch {
			got = append(got, string(e.Payload))
		}
		return nil
	})
	r, err := outbox.NewRelay(o.ob, pub, fastRelay("turns"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunOnce(o.ctx); err != nil || len(got) != 0 {
		t.Fatalf("relay published %v while the first writer was in flight (%v)", got, err)
	}
	if err := t1.Commit(o.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-added; err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := r.RunOnce(o.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Join(got, ",") != "first,second" {
		t.Fatalf("published %v, want first,second (commit order)", got)
	}
}
