package main

import (
	"testing"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/wire"
)

func TestRepublishEnvelope(t *testing.T) {
	m := dedup.RedriveMessage{MessageID: "m-1#redrive-7", Topic: "orders", Key: []byte("acct-1"), Payload: []byte(`{"n":2}`),
		Headers:      map[string]string{wire.MessageIDHeader: "m-1", "traceparent": "00-a-b-01", "UNIQ_KEY": "U1", "KEYS": "acct-1", "TAGS": "paid"},
		DeadLetterID: 7}
	k := republishEnvelope("kafka", wire.MessageIDHeader, m)
	if k.Topic != "orders" || string(k.Key) != "acct-1" || string(k.Payload) != `{"n":2}` || k.Headers[wire.MessageIDHeader] != "m-1#redrive-7" ||
		k.Headers["traceparent"] != "00-a-b-01" || k.Headers["UNIQ_KEY"] != "U1" {
		t.Fatalf("kafka envelope = %+v", k)
	}
	if m.Headers[wire.MessageIDHeader] != "m-1" {
		t.Fatal("republishEnvelope changed the dead letter's headers")
	}
	r := republishEnvelope("rocketmq", "x-id", m)
	if r.Headers["x-id"] != "m-1#redrive-7" || r.Headers[wire.MessageIDHeader] != "m-1" || r.Headers["TAGS"] != "paid" {
		t.Fatalf("rocketmq envelope = %+v", r)
	}
	if _, ok := r.Headers["UNIQ_KEY"]; ok {
		t.Fatalf("rocketmq envelope keeps the stored copy's UNIQ_KEY: %+v", r.Headers)
	}
	if e := republishEnvelope("kafka", wire.MessageIDHeader, dedup.RedriveMessage{Key: []byte{}}); e.Key != nil {
		t.Fatalf("an empty key is no key: %q", e.Key)
	}
}
