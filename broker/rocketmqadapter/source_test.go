package rocketmqadapter

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idemq/idemq/consumer"
)

// fakePull stands in for the client's pull consumer in these unit tests of
// the Source's offset logic: table is the client's in-memory offset table,
// broker what PersistOffset wrote. beforePersist runs inside PersistOffset,
// where a rebalance of the real client may wipe the table.
type fakePull struct {
	rocketmq.PullConsumer
	mu            sync.Mutex
	table         map[primitive.MessageQueue]int64
	broker        map[primitive.MessageQueue]int64
	owned         map[primitive.MessageQueue]bool
	beforePersist func(f *fakePull)
	shutdown      bool
}

func newFakePull(mqs ...primitive.MessageQueue) *fakePull {
	f := &fakePull{table: map[primitive.MessageQueue]int64{}, broker: map[primitive.MessageQueue]int64{}, owned: map[primitive.MessageQueue]bool{}}
	for _, mq := range mqs {
		f.owned[mq] = true
	}
	return f
}

func (f *fakePull) UpdateOffset(mq *primitive.MessageQueue, off int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.table[*mq] = off
	return nil
}

// wipe is the client's persist([]*MessageQueue{keep}) at a rebalance: every
// other queue leaves the offset table.
func (f *fakePull) wipe(keep primitive.MessageQueue) {
	for mq := range f.table {
		if mq != keep {
			delete(f.table, mq)
		}
	}
}

func (f *fakePull) PersistOffset(context.Context, string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.beforePersist != nil {
		f.beforePersist(f)
		f.beforePersist = nil
	}
	for mq, off := range f.table {
		if f.owned[mq] {
			f.broker[mq] = off
		}
	}
	return nil
}

func (f *fakePull) ACK(context.Context, *rmqconsumer.ConsumeRequest, rmqconsumer.ConsumeResult) {}

func (f *fakePull) Unsubscribe(string) error { return nil }

func (f *fakePull) Poll(context.Context, time.Duration) (*rmqconsumer.ConsumeRequest, error) {
	return nil, rmqconsumer.ErrNoNewMsg
}

func (f *fakePull) Shutdown() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.shutdown = true
	for mq, off := range f.table {
		if f.owned[mq] {
			f.broker[mq] = off
		}
	}
	return nil
}

type fakePQ struct{ dropped bool }

func (p *fakePQ) IsDroppd() bool     { return p.dropped }
func (p *fakePQ) WithDropped(d bool) { p.dropped = d }

func queueN(i int) primitive.MessageQueue {
	return primitive.MessageQueue{Topic: "orders", BrokerName: "broker-a", QueueId: i}
}

// testSource is a started Source over f owning the queues of f.
func testSource(f *fakePull) *Source {
	s := &Source{cfg: SourceConfig{Topic: "orders", Group: "g", Strategy: rmqconsumer.AllocateByAveragely}, pc: f, clientState: clientState{started: true},
		queues: map[primitive.MessageQueue]*pullQueue{}}
	for mq := range f.owned {
		ctx, cancel := context.WithCancel(context.Background())
		s.queues[mq] = &pullQueue{pq: &fakePQ{}, ctx: ctx, revoke: cancel, next: -1}
	}
	return s
}

func done(mq primitive.MessageQueue, off int64) consumer.Delivery {
	return consumer.Delivery{Offset: off, Ack: pullAck{mq: mq}}
}

// A rebalance wipes the client's table between the Source's UpdateOffset
// and PersistOffset: the next Commit records the owned queues again, so
// even queues that made no progress since reach the broker, and Close
// leaves them all there.
func TestSourceRecordsOwnedQueuesAgainAfterAWipe(t *testing.T) {
	f := newFakePull(queueN(0), queueN(1), queueN(2), queueN(3))
	s := testSource(f)
	f.beforePersist = func(f *fakePull) { f.wipe(queueN(1)) }
	if err := s.Commit(context.Background(), []consumer.Delivery{done(queueN(0), 4), done(queueN(1), 4), done(queueN(2), 4), done(queueN(3), 4)}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(context.Background(), []consumer.Delivery{done(queueN(1), 9)}); err != nil {
		t.Fatal(err)
	}
	want := map[primitive.MessageQueue]int64{queueN(0): 5, queueN(1): 10, queueN(2): 5, queueN(3): 5}
	for mq, off := range want {
		if f.broker[mq] != off {
			t.Errorf("broker offset of queue %d = %d, want %d (all: %v)", mq.QueueId, f.broker[mq], off, f.broker)
		}
	}
	f.wipe(queueN(3)) // another rebalance, then a graceful stop
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for mq, off := range want {
		if f.broker[mq] != off {
			t.Errorf("after Close, broker offset of queue %d = %d, want %d", mq.QueueId, f.broker[mq], off)
		}
	}
	if !f.shutdown {
		t.Error("Close did not shut the client down")
	}
}

// Offsets never move back, and a queue the client dropped is not recorded.
func TestSourceOffsetsNeverMoveBack(t *testing.T) {
	f := newFakePull(queueN(0), queueN(1))
	s := testSource(f)
	ctx := context.Background()
	_ = s.Commit(ctx, []consumer.Delivery{done(queueN(0), 9)})
	_ = s.Commit(ctx, []consumer.Delivery{done(queueN(0), 3)})
	if got := s.Offsets()[queueN(0)]; got != 10 {
		t.Fatalf("offset after committing 9 then 3 = %d, want 10", got)
	}
	s.queues[queueN(1)].pq.WithDropped(true)
	_ = s.Commit(ctx, []consumer.Delivery{done(queueN(1), 7)})
	if _, ok := f.broker[queueN(1)]; ok {
		t.Fatalf("a dropped queue's offset was written: %v", f.broker)
	}
	if _, ok := s.Offsets()[queueN(1)]; ok {
		t.Fatal("Offsets reports a dropped queue")
	}
}

// A rebalance that takes queues away revokes their lanes and flushes the
// completed deliveries first; one that keeps them does neither.
func TestSourceRevokesAndFlushesQueuesTakenAway(t *testing.T) {
	f := newFakePull(queueN(0), queueN(1))
	s := testSource(f)
	flushes := 0
	s.OnRevoke(func(context.Context) { flushes++ })
	all := []*primitive.MessageQueue{ptr(queueN(0)), ptr(queueN(1))}
	lane0 := s.LaneContext(consumer.Delivery{Ack: pullAck{mq: queueN(0), ctx: s.queues[queueN(0)].ctx}})
	lane1 := s.LaneContext(consumer.Delivery{Ack: pullAck{mq: queueN(1), ctx: s.queues[queueN(1)].ctx}})

	if got := s.allocate("g", "me", all, []string{"me"}); len(got) != 2 || flushes != 0 || lane0.Err() != nil {
		t.Fatalf("keeping both queues: got %d queues, %d flushes, lane 0 %v", len(got), flushes, lane0.Err())
	}
	// A second member: AllocateByAveragely gives "me" (first) queue 0 only.
	got := s.allocate("g", "me", all, []string{"me", "other"})
	if len(got) != 1 || got[0].QueueId != 0 {
		t.Fatalf("allocation %v, want queue 0", got)
	}
	if flushes != 1 || lane1.Err() == nil || lane0.Err() != nil {
		t.Fatalf("after losing queue 1: %d flushes (want 1), lane 1 %v (want canceled), lane 0 %v (want live)", flushes, lane1.Err(), lane0.Err())
	}
	if s.LaneContext(consumer.Delivery{}) != nil {
		t.Fatal("a delivery of another source has a lane context")
	}
}

func ptr(mq primitive.MessageQueue) *primitive.MessageQueue { return &mq }

func TestNewSourceValidates(t *testing.T) {
	for _, cfg := range []SourceConfig{
		{Group: "g", Topic: "t"},
		{NameServers: []string{"127.0.0.1:9876"}, Topic: "t"},
		{NameServers: []string{"127.0.0.1:9876"}, Group: "g"},
		{NameServers: []string{"127.0.0.1:9876"}, Group: "g", Topic: "t", MessageIDProperty: " id"},
	} {
		if _, err := NewSource(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewSource(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
}
