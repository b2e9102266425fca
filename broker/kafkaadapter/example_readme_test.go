package kafkaadapter_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
)

// readmePayment is the README example's message body.
type readmePayment struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Cents   int64  `json:"cents"`
}

func decode(b []byte) readmePayment { var p readmePayment; _ = json.Unmarshal(b, &p); return p }

func paymentID(b []byte) (string, error) { return decode(b).ID, nil }
func acct(m *dedup.Message) string       { return decode(m.Payload).Account }
func amount(m *dedup.Message) int64      { return decode(m.Payload).Cents }

// The README's "Wrapping a kafka-go handler" (internal/docscheck checks that
// it is copied from here): a store, a consumer whose handler writes through
// the record's transaction, and a Kafka source it runs until ctx ends. Every
// error is checked: a constructor that fails returns a nil value.
func runPayments(ctx context.Context, pool *pgxpool.Pool, secret []byte) error {
	fp, err := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "2026-11", Secret: secret}) // secret: 16+ bytes
	if err != nil {
		return err
	}
	store, err := pgstore.New(pool, pgstore.Config{Fingerprinter: fp}) // pool: *pgxpool.Pool
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil { // embedded, versioned SQL
		return err
	}
	c, err := consumer.New(consumer.Config{
		Scope: "payments", Store: store,
		BusinessKey: func(m *dedup.Message) (string, error) { return paymentID(m.Payload) },
		Handler: func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
			_, err := tx.Exec(ctx, `update accounts set balance = balance - $2 where id = $1`, acct(m), amount(m))
			return err // nil: commit with the record; error: rollback, marked for retry
		},
	})
	if err != nil {
		return err
	}
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{Reader: kafka.ReaderConfig{
		Brokers: []string{"127.0.0.1:9092"}, GroupID: "payments", Topic: "payments"}})
	if err != nil {
		return err
	}
	return c.Run(ctx, src) // until ctx ends; then drains, flushes commits, closes
}

// Example_readme runs the README's snippet with a configuration error: a
// fingerprint secret under 16 bytes is refused before anything connects.
func Example_readme() {
	err := runPayments(context.Background(), nil, []byte("short"))
	fmt.Println(err)
	// Output: idemq: fingerprint key "2026-11": secret must be at least 16 bytes, got 5
}
