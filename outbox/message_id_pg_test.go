package outbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/idemq/idemq/wire"
)

// capture is a Publisher that acknowledges every envelope and keeps it.
type capture struct {
	mu   sync.Mutex
	envs []Envelope
}

func (c *capture) Publish(_ context.Context, envs []Envelope) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.envs = append(c.envs, envs...)
	return nil
}

// A row with Message.MessageID is stored with it (Row.MessageID) and the
// relay publishes it under that ID in the message-ID header; a row without
// one is published under its UUIDv7, as before. An invalid MessageID is
// refused, naming the field, and writes nothing.
func TestMessageIDChosenByCaller(t *testing.T) {
	ob, ctx := pgOutbox(t)
	tx, err := ob.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	ids, err := ob.AddBatch(ctx, tx, []Message{
		{Topic: "t", Key: []byte("k"), Payload: []byte("chosen"), MessageID: "order-1#redrive-9"},
		{Topic: "t", Key: []byte("k"), Payload: []byte("plain")},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{" ", strings.Repeat("x", wire.MaxMessageIDBytes+1), "a\x00b", "\xff"} {
		if _, err := ob.Add(ctx, tx, Message{Topic: "t", MessageID: bad}); !errors.Is(err, ErrInvalidMessage) || !strings.Contains(err.Error(), "MessageID") {
			t.Fatalf("Add with MessageID %q: %v, want ErrInvalidMessage naming MessageID", bad, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[uuid.UUID]string{ids[0]: "order-1#redrive-9", ids[1]: ids[1].String()}
	for id, mid := range want {
		row, err := ob.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if (row.MessageID != "") != (mid != id.String()) || (row.MessageID != "" && row.MessageID != mid) {
			t.Fatalf("row %s: MessageID %q, want %q", id, row.MessageID, mid)
		}
		if e := ob.Envelope(row); e.MessageID != mid || e.Headers[wire.MessageIDHeader] != mid || e.ID != id {
			t.Fatalf("row %s: envelope ID %s MessageID %q header %q, want %q", id, e.ID, e.MessageID, e.Headers[wire.MessageIDHeader], mid)
		}
	}
	pub := &capture{}
	r, err := NewRelay(ob, pub, RelayConfig{Name: "mid", DisablePurge: true})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := r.RunOnce(ctx); err != nil || res.Published != 2 {
		t.Fatalf("RunOnce: %+v, %v; want 2 published", res, err)
	}
	if len(pub.envs) != 2 {
		t.Fatalf("%d envelopes published, want 2", len(pub.envs))
	}
	for _, e := range pub.envs {
		if got := e.Headers[wire.MessageIDHeader]; got != want[e.ID] {
			t.Fatalf("published %s (%s) with message-id %q, want %q", e.ID, e.Payload, got, want[e.ID])
		}
	}
}
