package integration

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idemq/idemq/broker/rocketmqadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/wire"
	"github.com/jackc/pgx/v5"
)

// S20: blank message IDs and business keys are absent, never an identity
// shared by every message that has one.

// callCounter counts handler calls per message ID.
type callCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func newCallCounter() *callCounter { return &callCounter{n: map[string]int{}} }

func (c *callCounter) add(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[id]++
}

func (c *callCounter) get(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

// lookuper is what the tests read records with; both stores have it.
type lookuper interface {
	Lookup(ctx context.Context, scope, messageID string) (dedup.Record, error)
}

// S20 Blank message IDs: Kafka header message-id of "", " ", "\t" (and " "
// again) on four different messages at offsets 5–8, each with a blank
// business key. All four fall back to their position identity, 4 handler
// calls, 4 records; none is a duplicate or a conflict of another. In every
// mode: the identity is built before the store is asked.
func TestS20BlankMessageIDs(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"atomic", "batched", "lease", "redis-only"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testS20(t, mode)
		})
	}
}

func testS20(t *testing.T, mode string) {
	topic, group := newTopic(t, 1), randomName("g-s20-")
	produce(t, topic, fillers(5)...)
	blanks := []string{"", " ", "\t", " "}
	for i, b := range blanks {
		produce(t, topic, kmsg{payload: fmt.Sprintf(`{"order":"o-%d"}`, 5+i), headers: map[string]string{wire.MessageIDHeader: b, "business-key": blanks[3-i]}})
	}
	calls := newCallCounter()
	var counters consumer.Counters
	cfg := consumer.Config{Scope: group, Metrics: &counters,
		BusinessKey: func(m *dedup.Message) (string, error) { return m.Header("business-key"), nil }}
	var store lookuper
	var e *env
	switch mode {
	case "atomic", "batched":
		e = setup(t, nil)
		a := newApplier(e.appliesTable())
		h := a.handler()
		cfg.Store, cfg.Handler = e.store, func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
			calls.add(m.Identity.MessageID)
			return h(ctx, tx, m)
		}
		if mode == "batched" {
			cfg.BatchSize = 4
		}
		store = e.store
		t.Cleanup(func() {
			if t.Failed() {
				return
			}
			if n := e.count(`select count(*) from ` + a.table + ` where message_id like 'kafka:%' and business_key = ''`); n != 4 {
				t.Errorf("business rows of the blank-ID messages = %d, want 4", n)
			}
		})
	case "lease":
		e = setup(t, nil)
		cfg.Store, store = e.store, e.store
	case "redis-only":
		rs := newRedisStore(t, nil)
		cfg.Store, store = rs, rs
	}
	if cfg.Handler == nil {
		cfg.LeaseHandler = func(_ context.Context, m *dedup.Message) error {
			calls.add(m.Identity.MessageID)
			return nil
		}
	}
	r := startConsumer(t, cfg, newSpySource(t, group, topic))
	waitCaughtUp(t, group, topic)
	r.stop(t)

	for off := 5; off <= 8; off++ {
		pos := fmt.Sprintf("kafka:%s/0/%d", topic, off)
		if n := calls.get(pos); n != 1 {
			t.Errorf("offset %d: %d handler calls under %s, want 1", off, n, pos)
		}
		rec, err := store.Lookup(context.Background(), group, pos)
		if err != nil || rec.Status != dedup.StatusSucceeded || rec.BusinessKey != "" {
			t.Errorf("offset %d: record %+v, %v; want SUCCEEDED with no business key", off, rec, err)
		}
	}
	for _, b := range blanks {
		if _, err := store.Lookup(context.Background(), group, b); !errors.Is(err, dedup.ErrNotFound) {
			t.Errorf("a record under the blank ID %q: %v", b, err)
		}
	}
	if counters.Get("duplicate") != 0 || counters.Get("conflict") != 0 || counters.Get("processed") != 9 {
		t.Errorf("outcomes %v; want 9 processed, no duplicate, no conflict", counters.Snapshot())
	}
	if e != nil {
		if n := e.count(`select count(*) from `+e.table("consumption_records")+` where scope = $1 and message_id like 'kafka:%'`, group); n != 4 {
			t.Errorf("records under position identities = %d, want 4", n)
		}
	}
}

// S20 on RocketMQ: a blank message-id property is absent; the message's
// UNIQ_KEY is its ID, so four messages with blank properties are four
// messages, none a duplicate of another.
func TestRocketMQS20BlankMessageIDProperty(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	group := randomName("it-s20-")
	topic := rmqTopic(t, "it-s20-", group)
	calls := newCallCounter()
	obs := &rmqObserver{}
	rmqPushConsumer(t, consumer.Config{Store: e.store, Handler: func(_ context.Context, _ pgx.Tx, m *dedup.Message) error {
		calls.add(m.Identity.MessageID)
		return nil
	}, BusinessKey: rocketmqadapter.BusinessKeyFromProperty("order-id", false)}, rocketmqadapter.Config{
		Group: group, Topic: topic, Observe: obs.observe,
	})
	p := rmqProducer(t)
	var uniq []string
	for i, b := range []string{"", " ", "\t", " "} {
		m := primitive.NewMessage(topic, []byte(fmt.Sprintf(`{"n":%d}`, i)))
		m.WithProperty(wire.MessageIDHeader, b)
		m.WithProperty("order-id", " ")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res, err := p.SendSync(ctx, m)
		cancel()
		if err != nil || res.Status != primitive.SendOK || res.MsgID == "" {
			t.Fatalf("send %d: %+v %v", i, res, err)
		}
		uniq = append(uniq, res.MsgID)
	}
	eventually(t, 60*time.Second, "4 deliveries", func() bool { return len(obs.all()) >= 4 })
	for _, o := range obs.all() {
		if o.err != nil || o.res.Outcome != dedup.OutcomeProcessed || o.d.Message.Identity.BusinessKey != "" {
			t.Errorf("delivery %s: %+v %v; want processed with no business key", o.d.Message.Identity, o.res, o.err)
		}
	}
	for _, u := range uniq {
		if calls.get(u) != 1 {
			t.Errorf("UNIQ_KEY %s: %d handler calls, want 1", u, calls.get(u))
		}
		if r := e.record(group, u); r.Status != dedup.StatusSucceeded {
			t.Errorf("record %s: %+v", u, r)
		}
	}
	if n := e.count(`select count(*) from `+e.table("consumption_records")+` where scope = $1`, group); n != 4 {
		t.Errorf("records = %d, want 4", n)
	}
}
