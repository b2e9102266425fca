package integration

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idemq/idemq/broker/rocketmqadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/wire"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

// endOffset is the offset the next message produced to partition 0 of topic
// gets (the high watermark).
func endOffset(t testing.TB, topic string) int64 {
	t.Helper()
	cl := &kafka.Client{Addr: kafka.TCP(kafkaBrokers(t)...), Timeout: 10 * time.Second}
	resp, err := cl.ListOffsets(context.Background(), &kafka.ListOffsetsRequest{
		Topics: map[string][]kafka.OffsetRequest{topic: {kafka.LastOffsetOf(0)}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range resp.Topics[topic] {
		if p.Partition == 0 {
			if p.Error != nil {
				t.Fatal(p.Error)
			}
			return p.LastOffset
		}
	}
	t.Fatalf("no offsets for %s/0", topic)
	return 0
}

// redriveAdmin is what the re-drive test reads from either store.
type redriveAdmin interface {
	lookuper
	DeadLetters(ctx context.Context, scope string, afterID int64, limit int) ([]dedup.DeadLetter, error)
}

// S20's sibling, issue 8 item 7: two different messages share a message ID
// (a client-side ID generator collision). The second is dead-lettered as
// message_id_collision; `idemq redrive --as-new --id N` (the real CLI binary)
// publishes it to Kafka under <message ID>#redrive-N, and the running
// consumer processes it once under that identity. Both records exist, the
// audit row exists, a second -as-new of the same dead letter publishes
// nothing, and a payload conflict is refused without -force (and, with it,
// when its business key has a record). On Postgres and on the Redis-only
// store.
func TestRedriveAsNewCLI(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"postgres", "redis-only"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			testRedriveAsNewCLI(t, store)
		})
	}
}

func testRedriveAsNewCLI(t *testing.T, store string) {
	bin := buildExample(t, "github.com/idemq/idemq/cmd/idemq")
	topic, group := newTopic(t, 1), randomName("g-asnew-")
	calls := newCallCounter()
	bk := func(m *dedup.Message) (string, error) {
		var v struct {
			Order string `json:"order"`
		}
		if err := json.Unmarshal(m.Payload, &v); err != nil {
			return "", err
		}
		return v.Order, nil
	}
	var counters consumer.Counters
	cfg := consumer.Config{Scope: group, BusinessKey: bk, Metrics: &counters}
	var st redriveAdmin
	var storeArgs []string
	var e *env
	switch store {
	case "postgres":
		e = setup(t, nil)
		tbl := e.appliesTable()
		cfg.Store, st = e.store, e.store
		cfg.Handler = func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
			calls.add(m.Identity.MessageID)
			_, err := tx.Exec(ctx, `insert into `+tbl+` (message_id, payload, business_key) values ($1, $2, $3)`,
				m.Identity.MessageID, m.Payload, m.Identity.BusinessKey)
			return err
		}
		storeArgs = []string{"--dsn", postgresDSN(t), "--schema", e.schema}
	case "redis-only":
		rs := newRedisStore(t, nil)
		cfg.Store, st = rs, rs
		cfg.LeaseHandler = func(_ context.Context, m *dedup.Message) error {
			calls.add(m.Identity.MessageID)
			return nil
		}
		storeArgs = []string{"--redis", "redis://" + redisAddress(t) + "/0", "--redis-prefix", rs.Config().Prefix}
	}
	produce(t, topic,
		kmsg{id: "m-1", payload: `{"order":"o-1","amount":10}`}, // 0: processed
		kmsg{id: "m-1", payload: `{"order":"o-2","amount":20}`}, // 1: another message, same ID: message_id_collision
		kmsg{id: "m-2", payload: `{"order":"o-1","amount":30}`}, // 2: o-1 again, other payload: payload_conflict by business key
		kmsg{id: "m-3", payload: `{"amount":40}`},               // 3: no business key: processed
		kmsg{id: "m-3", payload: `{"amount":50}`})               // 4: same ID, no business key, other payload: payload_conflict
	r := startConsumer(t, cfg, newSpySource(t, group, topic))
	waitCaughtUp(t, group, topic)
	ctx := context.Background()
	dls, err := st.DeadLetters(ctx, group, 0, 100)
	if err != nil || len(dls) != 3 {
		t.Fatalf("dead letters %+v, %v; want 3", dls, err)
	}
	collision, byKey, byID := dls[0], dls[1], dls[2]
	if collision.Reason != dedup.ReasonMessageIDCollision || collision.MessageID != "m-1" ||
		byKey.Reason != dedup.ReasonPayloadConflict || byKey.MessageID != "m-2" ||
		byID.Reason != dedup.ReasonPayloadConflict || byID.MessageID != "m-3" {
		t.Fatalf("dead letters: %+v", dls)
	}
	if counters.Get("conflict:"+dedup.ReasonMessageIDCollision) != 1 || counters.Get("conflict:"+dedup.ReasonPayloadConflict) != 2 {
		t.Fatalf("outcomes by reason: %v", counters.Snapshot())
	}

	idemq := func(args ...string) (string, error) {
		args = append(args, storeArgs...)
		out, err := exec.Command(bin, args...).CombinedOutput()
		return string(out), err
	}
	asNew := func(id int64, extra ...string) (string, error) {
		return idemq(append([]string{"redrive", "--as-new", "--scope", group, "--id", strconv.FormatInt(id, 10), "--operator", "it-operator",
			"--kafka-brokers", strings.Join(kafkaBrokers(t), ",")}, extra...)...)
	}

	// The collision: re-driven as new, processed once under the derived ID.
	derived := "m-1#redrive-" + strconv.FormatInt(collision.ID, 10)
	out, err := asNew(collision.ID)
	if err != nil || !strings.Contains(out, "published to "+topic+" as message ID "+derived) {
		t.Fatalf("redrive -as-new: %v\n%s", err, out)
	}
	eventually(t, 60*time.Second, "the re-driven message to be processed", func() bool { return calls.get(derived) == 1 })
	waitCaughtUp(t, group, topic)
	if rec, err := st.Lookup(ctx, group, derived); err != nil || rec.Status != dedup.StatusSucceeded || rec.BusinessKey != "o-2" {
		t.Fatalf("record of the re-driven message: %+v, %v", rec, err)
	}
	if rec, err := st.Lookup(ctx, group, "m-1"); err != nil || rec.Status != dedup.StatusSucceeded || rec.BusinessKey != "o-1" {
		t.Fatalf("the record it collided with: %+v, %v", rec, err)
	}
	if calls.get("m-1") != 1 {
		t.Fatalf("m-1 handler calls = %d, want 1", calls.get("m-1"))
	}
	if e != nil {
		var n int
		var forced bool
		var op string
		if err := e.pool.QueryRow(ctx, `select count(*), bool_or(forced), max(operator) from `+e.table("dead_letters_redrives")+`
where dead_letter_id = $1 and new_message_id = $2 and message_id = 'm-1' and reason = $3 and published_at is not null`,
			collision.ID, derived, dedup.ReasonMessageIDCollision).Scan(&n, &forced, &op); err != nil || n != 1 || forced || op != "it-operator" {
			t.Fatalf("audit rows = %d (forced %v, operator %q), %v; want 1", n, forced, op, err)
		}
		if n := e.count(`select count(*) from `+e.table("applies")+` where message_id = $1 and business_key = 'o-2'`, derived); n != 1 {
			t.Fatalf("business rows of the re-driven message = %d, want 1", n)
		}
	}
	redrivenAs := func(id int64) string {
		dls, err := st.DeadLetters(ctx, group, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range dls {
			if d.ID == id {
				return d.RedrivenAs
			}
		}
		t.Fatalf("dead letter %d is gone", id)
		return ""
	}
	if got := redrivenAs(collision.ID); got != derived {
		t.Fatalf("RedrivenAs = %q, want %q", got, derived)
	}
	if out, err := idemq("dead-letters", "list", "--scope", group); err != nil || !strings.Contains(out, "as "+derived) {
		t.Fatalf("dead-letters: %v\n%s", err, out)
	}

	// The same request again: nothing new is published.
	end := endOffset(t, topic)
	if out, err := asNew(collision.ID); err != nil || !strings.Contains(out, "already re-driven as "+derived) {
		t.Fatalf("second redrive -as-new: %v\n%s", err, out)
	}
	if got := endOffset(t, topic); got != end {
		t.Fatalf("a second -as-new published: end offset %d -> %d", end, got)
	}

	// A payload conflict is refused without -force, and records nothing.
	if out, err := asNew(byID.ID); err == nil || !strings.Contains(out, "payload conflict") || !strings.Contains(out, "--force") {
		t.Fatalf("-as-new of a payload conflict without -force: err %v\n%s", err, out)
	}
	if got := redrivenAs(byID.ID); got != "" {
		t.Fatalf("a refused re-drive left an audit: %q", got)
	}
	// Forced, when its business key has a record, it is still refused: the
	// copy would conflict with that record again.
	if out, err := asNew(byKey.ID, "--force"); err == nil || !strings.Contains(out, `business key "o-1" has record`) {
		t.Fatalf("forced -as-new of a payload conflict whose business key has a record: err %v\n%s", err, out)
	}
	if got := endOffset(t, topic); got != end {
		t.Fatalf("a refused -as-new published: end offset %d -> %d", end, got)
	}
	// Forced, without a business key: processed under its derived ID.
	derived3 := "m-3#redrive-" + strconv.FormatInt(byID.ID, 10)
	if out, err := asNew(byID.ID, "--force"); err != nil || !strings.Contains(out, derived3) {
		t.Fatalf("forced -as-new: %v\n%s", err, out)
	}
	eventually(t, 60*time.Second, "the forced re-drive to be processed", func() bool { return calls.get(derived3) == 1 })
	waitCaughtUp(t, group, topic)
	r.stop(t)
	if calls.get(derived) != 1 || calls.get(derived3) != 1 || calls.get("m-3") != 1 || calls.get("m-2") != 0 {
		t.Fatalf("handler calls: %v", calls.n)
	}
	if counters.Get("duplicate") != 0 {
		t.Fatalf("outcomes: %v", counters.Snapshot())
	}
	if e != nil {
		if n := e.count(`select count(*) from ` + e.table("dead_letters_redrives")); n != 2 {
			t.Fatalf("audit rows = %d, want 2", n)
		}
	}
}

// RedriveAsNew when the broker refuses the publish: the audit row stays
// unpublished, the call fails, and the next call publishes (once); the one
// after does nothing. The same on Postgres and the Redis-only store.
func TestRedriveAsNewPublishFailsThenRepeats(t *testing.T) {
	t.Parallel()
	type asNewStore interface {
		RedriveAsNew(ctx context.Context, scope string, id int64, opt dedup.RedriveAsNewOptions) (dedup.RedriveAsNewResult, error)
	}
	calls := newCallCounter()
	for _, p := range processors(t, calls, nil) {
		if p.name != "atomic" && p.name != "redis-only" {
			continue
		}
		t.Run(p.name, func(t *testing.T) {
			scope := randomName("asnew-")
			p.process(t, msg(t, scope, "m-1", "order-1", `{"n":1}`))
			r := p.process(t, msg(t, scope, "m-1", "order-2", `{"n":2}`))
			if r.Reason != dedup.ReasonMessageIDCollision {
				t.Fatalf("collision: %+v", r)
			}
			dls := p.deadLet(t, scope)
			st := p.lookup.(asNewStore)
			ctx := context.Background()
			var sent []dedup.RedriveMessage
			brokerDown := errors.New("broker down")
			publish := func(_ context.Context, m dedup.RedriveMessage) error {
				sent = append(sent, m)
				if len(sent) == 1 {
					return brokerDown
				}
				return nil
			}
			opt := dedup.RedriveAsNewOptions{Publish: publish, Operator: "it"}
			if _, err := st.RedriveAsNew(ctx, scope, dls[0].ID, opt); !errors.Is(err, brokerDown) {
				t.Fatalf("first call: %v, want the publish error", err)
			}
			res, err := st.RedriveAsNew(ctx, scope, dls[0].ID, opt)
			derived := dedup.RedriveAsNewID("m-1", dls[0].ID)
			if err != nil || res.Created || !res.Published || res.MessageID != derived || res.PublishedAt.IsZero() || res.RequestedAt.IsZero() {
				t.Fatalf("second call: %+v, %v; want the audit of the first, published now", res, err)
			}
			if len(sent) != 2 || sent[1].MessageID != derived || string(sent[1].Payload) != `{"n":2}` || sent[1].Headers[wire.MessageIDHeader] != "m-1" || sent[1].DeadLetterID != dls[0].ID {
				t.Fatalf("published %+v", sent)
			}
			res, err = st.RedriveAsNew(ctx, scope, dls[0].ID, opt)
			if err != nil || res.Created || res.Published || len(sent) != 2 {
				t.Fatalf("third call: %+v, %v, %d publishes; want nothing new", res, err, len(sent))
			}
			if _, err := st.RedriveAsNew(ctx, scope, dls[0].ID+1_000_000_000, opt); !errors.Is(err, dedup.ErrNotFound) {
				t.Fatalf("unknown dead letter: %v", err)
			}
			bad := p.reject(t, msg(t, scope, "m-9", "", "x"))
			if _, err := st.RedriveAsNew(ctx, scope, bad.DeadLetterID, opt); !errors.Is(err, dedup.ErrNotAConflict) || len(sent) != 2 {
				t.Fatalf("a bad_input dead letter: %v, want ErrNotAConflict", err)
			}
		})
	}
}

// The same on RocketMQ: a message-ID collision (two messages sent with one
// message-id property) is re-driven with `idemq redrive --as-new --broker
// rocketmq`; the push consumer processes it once under the derived ID, with
// its own Keys as business key, and the record it collided with stays.
func TestRocketMQRedriveAsNewCLI(t *testing.T) {
	t.Parallel()
	bin := buildExample(t, "github.com/idemq/idemq/cmd/idemq")
	e := setup(t, nil)
	group := randomName("it-asnew-")
	topic := rmqTopic(t, "it-asnew-", group)
	calls := newCallCounter()
	obs := &rmqObserver{}
	rmqPushConsumer(t, consumer.Config{Store: e.store, BusinessKey: rocketmqadapter.BusinessKeyFromKeys,
		Handler: func(_ context.Context, _ pgx.Tx, m *dedup.Message) error {
			calls.add(m.Identity.MessageID)
			return nil
		}}, rocketmqadapter.Config{
		Group: group, Topic: topic, Observe: obs.observe,
	})
	p := rmqProducer(t)
	rmqSend(t, p, topic, rmqOrderBody("o-1", 100), "m-1", "o-1")
	eventually(t, 60*time.Second, "the first message", func() bool { return len(obs.all()) == 1 })
	rmqSend(t, p, topic, rmqOrderBody("o-2", 200), "m-1", "o-2")
	eventually(t, 60*time.Second, "the colliding message", func() bool { return len(obs.all()) == 2 })
	dls := e.deadLetters(group)
	if len(dls) != 1 || dls[0].Reason != dedup.ReasonMessageIDCollision || dls[0].BusinessKey != "o-2" {
		t.Fatalf("dead letters: %+v", dls)
	}
	ns, _ := rmqEndpoints(t)
	out, err := exec.Command(bin, "redrive", "--as-new", "--scope", group, "--id", strconv.FormatInt(dls[0].ID, 10),
		"--dsn", postgresDSN(t), "--schema", e.schema, "--broker", "rocketmq", "--rocketmq-namesrv", strings.Join(ns, ",")).CombinedOutput()
	derived := "m-1#redrive-" + strconv.FormatInt(dls[0].ID, 10)
	if err != nil || !strings.Contains(string(out), derived) {
		t.Fatalf("redrive -as-new: %v\n%s", err, out)
	}
	// Observe runs once the outcome is durable (the handler's call is counted
	// before its transaction commits).
	eventually(t, 60*time.Second, "the re-driven message", func() bool {
		for _, o := range obs.all() {
			if o.d.Message.Identity.MessageID == derived && o.res.Outcome == dedup.OutcomeProcessed {
				return true
			}
		}
		return false
	})
	if calls.get(derived) != 1 {
		t.Fatalf("handler calls for %s = %d, want 1", derived, calls.get(derived))
	}
	if r := e.record(group, derived); r.Status != dedup.StatusSucceeded || r.BusinessKey != "o-2" {
		t.Fatalf("record of the re-driven message: %+v", r)
	}
	if r := e.record(group, "m-1"); r.Status != dedup.StatusSucceeded || r.BusinessKey != "o-1" || calls.get("m-1") != 1 {
		t.Fatalf("the record it collided with: %+v, calls %d", r, calls.get("m-1"))
	}
	// The copy is a new RocketMQ message: the producer gave it its own
	// UNIQ_KEY (the dead letter's was dropped, not carried over).
	old := dls[0].Headers[primitive.PropertyUniqueClientMessageIdKeyIndex]
	for _, o := range obs.all() {
		if o.d.Message.Identity.MessageID != derived {
			continue
		}
		if u := o.d.Message.Headers[primitive.PropertyUniqueClientMessageIdKeyIndex]; old == "" || u == "" || u == old ||
			o.d.Message.Headers[wire.MessageIDHeader] != derived || string(o.d.Message.Key) != "o-2" {
			t.Fatalf("re-driven copy: properties %v, key %q; dead letter's UNIQ_KEY %q", o.d.Message.Headers, o.d.Message.Key, old)
		}
	}
}
