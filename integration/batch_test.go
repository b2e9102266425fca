package integration

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
)

// A batched Kafka consumer: duplicates, a transient failure retried ahead of
// newer messages, every message applied once, offsets committed to the end.
func TestKafkaBatchedConsumer(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	a := newApplier(e.appliesTable())
	failed := false
	a.fail = func(m *dedup.Message) error {
		if m.Identity.MessageID == "m-042" && !failed {
			failed = true
			return errors.New("transient")
		}
		return nil
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
	r := startConsumer(t, consumer.Config{Scope: group, Store: e.store, Handler: a.handler(), Metrics: &counters,
		BatchSize: 20, BatchWait: 20 * time.Millisecond, CommitEvery: 50}, newSpySource(t, group, topic))
	waitCaughtUp(t, group, topic)
	r.stop(t)
	if n := e.count(`select count(distinct message_id) from ` + a.table); n != 150 {
		t.Fatalf("distinct applied = %d, want 150", n)
	}
	if n := e.count(`select count(*) from ` + a.table); n != 150 {
		t.Fatalf("rows = %d, want 150 (each once)", n)
	}
	if counters.Get("processed") != 150 || counters.Get("duplicate") != 30 || counters.Get("retry") != 1 {
		t.Fatalf("counters = %v", counters.Snapshot())
	}
	if rec := e.record(group, "m-042"); rec.Attempts != 2 || rec.Status != dedup.StatusSucceeded {
		t.Fatalf("m-042 = %+v, want SUCCEEDED after 2 attempts", rec)
	}
}
