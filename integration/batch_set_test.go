package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// A batched Kafka consumer with a set-based BatchHandler
// (consumer.Config.BatchHandler, pgstore.Store.ProcessBatchSet): the
// handler writes each batch's new messages with one unnest insert and never
// sees a duplicate; a failing batch call (m-042, twice) is rerun one
// message per transaction, m-042 retried ahead of newer messages; every
// message applied once, offsets committed to the end.
func TestKafkaBatchHandlerConsumer(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	tbl := e.appliesTable()
	var mu sync.Mutex
	calls := map[string]int{} // handler calls per message ID
	var batchCalls, dupSeen int
	bh := func(ctx context.Context, tx pgx.Tx, msgs []*dedup.Message) error {
		mu.Lock()
		batchCalls++
		ids, payloads, bks := make([]string, len(msgs)), make([][]byte, len(msgs)), make([]string, len(msgs))
		seen := map[string]bool{}
		failNow := false
		for i, m := range msgs {
			id := m.Identity.MessageID
			if seen[id] {
				dupSeen++
			}
			seen[id] = true
			calls[id]++
			if id == "m-042" && calls[id] <= 2 {
				failNow = true
			}
			ids[i], payloads[i], bks[i] = id, m.Payload, m.Identity.BusinessKey
		}
		mu.Unlock()
		if failNow {
			return errors.New("m-042 fails twice")
		}
		_, err := tx.Exec(ctx, `insert into `+tbl+` (message_id, payload, business_key) select * from unnest($1::text[], $2::bytea[], $3::text[])`, ids, payloads, bks)
		return err
	}
	topic, group := newTopic(t, 3), randomName("g-")
	var msgs []kmsg
	for i := range 150 {
		msgs = append(msgs, kmsg{id: fmt.Sprintf("m-%03d", i), payload: fmt.Sprint(i)})
		if i%5 == 0 {
			msgs = append(msgs, kmsg{id: fmt.Sprintf("m-%03d", i), payload: fmt.Sprint(i)})
		}
	}
	produce(t, topic, msgs...)
	var counters consumer.Counters
	r := startConsumer(t, consumer.Config{Scope: group, Store: e.store, BatchHandler: bh, Metrics: &counters,
		BatchSize: 20, BatchWait: 20 * time.Millisecond, CommitEvery: 50}, newSpySource(t, group, topic))
	waitCaughtUp(t, group, topic)
	r.stop(t)
	if n := e.count(`select count(distinct message_id) from ` + tbl); n != 150 {
		t.Fatalf("distinct applied = %d, want 150", n)
	}
	if n := e.count(`select count(*) from ` + tbl); n != 150 {
		t.Fatalf("rows = %d, want 150 (each once)", n)
	}
	if counters.Get("processed") != 150 || counters.Get("duplicate") != 30 || counters.Get("retry") != 1 {
		t.Fatalf("counters = %v", counters.Snapshot())
	}
	if rec := e.record(group, "m-042"); rec.Attempts != 2 || rec.Status != dedup.StatusSucceeded {
		t.Fatalf("m-042 = %+v, want SUCCEEDED after 2 attempts", rec)
	}
	mu.Lock()
	defer mu.Unlock()
	if dupSeen != 0 {
		t.Fatalf("the batch handler saw %d copies of a message in one call", dupSeen)
	}
	var many []string
	for id, n := range calls {
		if n > 1 && id != "m-042" {
			many = append(many, id)
		}
	}
	// Only the messages of m-042's failing batch run again (rolled back, then
	// one by one); the others are passed once.
	if len(many) > 20 || batchCalls >= 150 {
		t.Fatalf("%d batch handler calls; messages passed more than once: %s", batchCalls, strings.Join(many, ","))
	}
}
