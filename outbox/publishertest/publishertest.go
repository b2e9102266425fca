// Package publishertest is a conformance suite for outbox.Publisher
// implementations: every publisher idemq ships (outbox/kafkapub,
// outbox/rocketmqpub) runs it against a real broker, and a third-party
// publisher can run it the same way.
//
// Run checks what the relay relies on (see outbox.Publisher and
// outbox.ChainPublisher):
//
//   - acked means durable: once Publish returns nil (or PublishChains
//     reports a chain acknowledged), every envelope can be read back from the
//     topic by a new reader, with its key, payload and headers;
//   - stable on republish: the same envelope published again (the relay's
//     retry after a lost mark) is stored with byte-identical key, payload and
//     message-ID header, in the same lane as the first copy;
//   - per-key order: the envelopes of one key, published one after the other
//     (rounds of Publish) or as one chain (PublishChains), are stored in one
//     lane in publish order;
//   - failures are reported per envelope: an envelope the publisher or broker
//     refuses makes Publish return outbox.PublishErrors with a non-nil entry
//     for it, and every envelope reported acknowledged is readable; in a
//     chain, the refused envelope ends the chain and no later envelope of the
//     chain is stored.
//
// A run, in a test against the real broker:
//
//	func TestPublisherConformance(t *testing.T) {
//		publishertest.Run(t, func(t *testing.T) publishertest.Harness {
//			topic := newTopic(t) // fresh and empty, per case
//			return publishertest.Harness{
//				Publisher: newPublisher(t),
//				Topic:     topic,
//				Read:      func(t testing.TB, n int) []publishertest.Message { return readTopic(t, topic, n) },
//				Refuse: func(e outbox.Envelope) outbox.Envelope {
//					e.Payload = make([]byte, brokerMaxBytes+1) // random bytes if the client compresses
//					return e
//				},
//			}
//		})
//	}
//
// The suite is experimental: cases may be added in minor releases.
package publishertest

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/wire"
)

// Message is one message read back from the broker.
type Message struct {
	// Lane is where the broker stored the message: the Kafka partition, the
	// RocketMQ broker and queue. Messages of one key must share a lane for
	// per-key order to hold.
	Lane string
	// Seq is the message's position within its lane (Kafka offset, RocketMQ
	// queue offset): larger means stored later.
	Seq int64
	// Key is the record key (Kafka) or Keys property (RocketMQ); nil or empty
	// when the envelope had none.
	Key []byte
	// Value is the payload as stored.
	Value []byte
	// Headers are the user headers (Kafka) or user properties (RocketMQ).
	// Broker-internal properties may be present too; the suite only looks
	// up the envelope's own header names.
	Headers map[string]string
}

// Harness is what Run needs of one publisher under test. newHarness is called
// once per case, so each case gets a fresh, empty topic.
type Harness struct {
	// Publisher is the publisher under test. Required. When it also
	// implements outbox.ChainPublisher, PublishChains is checked too.
	Publisher outbox.Publisher
	// Topic is an existing topic with nothing on it yet, created for this
	// case. Required. It may have any number of lanes (more than one makes
	// the order cases stronger).
	Topic string
	// Read returns every message stored on Topic so far, once at least n
	// are there: it reads from the start of every lane with a reader of its
	// own (not through the Publisher), waiting as long as it needs, and
	// fails t (t.Fatal) when n messages do not arrive within a deadline of
	// its choosing (a minute or more). Required.
	Read func(t testing.TB, n int) []Message
	// Refuse returns a copy of e that the publisher or the broker refuses to
	// store (for example a payload above the publisher's or broker's size
	// limit), keeping its topic, key and ID. Required: the suite checks how
	// a refusal is reported.
	Refuse func(e outbox.Envelope) outbox.Envelope
	// MessageIDHeader is the header the envelopes carry their message ID
	// in. Default wire.MessageIDHeader ("message-id"), the default of
	// outbox.Config.MessageIDHeader.
	MessageIDHeader string
}

// Run runs the suite as subtests of t, calling newHarness once per case. The
// cases run in parallel with each other (t.Parallel). Each case publishes at
// most a few dozen small envelopes.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Helper()
	cases := []struct {
		name string
		run  func(t *testing.T, h Harness)
	}{
		{"AckedMeansDurable", testAckedMeansDurable},
		{"StableOnRepublish", testStableOnRepublish},
		{"PerKeyOrder", testPerKeyOrder},
		{"FailuresReportedPerEnvelope", testFailuresReported},
		{"ChosenMessageID", testChosenMessageID},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			switch {
			case h.Publisher == nil:
				t.Fatal("publishertest: Harness.Publisher is nil")
			case h.Topic == "":
				t.Fatal("publishertest: Harness.Topic is empty")
			case h.Read == nil:
				t.Fatal("publishertest: Harness.Read is nil")
			case h.Refuse == nil:
				t.Fatal("publishertest: Harness.Refuse is nil")
			}
			if h.MessageIDHeader == "" {
				h.MessageIDHeader = wire.MessageIDHeader
			}
			c.run(t, h)
		})
	}
}

// publishTimeout bounds one Publish or PublishChains call of the suite.
const publishTimeout = time.Minute

// envelope returns a new envelope for h's topic, with a UUIDv7 ID in the
// message-ID header, a header of the case and a payload holding bytes that
// are not valid UTF-8 (the payload must travel as bytes).
func (h Harness) envelope(t testing.TB, key string, n int) outbox.Envelope {
	t.Helper()
	id, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	e := outbox.Envelope{ID: id, Topic: h.Topic,
		Headers: map[string]string{h.MessageIDHeader: id.String(), "publishertest-case": t.Name(), "publishertest-n": fmt.Sprint(n)},
		Payload: append([]byte(fmt.Sprintf(`{"key":%q,"n":%d}`, key, n)), 0x00, 0xff, 0xfe)}
	if key != "" {
		e.Key = []byte(key)
	}
	return e
}

func (h Harness) publish(t testing.TB, batch []outbox.Envelope) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	return h.Publisher.Publish(ctx, batch)
}

func (h Harness) publishChains(t testing.TB, cp outbox.ChainPublisher, chains [][]outbox.Envelope) []outbox.ChainResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	res := cp.PublishChains(ctx, chains)
	if len(res) != len(chains) {
		t.Fatalf("PublishChains returned %d results for %d chains", len(res), len(chains))
	}
	return res
}

// byID indexes messages by their message-ID header, in read order.
func (h Harness) byID(msgs []Message) map[string][]Message {
	out := map[string][]Message{}
	for _, m := range msgs {
		out[m.Headers[h.MessageIDHeader]] = append(out[m.Headers[h.MessageIDHeader]], m)
	}
	return out
}

// sameAs reports how m differs from e ("" when it is e as published).
func (h Harness) sameAs(m Message, e outbox.Envelope) string {
	switch {
	case !bytes.Equal(m.Key, e.Key):
		return fmt.Sprintf("key %q, want %q", m.Key, e.Key)
	case !bytes.Equal(m.Value, e.Payload):
		return fmt.Sprintf("value %q, want %q", m.Value, e.Payload)
	}
	for k, v := range e.Headers {
		if got, ok := m.Headers[k]; !ok || got != v {
			return fmt.Sprintf("header %q = %q (present %v), want %q", k, got, ok, v)
		}
	}
	return ""
}

// mustHold fails t unless every envelope of want was read back, as published.
func (h Harness) mustHold(t testing.TB, got map[string][]Message, want []outbox.Envelope) {
	t.Helper()
	for i, e := range want {
		copies := got[e.ID.String()]
		if len(copies) == 0 {
			t.Fatalf("envelope %d (%s) was acknowledged but is not on the topic", i, e.ID)
		}
		for _, m := range copies {
			if d := h.sameAs(m, e); d != "" {
				t.Fatalf("envelope %d (%s) read back with %s", i, e.ID, d)
			}
		}
	}
}

// testAckedMeansDurable: after Publish returns nil, and for every chain
// PublishChains reports fully acknowledged, a new reader finds every
// envelope on the topic, intact.
func testAckedMeansDurable(t *testing.T, h Harness) {
	var batch []outbox.Envelope
	for i := range 12 {
		key := ""
		if i%3 != 2 {
			key = fmt.Sprintf("durable-%d", i%4)
		}
		batch = append(batch, h.envelope(t, key, i))
	}
	// Publish: at most one envelope per key per call, as the relay calls it.
	perKey := map[string]bool{}
	var first, second []outbox.Envelope
	for _, e := range batch {
		if len(e.Key) > 0 && perKey[string(e.Key)] {
			second = append(second, e)
			continue
		}
		perKey[string(e.Key)] = true
		first = append(first, e)
	}
	for _, b := range [][]outbox.Envelope{first, second} {
		if err := h.publish(t, b); err != nil {
			t.Fatalf("Publish of %d envelopes: %v", len(b), err)
		}
	}
	acked := batch
	if cp, ok := h.Publisher.(outbox.ChainPublisher); ok {
		var chains [][]outbox.Envelope
		for k := range 3 {
			var c []outbox.Envelope
			for i := range 3 {
				c = append(c, h.envelope(t, fmt.Sprintf("durable-chain-%d", k), i))
			}
			chains = append(chains, c)
		}
		chains = append(chains, []outbox.Envelope{h.envelope(t, "", 99)})
		for i, r := range h.publishChains(t, cp, chains) {
			if r.Err != nil || r.Acked != len(chains[i]) {
				t.Fatalf("PublishChains chain %d: acked %d of %d, err %v", i, r.Acked, len(chains[i]), r.Err)
			}
			acked = append(acked, chains[i]...)
		}
	}
	h.mustHold(t, h.byID(h.Read(t, len(acked))), acked)
}

// testStableOnRepublish: one envelope published three times (twice by
// Publish, once more by PublishChains when supported) is stored three times
// with byte-identical key, value and message-ID header, all in one lane.
func testStableOnRepublish(t *testing.T, h Harness) {
	e := h.envelope(t, "stable-key", 1)
	keyless := h.envelope(t, "", 2)
	copies := 0
	for range 2 {
		if err := h.publish(t, []outbox.Envelope{e, keyless}); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		copies++
	}
	if cp, ok := h.Publisher.(outbox.ChainPublisher); ok {
		for i, r := range h.publishChains(t, cp, [][]outbox.Envelope{{e}, {keyless}}) {
			if r.Err != nil || r.Acked != 1 {
				t.Fatalf("PublishChains chain %d: acked %d, err %v", i, r.Acked, r.Err)
			}
		}
		copies++
	}
	got := h.byID(h.Read(t, 2*copies))
	for _, env := range []outbox.Envelope{e, keyless} {
		cs := got[env.ID.String()]
		if len(cs) != copies {
			t.Fatalf("%s: %d copies on the topic, want %d", env.ID, len(cs), copies)
		}
		for i, m := range cs {
			if d := h.sameAs(m, env); d != "" {
				t.Fatalf("%s copy %d: %s", env.ID, i, d)
			}
			if !bytes.Equal(m.Key, cs[0].Key) || !bytes.Equal(m.Value, cs[0].Value) || m.Headers[h.MessageIDHeader] != cs[0].Headers[h.MessageIDHeader] {
				t.Fatalf("%s copy %d differs from copy 0: key %q/%q value %q/%q", env.ID, i, m.Key, cs[0].Key, m.Value, cs[0].Value)
			}
			if len(env.Key) > 0 && m.Lane != cs[0].Lane {
				t.Fatalf("%s copy %d stored in lane %s, copy 0 in %s: a republished keyed envelope must land where the first copy did", env.ID, i, m.Lane, cs[0].Lane)
			}
		}
	}
}

// testChosenMessageID: a row with a caller-chosen message ID
// (outbox.Message.MessageID, e.g. a dead letter republished under its own
// ID) is stored with that ID in the message-ID header, not the row's
// UUIDv7, as outbox.Outbox.Envelope builds it.
func testChosenMessageID(t *testing.T, h Harness) {
	ob, err := outbox.New(nil, outbox.Config{MessageIDHeader: h.MessageIDHeader})
	if err != nil {
		t.Fatal(err)
	}
	id, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	chosen := "order-42#redrive-" + id.String()[24:]
	e := ob.Envelope(outbox.Row{ID: id, MessageID: chosen, Topic: h.Topic, Key: []byte("chosen-key"),
		Headers: map[string]string{"publishertest-case": t.Name()}, Payload: []byte(`{"n":1}`)})
	if e.MessageID != chosen || e.Headers[h.MessageIDHeader] != chosen || e.ID != id {
		t.Fatalf("Envelope: ID %s, MessageID %q, header %q; want the row's ID and the chosen message ID %q", e.ID, e.MessageID, e.Headers[h.MessageIDHeader], chosen)
	}
	if err := h.publish(t, []outbox.Envelope{e}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	got := h.byID(h.Read(t, 1))
	if len(got[chosen]) != 1 || len(got[id.String()]) != 0 {
		t.Fatalf("on the topic by message-ID header: %d with the chosen ID %q, %d with the row's UUIDv7; want 1 and 0", len(got[chosen]), chosen, len(got[id.String()]))
	}
	if d := h.sameAs(got[chosen][0], e); d != "" {
		t.Fatalf("read back with %s", d)
	}
}

// testPerKeyOrder: rows of one key published in rounds of Publish (the
// relay's path for a plain Publisher) or as one chain of PublishChains are
// stored in one lane, in publish order.
func testPerKeyOrder(t *testing.T, h Harness) {
	const keys, rows = 3, 8
	want := map[string][]string{} // key -> IDs in publish order
	total := 0
	for round := range rows {
		var batch []outbox.Envelope
		for k := range keys {
			e := h.envelope(t, fmt.Sprintf("rounds-%d", k), round)
			want[string(e.Key)] = append(want[string(e.Key)], e.ID.String())
			batch = append(batch, e)
		}
		if err := h.publish(t, batch); err != nil {
			t.Fatalf("Publish round %d: %v", round, err)
		}
		total += len(batch)
	}
	if cp, ok := h.Publisher.(outbox.ChainPublisher); ok {
		var chains [][]outbox.Envelope
		for k := range keys {
			var c []outbox.Envelope
			for i := range rows {
				e := h.envelope(t, fmt.Sprintf("chain-%d", k), i)
				want[string(e.Key)] = append(want[string(e.Key)], e.ID.String())
				c = append(c, e)
			}
			chains = append(chains, c)
		}
		for i, r := range h.publishChains(t, cp, chains) {
			if r.Err != nil || r.Acked != rows {
				t.Fatalf("PublishChains chain %d: acked %d of %d, err %v", i, r.Acked, rows, r.Err)
			}
		}
		total += keys * rows
	}
	msgs := h.Read(t, total)
	got := map[string][]Message{}
	for _, m := range msgs {
		got[string(m.Key)] = append(got[string(m.Key)], m)
	}
	for key, ids := range want {
		ms := got[key]
		if len(ms) != len(ids) {
			t.Fatalf("key %s: %d messages on the topic, want %d", key, len(ms), len(ids))
		}
		// Read order within a lane is not promised: sort by Seq.
		slices.SortFunc(ms, func(a, b Message) int { return cmp.Compare(a.Seq, b.Seq) })
		for _, m := range ms {
			if m.Lane != ms[0].Lane {
				t.Fatalf("key %s: messages in lanes %s and %s: one key must use one lane", key, ms[0].Lane, m.Lane)
			}
		}
		for i, m := range ms {
			if id := m.Headers[h.MessageIDHeader]; id != ids[i] {
				t.Fatalf("key %s: position %d holds %s (n=%s), want %s: per-key order broken", key, i, id, m.Headers["publishertest-n"], ids[i])
			}
		}
	}
}

// testFailuresReported: a refused envelope in a Publish batch makes Publish
// return outbox.PublishErrors, one entry per envelope, non-nil for the
// refused one only; the envelopes reported acknowledged are on the topic. In
// a chain, the refused envelope ends the chain: Acked stops before it, Err is
// set, and no later envelope of the chain is ever stored, while another
// key's chain of the same call is acknowledged whole. A refusal is a row
// error, never outbox.IsUnavailable: the relay would otherwise pause every
// key for it, and if it failed the other envelopes of its call, every retry
// of a refused head would charge healthy keys an attempt (and park them in
// the end).
func testFailuresReported(t *testing.T, h Harness) {
	ok1, ok2 := h.envelope(t, "fail-a", 0), h.envelope(t, "fail-c", 0)
	bad := h.Refuse(h.envelope(t, "fail-b", 0))
	batch := []outbox.Envelope{ok1, bad, ok2}
	err := h.publish(t, batch)
	var pe outbox.PublishErrors
	switch {
	case err == nil:
		t.Fatal("Publish of a batch holding a refused envelope returned nil")
	case !errors.As(err, &pe):
		t.Fatalf("Publish returned %T (%v), want outbox.PublishErrors naming the refused envelope", err, err)
	case len(pe) != len(batch):
		t.Fatalf("PublishErrors has %d entries for %d envelopes", len(pe), len(batch))
	case pe[1] == nil:
		t.Fatalf("PublishErrors %v: the refused envelope is reported acknowledged", []error(pe))
	case outbox.IsUnavailable(pe[1]):
		t.Fatalf("the refusal %v is reported as an unavailable broker (outbox.IsUnavailable): it is the row's error", pe[1])
	case pe[0] != nil || pe[2] != nil:
		t.Fatalf("PublishErrors %v: the refusal failed the other envelopes of the batch too", []error(pe))
	}
	var acked []outbox.Envelope
	for i, e := range batch {
		if pe[i] == nil {
			acked = append(acked, e)
		}
	}
	// A sentinel per key, published after the refusals, bounds the read:
	// whatever the calls stored comes before it in its lane.
	sentinels := []outbox.Envelope{h.envelope(t, "fail-a", 1), h.envelope(t, "fail-b", 1), h.envelope(t, "fail-c", 1)}
	var chain []outbox.Envelope
	var res outbox.ChainResult
	cp, chains := h.Publisher.(outbox.ChainPublisher)
	if chains {
		chain = []outbox.Envelope{h.envelope(t, "fail-chain", 0), h.Refuse(h.envelope(t, "fail-chain", 1)), h.envelope(t, "fail-chain", 2)}
		healthy := []outbox.Envelope{h.envelope(t, "fail-chain-ok", 0), h.envelope(t, "fail-chain-ok", 1)}
		both := h.publishChains(t, cp, [][]outbox.Envelope{chain, healthy})
		res = both[0]
		switch {
		case res.Acked > 1 || res.Err == nil:
			t.Fatalf("PublishChains of [ok, refused, ok]: acked %d, err %v; want at most 1 acked and an error", res.Acked, res.Err)
		case outbox.IsUnavailable(res.Err):
			t.Fatalf("PublishChains: the refusal %v is reported as an unavailable broker (outbox.IsUnavailable): it is the row's error", res.Err)
		case both[1].Acked != len(healthy) || both[1].Err != nil:
			t.Fatalf("PublishChains: another key's chain in the call with the refused one: acked %d of %d, err %v; want it acknowledged whole",
				both[1].Acked, len(healthy), both[1].Err)
		}
		acked = append(acked, chain[:res.Acked]...)
		acked = append(acked, healthy...)
		sentinels = append(sentinels, h.envelope(t, "fail-chain", 3), h.envelope(t, "fail-chain-ok", 2))
	}
	if err := h.publish(t, sentinels); err != nil {
		t.Fatalf("Publish of the sentinels: %v", err)
	}
	acked = append(acked, sentinels...)
	got := h.byID(h.Read(t, len(acked)))
	h.mustHold(t, got, acked)
	if n := len(got[bad.ID.String()]); n != 0 {
		t.Fatalf("the refused envelope %s is on the topic (%d copies)", bad.ID, n)
	}
	if chains {
		for _, e := range chain[res.Acked:] {
			if n := len(got[e.ID.String()]); n != 0 {
				t.Fatalf("chain envelope %s (n=%s) after the refused one is on the topic: a chain's stored part must be a prefix", e.ID, e.Headers["publishertest-n"])
			}
		}
	}
}
