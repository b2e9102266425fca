package kafkaadapter_test

import (
	"context"
	"encoding/json"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
)

type payment struct {
	PaymentID string `json:"payment_id"`
	Account   string `json:"account"`
	Amount    int64  `json:"amount"`
}

// Wrapping a kafka-go consumer-group handler: the handler's writes and the
// consumption record commit in one transaction; offsets are committed only
// after that. (Compiled, not run: it needs Kafka and Postgres; see
// examples/payments for the runnable demo.)
func ExampleNewSource() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	fp, _ := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "2026-11", Secret: []byte(os.Getenv("IDEMQ_SECRET"))})
	store, err := pgstore.New(pool, pgstore.Config{Fingerprinter: fp})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	c, err := consumer.New(consumer.Config{
		Scope: "payments",
		Store: store,
		BusinessKey: func(m *dedup.Message) (string, error) {
			var p payment
			err := json.Unmarshal(m.Payload, &p)
			return p.PaymentID, err // an error dead-letters the message as bad input
		},
		Handler: func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
			var p payment
			if err := json.Unmarshal(m.Payload, &p); err != nil {
				return dedup.Permanent(err)
			}
			_, err := tx.Exec(ctx, `update accounts set balance = balance - $2 where id = $1`, p.Account, p.Amount)
			return err
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{Reader: kafka.ReaderConfig{
		Brokers: []string{"127.0.0.1:9092"}, GroupID: "payments", Topic: "payments"}})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx, src); err != nil {
		log.Fatal(err)
	}
}
