package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/kafkapub"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

// workload is one row of the report: a workload through idemq beside its
// roofline.
type workload struct {
	ID, Name string
	Lanes    int
	Roofline string // roofline ID
	// Setup runs once, untimed, before the warm-up (nil: none).
	Setup func(ctx context.Context, b *bench) error
	// Op is one call of a lane workload, run on Lanes lanes for the run's
	// duration; Plain is the same handler in a plain transaction (the
	// latency baseline; nil: no added latency).
	Op, Plain func(b *bench) laneOp
	// Run measures a workload that is not a lane loop (Kafka, relay), when
	// Op is nil.
	Run func(ctx context.Context, b *bench, warm bool) (sample, error)
}

// batch is the batched workloads' messages per transaction.
const batch = 100

// workloads is the table of idemq workloads. The first target reads the
// BatchHandler row by its ID (batch-set-4).
var workloads = []workload{
	{ID: "per-message-1", Name: "per-message (Store.Process)", Lanes: 1, Roofline: "pg-tx-1", Op: processNew, Plain: plainTx},
	{ID: "per-message-8", Name: "per-message (Store.Process)", Lanes: 8, Roofline: "pg-tx-8", Op: processNew, Plain: plainTx},
	{ID: "per-message-32", Name: "per-message (Store.Process)", Lanes: 32, Roofline: "pg-tx-32", Op: processNew, Plain: plainTx},
	{ID: "batched-1", Name: "batched 100/tx, per-message Handler (ProcessBatch)", Lanes: 1, Roofline: "pg-batch100-1", Op: batchNew, Plain: plainBatch},
	{ID: "batched-4", Name: "batched 100/tx, per-message Handler (ProcessBatch)", Lanes: 4, Roofline: "pg-pipe100-4", Op: batchNew, Plain: plainBatch},
	{ID: "batch-set-1", Name: "batched 100/tx, BatchHandler (ProcessBatchSet)", Lanes: 1, Roofline: "pg-batch100-1", Op: batchSetNew, Plain: plainBatchSet},
	{ID: "batch-set-4", Name: "batched 100/tx, BatchHandler (ProcessBatchSet)", Lanes: 4, Roofline: "pg-pipe100-4", Op: batchSetNew, Plain: plainBatchSet},
	{ID: "dup-pg-1", Name: "duplicates, Postgres only (Process)", Lanes: 1, Roofline: "pg-dup-1", Setup: loadDups, Op: dupOne(false), Plain: plainDupOne},
	{ID: "dup-redis-1", Name: "duplicates, Redis fast path (Process)", Lanes: 1, Roofline: "pg-dup-1", Setup: loadDups, Op: dupOne(true), Plain: plainDupOne},
	{ID: "dup-pg-batch100-1", Name: "duplicates, Postgres only, batched 100 (ProcessBatch)", Lanes: 1, Roofline: "pg-dup100-1", Setup: loadDups, Op: dupBatch(false), Plain: plainDupBatch},
	{ID: "dup-redis-batch100-1", Name: "duplicates, Redis fast path, batched 100 (ProcessBatch)", Lanes: 1, Roofline: "pg-dup100-1", Setup: loadDups, Op: dupBatch(true), Plain: plainDupBatch},
	{ID: "consumer-kafka-4", Name: "consumer.Run on Kafka, 4 partitions, batched 100", Lanes: 4, Roofline: "kafka-read-4", Run: consumerKafka},
	{ID: "relay", Name: "outbox relay (Relay + kafkapub), batch 500", Lanes: 1, Roofline: "kafka-write", Run: relayRun},
}

// insertPayment is the handler's business write.
func (b *bench) insertPayment(ctx context.Context, tx pgx.Tx, id string) error {
	_, err := tx.Exec(ctx, `insert into `+table(b.idemqSch, "payments")+` (payment_id, amount) values ($1, 100)`, id)
	return err
}

// handler is the workloads' pgstore handler: the business write, keyed by
// message ID.
func (b *bench) handler(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
	return b.insertPayment(ctx, tx, m.Identity.MessageID)
}

func wantAll(res []dedup.Result, want dedup.Outcome) error {
	for _, r := range res {
		if r.Outcome != want {
			return fmt.Errorf("outcome %s (%v), want %s", r.Outcome, r.Err, want)
		}
	}
	return nil
}

func processNew(b *bench) laneOp {
	return func(ctx context.Context, c call) (int, error) {
		m, err := msg(c.Key)
		if err != nil {
			return 0, err
		}
		res, err := b.store.Process(ctx, m, b.handler)
		if err != nil {
			return 0, err
		}
		return 1, wantAll([]dedup.Result{res}, dedup.OutcomeProcessed)
	}
}

func plainTx(b *bench) laneOp {
	return func(ctx context.Context, c call) (int, error) {
		return 1, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return b.insertPayment(ctx, tx, c.Key) })
	}
}

func batchMsgs(prefix string, n int, key func(i int) string) ([]*dedup.Message, error) {
	msgs := make([]*dedup.Message, n)
	for i := range msgs {
		id := prefix + "-" + strconv.Itoa(i)
		if key != nil {
			id = key(i)
		}
		m, err := msg(id)
		if err != nil {
			return nil, err
		}
		msgs[i] = m
	}
	return msgs, nil
}

func batchNew(b *bench) laneOp {
	return func(ctx context.Context, c call) (int, error) {
		msgs, err := batchMsgs(c.Key, batch, nil)
		if err != nil {
			return 0, err
		}
		res, err := b.store.ProcessBatch(ctx, msgs, b.handler)
		if err != nil {
			return 0, err
		}
		return batch, wantAll(res, dedup.OutcomeProcessed)
	}
}

// batchHandler is the set-based handler: the new messages' business rows
// in one unnest insert.
func (b *bench) batchHandler(ctx context.Context, tx pgx.Tx, msgs []*dedup.Message) error {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.Identity.MessageID
	}
	_, err := tx.Exec(ctx, `insert into `+table(b.idemqSch, "payments")+` (payment_id, amount) select id, 100 from unnest($1::text[]) id`, ids)
	return err
}

func batchSetNew(b *bench) laneOp {
	return func(ctx context.Context, c call) (int, error) {
		msgs, err := batchMsgs(c.Key, batch, nil)
		if err != nil {
			return 0, err
		}
		res, err := b.store.ProcessBatchSet(ctx, msgs, b.batchHandler)
		if err != nil {
			return 0, err
		}
		return batch, wantAll(res, dedup.OutcomeProcessed)
	}
}

// plainBatchSet is batchSetNew's handler in a plain transaction: the same
// unnest insert.
func plainBatchSet(b *bench) laneOp {
	return func(ctx context.Context, c call) (int, error) {
		msgs, err := batchMsgs(c.Key, batch, nil)
		if err != nil {
			return 0, err
		}
		return batch, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return b.batchHandler(ctx, tx, msgs) })
	}
}

func plainBatch(b *bench) laneOp {
	return func(ctx context.Context, c call) (int, error) {
		return batch, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			for i := range batch {
				if err := b.insertPayment(ctx, tx, c.Key+"-"+strconv.Itoa(i)); err != nil {
					return err
				}
			}
			return nil
		})
	}
}

// dupKey is the i-th of the dupKeys messages loadDups processed.
func (b *bench) dupKey(i int) string { return "dup-" + b.tag + "-" + strconv.Itoa(i%dupKeys) }

// loadDups processes dupKeys messages through the store with the Redis
// fast path (records in Postgres, markers in Redis), untimed, once per run.
func loadDups(ctx context.Context, b *bench) error {
	if !b.once("idemq-dups") {
		return nil
	}
	for i := 0; i < dupKeys; i += batch {
		msgs, err := batchMsgs("", batch, func(j int) string { return b.dupKey(i + j) })
		if err != nil {
			return err
		}
		res, err := b.fast.ProcessBatch(ctx, msgs, b.handler)
		if err != nil {
			return err
		}
		if err := wantAll(res, dedup.OutcomeProcessed); err != nil {
			return err
		}
	}
	_, err := b.pool.Exec(ctx, `analyze `+table(b.idemqSch, "consumption_records"))
	return err
}

func dupOne(redis bool) func(b *bench) laneOp {
	return func(b *bench) laneOp {
		st := b.store
		if redis {
			st = b.fast
		}
		return func(ctx context.Context, c call) (int, error) {
			m, err := msg(b.dupKey(c.Seq*7919 + c.Lane))
			if err != nil {
				return 0, err
			}
			res, err := st.Process(ctx, m, b.handler)
			if err != nil {
				return 0, err
			}
			return 1, wantAll([]dedup.Result{res}, dedup.OutcomeDuplicate)
		}
	}
}

func plainDupOne(b *bench) laneOp {
	q := `select id, message_id, business_key, fingerprint, fingerprint_key_id, status, attempts from ` +
		table(b.idemqSch, "consumption_records") + ` where scope = $1 and message_id = $2`
	return func(ctx context.Context, c call) (int, error) {
		rows, err := b.pool.Query(ctx, q, scope, b.dupKey(c.Seq*7919+c.Lane))
		if err != nil {
			return 0, err
		}
		rows.Close()
		return 1, rows.Err()
	}
}

func dupBatch(redis bool) func(b *bench) laneOp {
	return func(b *bench) laneOp {
		st := b.store
		if redis {
			st = b.fast
		}
		return func(ctx context.Context, c call) (int, error) {
			first := (c.Seq*batch*13 + c.Lane*batch) % (dupKeys - batch)
			msgs, err := batchMsgs("", batch, func(i int) string { return b.dupKey(first + i) })
			if err != nil {
				return 0, err
			}
			res, err := st.ProcessBatch(ctx, msgs, b.handler)
			if err != nil {
				return 0, err
			}
			return batch, wantAll(res, dedup.OutcomeDuplicate)
		}
	}
}

func plainDupBatch(b *bench) laneOp {
	q := `select id, message_id, business_key, fingerprint, fingerprint_key_id, status, attempts from ` +
		table(b.idemqSch, "consumption_records") + ` where scope = $1 and message_id = any($2::text[])`
	return func(ctx context.Context, c call) (int, error) {
		first := (c.Seq*batch*13 + c.Lane*batch) % (dupKeys - batch)
		keys := make([]string, batch)
		for i := range keys {
			keys[i] = b.dupKey(first + i)
		}
		rows, err := b.pool.Query(ctx, q, scope, keys)
		if err != nil {
			return 0, err
		}
		rows.Close()
		return batch, rows.Err()
	}
}

// outcomeCounter is a consumer.Metrics counting recorded outcomes.
type outcomeCounter struct {
	n, bad atomic.Int64
	done   chan struct{}
	want   int64
}

func (o *outcomeCounter) Delivery(_ string, outcome dedup.Outcome, _ dedup.MatchedBy) {
	if outcome != dedup.OutcomeProcessed {
		o.bad.Add(1)
	}
	if o.n.Add(1) == o.want {
		close(o.done)
	}
}

// consumerKafka runs consumer.Run (kafkaadapter.Source, batched atomic
// mode, BatchSize 100, the handler's insert) over a topic of 4 partitions
// holding the run's messages: from the first handler call to the last
// recorded outcome (joining the group is not timed).
func consumerKafka(ctx context.Context, b *bench, warm bool) (sample, error) {
	n := b.kafkaMsgs(warm)
	topic, err := b.newTopic(ctx, 4)
	if err != nil {
		return sample{}, err
	}
	if err := b.produce(ctx, topic, n); err != nil {
		return sample{}, err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{Logger: quiet, Reader: kafka.ReaderConfig{Brokers: b.brokers,
		GroupID: "idemq-" + topic, Topic: topic, StartOffset: kafka.FirstOffset, MaxWait: 100 * time.Millisecond,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: time.Second, RebalanceTimeout: 6 * time.Second}})
	if err != nil {
		return sample{}, err
	}
	counter := &outcomeCounter{done: make(chan struct{}), want: int64(n)}
	var first atomic.Pointer[time.Time]
	c, err := consumer.New(consumer.Config{Scope: scope, Store: b.store, BatchSize: batch, Metrics: counter, Logger: quiet,
		Handler: func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
			if first.Load() == nil {
				now := time.Now()
				first.CompareAndSwap(nil, &now)
			}
			return b.handler(ctx, tx, m)
		}})
	if err != nil {
		return sample{}, err
	}
	m, err := b.startMeter(ctx)
	if err != nil {
		return sample{}, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx, src) }()
	select {
	case <-counter.done:
	case err := <-done:
		return sample{}, fmt.Errorf("consumer.Run returned before %d outcomes: %w", n, err)
	case <-time.After(5 * time.Minute):
		cancel()
		return sample{}, errors.Join(fmt.Errorf("consumer.Run: %d of %d outcomes after 5 minutes", counter.n.Load(), n), <-done)
	}
	s, err := m.stop(ctx, int64(n), *first.Load())
	cancel()
	if rerr := <-done; rerr != nil && err == nil {
		err = fmt.Errorf("consumer.Run: %w", rerr)
	}
	if bad := counter.bad.Load(); bad > 0 && err == nil {
		err = fmt.Errorf("consumer.Run: %d outcomes not processed", bad)
	}
	return s, err
}

// relayBatch is the relay's BatchSize and the raw Writer's batch.
const relayBatch = 500

// relayRows is the run's relay row count (a tenth when warm).
func (b *bench) relayRows(warm bool) int {
	if warm {
		return max(b.cfg.RelayRows/10, relayBatch)
	}
	return b.cfg.RelayRows
}

// relayTopic is the relay's topic (3 partitions), created once.
func (b *bench) relayTopic(ctx context.Context) (string, error) {
	b.mu.Lock()
	for _, t := range b.topics {
		if len(t) > 0 && t[len(t)-6:] == "-relay" {
			b.mu.Unlock()
			return t, nil
		}
	}
	b.mu.Unlock()
	topic := "idemq-bench-" + b.tag + "-relay"
	if err := kafkaadapter.EnsureTopics(ctx, b.brokers, 3, topic); err != nil {
		return "", err
	}
	b.mu.Lock()
	b.topics = append(b.topics, topic)
	b.mu.Unlock()
	return topic, nil
}

// relayMessages are n outbox messages over 50 keys.
func relayMessages(topic string, n int) []outbox.Message {
	out := make([]outbox.Message, n)
	for i := range out {
		k := fmt.Sprintf("key-%04d", i%50)
		out[i] = outbox.Message{Topic: topic, Key: []byte(k), Headers: map[string]string{"bench": "relay"},
			Payload: []byte(fmt.Sprintf(`{"key":%q,"n":%d,"pad":"0123456789abcdef0123456789abcdef"}`, k, i))}
	}
	return out
}

// relayEnvelopes are relayMessages as the relay publishes them.
func relayEnvelopes(b *bench, topic string, n int) []kafka.Message {
	out := make([]kafka.Message, n)
	for i, m := range relayMessages(topic, n) {
		out[i] = kafkapub.Message(b.ob.Envelope(outbox.Row{ID: uuid.Must(uuid.NewV7()), Topic: m.Topic, Key: m.Key, Headers: m.Headers, Payload: m.Payload}))
	}
	return out
}

// relayRun inserts the run's rows into the outbox (untimed), then times one
// relay (outbox.Relay.RunOnce, kafkapub, BatchSize 500) moving them all.
func relayRun(ctx context.Context, b *bench, warm bool) (sample, error) {
	rows := b.relayRows(warm)
	topic, err := b.relayTopic(ctx)
	if err != nil {
		return sample{}, err
	}
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := b.ob.AddBatch(ctx, tx, relayMessages(topic, rows))
		return err
	})
	if err != nil {
		return sample{}, err
	}
	r, err := outbox.NewRelay(b.ob, b.pub, outbox.RelayConfig{Name: "bench", BatchSize: relayBatch,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return sample{}, err
	}
	m, err := b.startMeter(ctx)
	if err != nil {
		return sample{}, err
	}
	for moved := 0; moved < rows; {
		res, err := r.RunOnce(ctx)
		if err != nil {
			return sample{}, err
		}
		if res.Failed > 0 {
			return sample{}, fmt.Errorf("relay: publish failures: %+v", res)
		}
		if res.Published == 0 {
			return sample{}, fmt.Errorf("relay: nothing to publish after %d of %d rows", moved, rows)
		}
		moved += res.Published
	}
	return m.stop(ctx, int64(rows), time.Time{})
}
