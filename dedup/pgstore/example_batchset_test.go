package pgstore_test

import (
	"context"
	"fmt"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
)

// A BatchHandler writes a whole batch with one statement: ProcessBatchSet
// claims the batch in one round trip, calls the handler once with the new
// messages only (duplicates are answered from the claim), in order, and
// commits the records with the handler's rows. If the handler fails, the
// batch is rerun one message per transaction, the handler called with
// one-message slices, so that only the message at fault is marked.
func ExampleStore_ProcessBatchSet() {
	var h pgstore.BatchHandler = func(ctx context.Context, tx pgx.Tx, msgs []*dedup.Message) error {
		ids := make([]string, len(msgs))
		payloads := make([][]byte, len(msgs))
		for i, m := range msgs {
			ids[i], payloads[i] = m.Identity.MessageID, m.Payload
		}
		_, err := tx.Exec(ctx, `insert into payments (message_id, body)
select * from unnest($1::text[], $2::bytea[])`, ids, payloads)
		return err
	}
	process := func(ctx context.Context, store *pgstore.Store, msgs []*dedup.Message) error {
		results, err := store.ProcessBatchSet(ctx, msgs, h)
		if err != nil {
			return err // nothing of the batch is durable: ack nothing
		}
		for i, r := range results {
			if !r.Outcome.Acked() {
				break // a retry: this message and the later ones stay unacked
			}
			fmt.Println(msgs[i].Identity.MessageID, r.Outcome)
		}
		return nil
	}
	_ = process
}
