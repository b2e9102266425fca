package integration

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/wire"
	"github.com/jackc/pgx/v5"
)

// msg builds a delivery with a normalized identity.
func msg(t testing.TB, scope, messageID, businessKey, payload string) *dedup.Message {
	t.Helper()
	id, err := dedup.NewIdentity(scope, messageID, "", businessKey)
	if err != nil {
		t.Fatal(err)
	}
	return &dedup.Message{Identity: id, Payload: []byte(payload), Topic: "payments", Source: "test:" + messageID, Headers: map[string]string{wire.MessageIDHeader: messageID}}
}

// paymentsTable creates the business table the spy handlers write.
func (e *env) paymentsTable() string {
	tbl := e.table("payments")
	e.exec(`create table ` + tbl + ` (payment_id text primary key, amount bigint not null, order_no text unique)`)
	return tbl
}

// spy counts handler calls and inserts one payment per call.
type spy struct {
	calls atomic.Int64
	table string
	fail  func(call int64, m *dedup.Message) error
}

func (s *spy) handle(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
	n := s.calls.Add(1)
	if s.fail != nil {
		if err := s.fail(n, m); err != nil {
			return err
		}
	}
	_, err := tx.Exec(ctx, `insert into `+s.table+` (payment_id, amount) values ($1, $2)`, m.Identity.MessageID, len(m.Payload))
	return err
}
