package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/google/uuid"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/outbox"
	"github.com/jackc/pgx/v5"
)

// New applies the documented defaults; the pool may be nil when the Outbox
// only writes through callers' transactions.
func ExampleNew() {
	ob, err := outbox.New(nil, outbox.Config{Schema: "shop"})
	if err != nil {
		panic(err)
	}
	c := ob.Config()
	fmt.Println(c.Schema, c.Table, c.MessageIDHeader, c.CausationHeader)

	_, err = outbox.New(nil, outbox.Config{Table: "Outbox; drop table x"})
	fmt.Println(errors.Is(err, outbox.ErrInvalidConfig))
	// Output:
	// shop outbox message-id causation-id
	// true
}

// A handler writes its business rows and its outbox rows through the same
// transaction: they commit together with the consumption record, or not at
// all.
func ExampleOutbox_Add() {
	ob, _ := outbox.New(nil, outbox.Config{})
	confirm := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		if _, err := tx.Exec(ctx, `insert into shop.orders (order_id, body) values ($1, $2)`, string(m.Key), m.Payload); err != nil {
			return err
		}
		_, err := ob.Add(ctx, tx, outbox.Message{
			Topic:       "order.confirmed",
			Key:         m.Key, // per-key order: one order's events stay in order
			Payload:     m.Payload,
			CausationID: outbox.Causation(m),
		})
		return err
	}
	_ = pgstore.Handler(confirm)
}

// The envelope is what the relay publishes, identical on every republish:
// the row's headers plus the message ID (and causation ID) headers.
func ExampleOutbox_Envelope() {
	ob, _ := outbox.New(nil, outbox.Config{})
	row := outbox.Row{
		ID:          uuid.MustParse("0190a5c4-5d2e-7b3a-8c1d-2e3f4a5b6c7d"),
		Topic:       "order.confirmed",
		Key:         []byte("order-42"),
		Headers:     map[string]string{"content-type": "application/json"},
		Payload:     []byte(`{"order":"order-42"}`),
		CausationID: "confirmer/orders-in-7",
	}
	e := ob.Envelope(row)
	names := make([]string, 0, len(e.Headers))
	for k := range e.Headers {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Printf("%s: %s\n", k, e.Headers[k])
	}
	fmt.Println(e.Topic, string(e.Key))
	// Output:
	// causation-id: confirmer/orders-in-7
	// content-type: application/json
	// message-id: 0190a5c4-5d2e-7b3a-8c1d-2e3f4a5b6c7d
	// order.confirmed order-42
}

// Causation names the delivery whose handler wrote a row.
func ExampleCausation() {
	id, _ := dedup.NewIdentity("confirmer", "m-1000", "", "order-7:confirm")
	fmt.Println(outbox.Causation(&dedup.Message{Identity: id}))
	fmt.Printf("%q\n", outbox.Causation(nil))
	// Output:
	// confirmer/m-1000/order-7:confirm
	// ""
}

// A Publisher reports per-envelope failures with PublishErrors; the relay
// marks the acknowledged rows and retries the others with backoff.
func ExamplePublishErrors() {
	flaky := outbox.PublisherFunc(func(_ context.Context, batch []outbox.Envelope) error {
		errs := make(outbox.PublishErrors, len(batch))
		for i, e := range batch {
			if e.Topic == "missing" {
				errs[i] = errors.New("unknown topic")
			}
		}
		return errs
	})
	err := flaky.Publish(context.Background(), []outbox.Envelope{{Topic: "orders"}, {Topic: "missing"}})
	var pe outbox.PublishErrors
	fmt.Println(errors.As(err, &pe), pe[0] == nil, pe[1])
	fmt.Println(err)
	// Output:
	// true true unknown topic
	// idemq/outbox: publish: 1 of 2 failed; first: unknown topic
}
