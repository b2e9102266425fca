// Package sourcetest is a conformance suite for pull-mode sources
// (consumer.Source: Fetch, Commit, Close): broker/kafkaadapter.Source and
// broker/rocketmqadapter.Source run it against real brokers, and any other
// Source can run it the same way.
//
// Run checks what consumer.Consumer.Run relies on:
//
//   - lane order: every message is fetched once, the deliveries of one lane
//     come in offset order, and a key's messages in the order produced;
//   - commit never goes backwards: committing an older delivery of a lane
//     after a newer one leaves the broker's committed position at the newer
//     one;
//   - close flushes: what was given to Commit before Close is the broker's
//     committed position when Close returns, and a new source of the group
//     resumes after it;
//   - uncommitted deliveries are redelivered: a source that goes away (a
//     crash, or Close) with deliveries it never committed leaves them to the
//     next source of the group, which fetches them again with the same
//     message ID, position and offset. Close must not commit anything that
//     was not given to Commit;
//   - lanes added are read (Harness.Grow): lanes added to the topic while a
//     source reads it are read by that source within Timeout, from their
//     first message, and their commits hold.
//
// # Writing a Harness
//
// A Harness works on one topic and one consumer group, both new for the
// case (newHarness is called once per case). The topic needs at least two
// lanes (Kafka partitions, RocketMQ queues), and its producer must put the
// messages of one key in one lane, in order (Kafka: a hashing balancer;
// RocketMQ: a hash queue selector on the sharding key). NewSource returns a
// new, unstarted member of the group; the cases use one source at a time and
// close each before opening the next, so a source that needs the group to
// itself (a RocketMQ clustering consumer) finds it so once the previous one
// has closed. Committed, when the broker offers a way to read a group's
// committed positions (Kafka: OffsetFetch), reads them from the broker, not
// from a source; without it, the suite checks the positions only through
// where the next source of the group resumes.
//
// A run, in a test against the real broker:
//
//	func TestSourceConformance(t *testing.T) {
//		sourcetest.Run(t, func(t *testing.T) sourcetest.Harness {
//			topic, group := newTopic(t, 3), newGroup(t)
//			return sourcetest.Harness{
//				Produce:   func(t testing.TB, msgs []sourcetest.Message) { produce(t, topic, msgs) },
//				NewSource: func(t testing.TB) consumer.Source { return newSource(t, topic, group) },
//				Committed: func(t testing.TB) map[string]int64 { return committed(t, topic, group) },
//			}
//		})
//	}
//
// The suite is experimental: cases may be added in minor releases.
package sourcetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
)

// Message is one message for Harness.Produce to store.
type Message struct {
	// ID is the message ID, sent in the broker's message-ID header or
	// property; the source must return it as Delivery.MessageID.
	ID string
	// Key is the record key (Kafka) or sharding key (RocketMQ); messages
	// with one key must go to one lane.
	Key []byte
	// Value is the payload.
	Value []byte
}

// Harness is what Run needs of one source implementation. Produce and
// NewSource are required.
type Harness struct {
	// Produce stores msgs on the case's topic, in order, and returns once
	// the broker acknowledged them all (failing t otherwise).
	Produce func(t testing.TB, msgs []Message)
	// NewSource returns a new source over the case's topic in the case's
	// consumer group (the same group on every call of one Harness). Each
	// lane starts at the group's committed position, or at the lane's first
	// message when the group has none. The suite closes every source it
	// gets.
	NewSource func(t testing.TB) consumer.Source
	// Committed returns the group's committed position per lane as the
	// broker stores it now: the Delivery.Offset of the next delivery the
	// group will get from the lane (Kafka: the committed offset). Keys are
	// Delivery.Lane values; lanes without a committed position are absent.
	// Optional: when nil, the cases check committed positions only through
	// the deliveries of the next source of the group.
	Committed func(t testing.TB) map[string]int64
	// Grow adds lanes to the case's topic (Kafka: partitions; RocketMQ:
	// read and write queues), stores one message on each lane added and
	// returns those messages, in any order. The LanesAdded case calls it
	// while a source reads the topic and expects that source to fetch them
	// within Timeout. Optional: when nil, LanesAdded is skipped (it says
	// so).
	Grow func(t testing.TB) []Message
}

// Timeout bounds the waits of the suite: fetching the deliveries a case
// expects, and a committed position to appear. Generous, as a broker may
// need a rebalance or two before a new member gets its lanes.
const Timeout = 2 * time.Minute

// Run runs the suite as subtests of t, calling newHarness once per case; the
// cases run in parallel with each other (t.Parallel).
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Helper()
	cases := []struct {
		name string
		run  func(t *testing.T, h Harness)
	}{
		{"LaneOrder", testLaneOrder},
		{"CommitNeverBackwards", testCommitNeverBackwards},
		{"CloseFlushes", testCloseFlushes},
		{"UncommittedRedelivered", testUncommittedRedelivered},
		{"LanesAdded", testLanesAdded},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			if h.Produce == nil || h.NewSource == nil {
				t.Fatal("sourcetest: Harness.Produce and NewSource are required")
			}
			c.run(t, h)
		})
	}
}

// messages returns n messages over keys keys, named after the case.
func messages(t testing.TB, tag string, n, keys int) []Message {
	out := make([]Message, n)
	for i := range out {
		out[i] = Message{ID: fmt.Sprintf("%s-%s-%03d", t.Name(), tag, i), Key: []byte(fmt.Sprintf("%s-key-%d", tag, i%keys)),
			Value: []byte(fmt.Sprintf(`{"n":%d}`, i))}
	}
	return out
}

// open returns a new source that is closed when the test ends unless the
// case closed it first (closing twice must be harmless).
func open(t testing.TB, h Harness) consumer.Source {
	t.Helper()
	src := h.NewSource(t)
	t.Cleanup(func() { _ = src.Close() })
	return src
}

// fetch fetches n deliveries from src, failing t after Timeout.
func fetch(t testing.TB, src consumer.Source, n int) []consumer.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	out := make([]consumer.Delivery, 0, n)
	for len(out) < n {
		d, err := src.Fetch(ctx)
		if err != nil {
			t.Fatalf("Fetch after %d of %d deliveries: %v", len(out), n, err)
		}
		out = append(out, d)
	}
	return out
}

func commit(t testing.TB, src consumer.Source, done ...consumer.Delivery) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	if err := src.Commit(ctx, done); err != nil {
		t.Fatalf("Commit: %v", err)
	}
}

func closeSource(t testing.TB, src consumer.Source) {
	t.Helper()
	if err := src.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// committedOf returns the committed position of lane, and false when the
// Harness cannot read committed positions.
func committedOf(t testing.TB, h Harness, lane string) (int64, bool) {
	if h.Committed == nil {
		return 0, false
	}
	return h.Committed(t)[lane], true
}

// lastPerLane returns the last delivery of each lane in ds.
func lastPerLane(ds []consumer.Delivery) map[string]consumer.Delivery {
	out := map[string]consumer.Delivery{}
	for _, d := range ds {
		out[d.Lane] = d
	}
	return out
}

// testLaneOrder: 40 messages over 8 keys are each fetched once, with their
// message IDs; a lane's deliveries come in increasing offset order, and a
// key's in the order produced, all in one lane.
func testLaneOrder(t *testing.T, h Harness) {
	msgs := messages(t, "order", 40, 8)
	h.Produce(t, msgs)
	src := open(t, h)
	ds := fetch(t, src, len(msgs))
	index := map[string]int{}
	for i, m := range msgs {
		index[m.ID] = i
	}
	seen := map[string]bool{}
	positions := map[string]bool{}
	lastOff := map[string]int64{}
	lastOfKey := map[string]int{}
	laneOfKey := map[string]string{}
	for _, d := range ds {
		i, ok := index[d.MessageID]
		switch {
		case !ok:
			t.Fatalf("delivery %s at %s: message ID not produced by this case", d.MessageID, d.Position)
		case seen[d.MessageID]:
			t.Fatalf("message %s fetched twice by one source", d.MessageID)
		case d.Lane == "" || d.Position == "" || positions[d.Position]:
			t.Fatalf("delivery %s: lane %q, position %q (seen before: %v)", d.MessageID, d.Lane, d.Position, positions[d.Position])
		case d.Message == nil || string(d.Message.Payload) != string(msgs[i].Value) || string(d.Message.Key) != string(msgs[i].Key):
			t.Fatalf("delivery %s: message %+v, want key %q payload %q", d.MessageID, d.Message, msgs[i].Key, msgs[i].Value)
		}
		seen[d.MessageID], positions[d.Position] = true, true
		if last, ok := lastOff[d.Lane]; ok && d.Offset <= last {
			t.Fatalf("lane %s: offset %d fetched after %d", d.Lane, d.Offset, last)
		}
		lastOff[d.Lane] = d.Offset
		key := string(msgs[i].Key)
		if prev, ok := lastOfKey[key]; ok && i < prev {
			t.Fatalf("key %s: message %d fetched after message %d", key, i, prev)
		}
		if lane, ok := laneOfKey[key]; ok && lane != d.Lane {
			t.Fatalf("key %s in lanes %s and %s", key, lane, d.Lane)
		}
		lastOfKey[key], laneOfKey[key] = i, d.Lane
	}
	if len(lastOff) < 2 {
		t.Logf("all 40 messages came from one lane (%v): the topic should have at least two", lastOff)
	}
}

// testCommitNeverBackwards: after Commit of delivery 7 of a lane, Commit of
// delivery 3 (older) does not move the committed position back: after Close
// it is 7's offset + 1, and a new source resumes at delivery 8.
func testCommitNeverBackwards(t *testing.T, h Harness) {
	msgs := messages(t, "back", 10, 1)
	h.Produce(t, msgs)
	src := open(t, h)
	ds := fetch(t, src, len(msgs))
	commit(t, src, ds[7])
	want := ds[7].Offset + 1
	if h.Committed != nil {
		// A source may persist commits in the background: wait for this one.
		deadline := time.Now().Add(Timeout)
		for h.Committed(t)[ds[7].Lane] != want {
			if time.Now().After(deadline) {
				t.Fatalf("lane %s: committed position %d %s after Commit, want %d", ds[7].Lane, h.Committed(t)[ds[7].Lane], Timeout, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	commit(t, src, ds[3])
	if h.Committed != nil {
		if got := h.Committed(t)[ds[7].Lane]; got != want {
			t.Fatalf("lane %s: committed position %d after committing offset %d, want %d (it moved back)", ds[7].Lane, got, ds[3].Offset, want)
		}
	}
	closeSource(t, src)
	if h.Committed != nil {
		if got := h.Committed(t)[ds[7].Lane]; got != want {
			t.Fatalf("lane %s: committed position %d after Close, want %d (the older commit moved it back)", ds[7].Lane, got, want)
		}
	}
	next := open(t, h)
	if d := fetch(t, next, 1)[0]; d.MessageID != msgs[8].ID || d.Offset != ds[8].Offset {
		t.Fatalf("the next source starts at %s (offset %d), want %s (offset %d)", d.MessageID, d.Offset, msgs[8].ID, ds[8].Offset)
	}
	closeSource(t, next)
}

// testCloseFlushes: the last delivery of every lane is committed and the
// source closed at once; when Close returns the broker holds those
// positions, and a new source fetches only messages produced after them.
func testCloseFlushes(t *testing.T, h Harness) {
	msgs := messages(t, "flush", 24, 6)
	h.Produce(t, msgs)
	src := open(t, h)
	ds := fetch(t, src, len(msgs))
	last := lastPerLane(ds)
	var done []consumer.Delivery
	for _, d := range last {
		done = append(done, d)
	}
	commit(t, src, done...)
	closeSource(t, src)
	if h.Committed != nil {
		committed := h.Committed(t)
		for lane, d := range last {
			if got, ok := committed[lane]; !ok || got != d.Offset+1 {
				t.Fatalf("lane %s: committed position %d (present %v) right after Close, want %d", lane, got, ok, d.Offset+1)
			}
		}
	}
	more := messages(t, "flush-more", 6, 6)
	h.Produce(t, more)
	next := open(t, h)
	want := map[string]bool{}
	for _, m := range more {
		want[m.ID] = true
	}
	for _, d := range fetch(t, next, len(more)) {
		if !want[d.MessageID] {
			t.Fatalf("the next source fetched %s at %s, committed before the first source closed", d.MessageID, d.Position)
		}
		delete(want, d.MessageID)
	}
	closeSource(t, next)
}

// testUncommittedRedelivered: a source fetches 10 messages of one lane,
// commits the first 5 and goes away; the next source fetches the other 5
// again, in order, with the same message IDs, positions and offsets.
func testUncommittedRedelivered(t *testing.T, h Harness) {
	msgs := messages(t, "redeliver", 10, 1)
	h.Produce(t, msgs)
	src := open(t, h)
	ds := fetch(t, src, len(msgs))
	commit(t, src, ds[4])
	closeSource(t, src)
	if got, ok := committedOf(t, h, ds[4].Lane); ok && got != ds[4].Offset+1 {
		t.Fatalf("lane %s: committed position %d after Close, want %d: the position Commit was given, and nothing more (Close must not commit deliveries it was not given)", ds[4].Lane, got, ds[4].Offset+1)
	}
	next := open(t, h)
	again := fetch(t, next, 5)
	for i, d := range again {
		want := ds[5+i]
		if d.MessageID != want.MessageID || d.Position != want.Position || d.Offset != want.Offset || d.Lane != want.Lane {
			t.Fatalf("redelivery %d: %s at %s (offset %d), want %s at %s (offset %d)", i, d.MessageID, d.Position, d.Offset, want.MessageID, want.Position, want.Offset)
		}
	}
	closeSource(t, next)
}

// testLanesAdded: lanes added to the topic while a source reads it are read
// by that source (S30), from their first message (stored before the source
// can have seen the lanes), each message once; their commits hold: a new
// source of the group does not get them again.
func testLanesAdded(t *testing.T, h Harness) {
	if h.Grow == nil {
		t.Skip("sourcetest: Harness.Grow is nil: the lanes-added case is not run")
	}
	before := messages(t, "before", 1, 1)
	h.Produce(t, before)
	src := open(t, h)
	first := fetch(t, src, 1)
	if first[0].MessageID != before[0].ID {
		t.Fatalf("first delivery %q, want %q", first[0].MessageID, before[0].ID)
	}
	commit(t, src, first...)

	added := h.Grow(t)
	if len(added) == 0 {
		t.Fatal("sourcetest: Harness.Grow stored no message")
	}
	want := map[string]bool{}
	for _, m := range added {
		want[m.ID] = true
	}
	got := fetch(t, src, len(added))
	lanes := map[string]bool{first[0].Lane: true}
	for _, d := range got {
		if !want[d.MessageID] {
			t.Fatalf("delivery %q (lane %s) after the lanes were added, want one of the messages on the added lanes %v", d.MessageID, d.Lane, want)
		}
		delete(want, d.MessageID)
		if lanes[d.Lane] {
			t.Fatalf("delivery %q on lane %s, which is not an added lane (or got two of them)", d.MessageID, d.Lane)
		}
		lanes[d.Lane] = true
	}
	commit(t, src, got...)
	for _, d := range got {
		if c, ok := committedOf(t, h, d.Lane); ok && c != d.Offset+1 {
			t.Errorf("added lane %s: committed %d after committing offset %d, want %d", d.Lane, c, d.Offset, d.Offset+1)
		}
	}
	closeSource(t, src)

	after := messages(t, "after", 1, 1)
	h.Produce(t, after)
	next := open(t, h)
	if d := fetch(t, next, 1)[0]; d.MessageID != after[0].ID {
		t.Fatalf("a new source of the group fetched %q (lane %s) first, want %q: a committed message of an added lane came back", d.MessageID, d.Lane, after[0].ID)
	}
	closeSource(t, next)
}
