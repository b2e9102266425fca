package consumer

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// setStore is markerStore with ProcessBatchSet: it calls the batch handler
// once with the whole batch, as pgstore does for new messages.
type setStore struct {
	*markerStore
	calls [][]string // message IDs of each ProcessBatchSet call
}

func (f *setStore) ProcessBatchSet(ctx context.Context, msgs []*dedup.Message, h dedup.TxBatchHandler[pgx.Tx]) ([]dedup.Result, error) {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.Identity.MessageID
	}
	f.calls = append(f.calls, ids)
	if err := h(ctx, nil, msgs); err != nil {
		return nil, err
	}
	out := make([]dedup.Result, len(msgs))
	for i := range out {
		out[i] = dedup.Result{Outcome: dedup.OutcomeProcessed, Status: dedup.StatusSucceeded, Attempts: 1, HandlerCalled: true}
	}
	return out, nil
}

// Config.BatchHandler is exclusive with Handler and LeaseHandler, needs
// BatchSize > 1 and a store with ProcessBatchSet; each refusal wraps
// ErrInvalidConfig and names the field.
func TestBatchHandlerConfig(t *testing.T) {
	bh := func(context.Context, pgx.Tx, []*dedup.Message) error { return nil }
	h := func(context.Context, pgx.Tx, *dedup.Message) error { return nil }
	set := &setStore{markerStore: newMarkerStore()}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "" = valid
	}{
		{"valid", Config{Store: set, BatchHandler: bh, BatchSize: 10}, ""},
		{"with Handler", Config{Store: set, BatchHandler: bh, Handler: h, BatchSize: 10}, "BatchHandler"},
		{"with LeaseHandler", Config{Store: set, BatchHandler: bh, LeaseHandler: func(context.Context, *dedup.Message) error { return nil }, BatchSize: 10}, "BatchHandler"},
		{"BatchSize 1", Config{Store: set, BatchHandler: bh}, "BatchSize"},
		{"store without ProcessBatchSet", Config{Store: newMarkerStore(), BatchHandler: bh, BatchSize: 10}, "ProcessBatchSet"},
	} {
		tc.cfg.Scope = "orders"
		_, err := New(tc.cfg)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (!errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v; want an ErrInvalidConfig naming %q", tc.name, err, tc.want)
		}
	}
}

// With BatchHandler, HandleBatch goes through ProcessBatchSet (one call per
// batch), and a delivery handled alone (Handle) calls the batch handler with
// a one-message slice.
func TestBatchHandlerDrivesProcessBatchSet(t *testing.T) {
	set := &setStore{markerStore: newMarkerStore()}
	var seen [][]string
	bh := func(_ context.Context, _ pgx.Tx, msgs []*dedup.Message) error {
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			ids[i] = m.Identity.MessageID
		}
		seen = append(seen, ids)
		return nil
	}
	c, err := New(Config{Scope: "orders", Store: set, BatchHandler: bh, BatchSize: 10, CrashLoop: CrashLoopConfig{Off: true}})
	if err != nil {
		t.Fatal(err)
	}
	ds := []Delivery{
		{Message: &dedup.Message{}, MessageID: "a", Position: "p/0/1"},
		{Message: &dedup.Message{}, MessageID: "b", Position: "p/0/2"},
	}
	res, err := c.HandleBatch(context.Background(), ds)
	if err != nil || len(res) != 2 || res[0].Outcome != dedup.OutcomeProcessed || res[1].Outcome != dedup.OutcomeProcessed {
		t.Fatalf("HandleBatch = %+v, %v", res, err)
	}
	if len(set.calls) != 1 || strings.Join(set.calls[0], ",") != "a,b" || len(seen) != 1 || strings.Join(seen[0], ",") != "a,b" {
		t.Fatalf("ProcessBatchSet calls %v, handler calls %v; want one call with a,b", set.calls, seen)
	}
	if _, err := c.Handle(context.Background(), Delivery{Message: &dedup.Message{}, MessageID: "c", Position: "p/0/3"}); err != nil {
		t.Fatal(err)
	}
	if got := set.processed; len(got) != 1 || got[0] != "c" {
		t.Fatalf("Handle went to Process with %v; want c", got)
	}
	// The handler Process gets: the batch handler with a one-message slice.
	if err := c.txh(context.Background(), nil, &dedup.Message{Identity: dedup.Identity{Scope: "orders", MessageID: "c"}}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 2 || strings.Join(seen[1], ",") != "c" {
		t.Fatalf("handler calls %v; want [c] last", seen)
	}
}
