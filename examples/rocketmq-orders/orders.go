package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/wire"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Order is the message payload: one order to create. FailTimes and Poison
// are demo knobs that make the downstream step after the insert fail.
type Order struct {
	OrderID     string `json:"order_id"`
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
	// FailTimes makes the first FailTimes attempts fail after the insert
	// ("inventory service timeout"), as a flaky dependency would.
	FailTimes int `json:"fail_times,omitempty"`
	// Poison makes every attempt fail ("address invalid").
	Poison bool `json:"poison,omitempty"`
}

func decodeOrder(b []byte) (Order, error) {
	var o Order
	if err := json.Unmarshal(b, &o); err != nil {
		return o, fmt.Errorf("decode order: %w", err)
	}
	if o.OrderID == "" {
		return o, errors.New("decode order: empty order_id")
	}
	return o, nil
}

// orderIDOf returns the order ID of a payload, or "" when it does not decode.
func orderIDOf(b []byte) string {
	o, err := decodeOrder(b)
	if err != nil {
		return ""
	}
	return o.OrderID
}

// downstream is the step after the order row is written: reserving stock.
// It is where the demo's failures happen, after a partial effect.
func (o Order) downstream(attempt int) error {
	if o.Poison {
		return errors.New("address invalid")
	}
	if attempt <= o.FailTimes {
		return fmt.Errorf("inventory service timeout (attempt %d)", attempt)
	}
	return nil
}

// Table names in the demo schema. Both tables deliberately have no unique
// order_id (a surrogate key only, as many real tables do), so a double
// application shows up as two rows instead of an error.
const (
	ordersTable = "orders"
	naiveTable  = "naive_orders"
)

func createTables(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	for _, t := range []string{ordersTable, naiveTable} {
		_, err := pool.Exec(ctx, `create table if not exists `+pgx.Identifier{schema, t}.Sanitize()+` (
  id bigserial primary key,
  order_id text not null,
  customer text not null,
  amount_cents bigint not null,
  message_id text not null,
  applied_at timestamptz not null default now())`)
		if err != nil && !isDuplicateObject(err) {
			return fmt.Errorf("create table %s.%s: %w", schema, t, err)
		}
	}
	return nil
}

// isDuplicateObject tolerates two processes creating the same table at once.
func isDuplicateObject(err error) bool {
	return pgstore.IsUniqueViolation(err, "") || dedup.ErrorClass(err) == "pg:42P07"
}

// event is one line the consume subcommand prints on stdout, read by the
// demo and the integration tests.
type event struct {
	Ev        string `json:"ev"` // ready, handler, result, stalled
	Mode      string `json:"mode,omitempty"`
	PID       int    `json:"pid,omitempty"`
	Order     string `json:"order,omitempty"`
	MessageID string `json:"mid,omitempty"`
	Attempt   int    `json:"attempt,omitempty"`
	Reconsume int32  `json:"reconsume,omitempty"`
	Outcome   string `json:"outcome,omitempty"`
	By        string `json:"by,omitempty"`
	Status    string `json:"status,omitempty"`
	Attempts  int    `json:"attempts,omitempty"`
	Ack       bool   `json:"ack,omitempty"`
	Source    string `json:"source,omitempty"`
	Err       string `json:"err,omitempty"`
	Time      string `json:"t,omitempty"`
}

// emitter writes events as JSON lines, one writer at a time.
type emitter struct {
	mu   sync.Mutex
	enc  *json.Encoder
	mode string
}

func newEmitter(mode string) *emitter {
	return &emitter{enc: json.NewEncoder(os.Stdout), mode: mode}
}

func (e *emitter) emit(ev event) {
	ev.Mode, ev.PID, ev.Time = e.mode, os.Getpid(), time.Now().Format("15:04:05.000")
	e.mu.Lock()
	defer e.mu.Unlock()
	_ = e.enc.Encode(ev)
}

// newOrderMessage builds the message for o. messageID, when not empty, is
// set as the wire.MessageIDHeader property (as idemq's outbox relay does); the order
// ID is always the message Keys.
func newOrderMessage(topic string, o Order, messageID string) *primitive.Message {
	body, _ := json.Marshal(o)
	m := primitive.NewMessage(topic, body)
	m.WithKeys([]string{o.OrderID})
	if messageID != "" {
		m.WithProperty(wire.MessageIDHeader, messageID)
	}
	return m
}
