package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// roofline is what the same Postgres or Kafka does with the same work and no
// idemq, measured in the same run.
type roofline struct {
	ID, Name string
	Conns    int
	// Setup runs once, untimed, before the warm-up (nil: none).
	Setup func(ctx context.Context, b *bench) error
	// Run measures one run; warm is the short warm-up run.
	Run func(ctx context.Context, b *bench, warm bool) (sample, error)
}

// dupKeys is how many existing records the duplicate checks read (pgbench
// and idemq alike).
const dupKeys = 5000

// rooflines is the table of rooflines. pgbench scripts use {{s}} for the
// scratch schema.
var rooflines = []roofline{
	{ID: "pg-tx-1", Name: "pgbench per-message tx (record + business row)", Conns: 1, Run: pgbenchRun(perMsgScript, 1, 1)},
	{ID: "pg-tx-8", Name: "pgbench per-message tx (record + business row)", Conns: 8, Run: pgbenchRun(perMsgScript, 8, 1)},
	{ID: "pg-tx-32", Name: "pgbench per-message tx (record + business row)", Conns: 32, Run: pgbenchRun(perMsgScript, 32, 1)},
	{ID: "pg-batch100-1", Name: "pgbench batched, 100 msgs/tx", Conns: 1, Run: pgbenchRun(batchScript(100, false), 1, 100)},
	{ID: "pg-batch100-4", Name: "pgbench batched, 100 msgs/tx", Conns: 4, Run: pgbenchRun(batchScript(100, false), 4, 100)},
	{ID: "pg-pipe100-4", Name: "pgbench pipelined batched, 100 msgs/tx", Conns: 4, Run: pgbenchRun(batchScript(100, true), 4, 100)},
	{ID: "pg-dup-1", Name: "pgbench duplicate check (read an existing record)", Conns: 1, Setup: loadPgbenchDups, Run: pgbenchRun(dupScript, 1, 1)},
	{ID: "pg-dup100-1", Name: "pgbench duplicate check, 100 keys per select", Conns: 1, Setup: loadPgbenchDups, Run: pgbenchRun(dupBatchScript, 1, 100)},
	{ID: "kafka-read-4", Name: "kafka-go Reader, consumer group, commit per 100", Conns: 4, Run: rawKafkaRead},
	{ID: "kafka-write", Name: "kafka-go Writer (acks=all), the relay's batches", Conns: 1, Run: rawKafkaWrite},
}

// The record row of a pgbench message: the columns idemq's claim writes
// (dedup/pgstore/sql/records.sql, claim_insert), inserted as SUCCEEDED.
const recordInsert = `insert into {{s}}.consumption_records (scope, message_id, business_key, fingerprint, fingerprint_key_id, status, attempts, source, reconsume_times, expires_at)
  values ('bench', 'pgb-' || :k, '', '\x000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f'::bytea, 'k1', 'SUCCEEDED', 1, '', 0, now() + interval '24 hours')
  on conflict do nothing;
insert into {{s}}.payments (payment_id, amount) values ('pgb-' || :k, 100);
`

// perMsgScript is one message per transaction.
const perMsgScript = "\\set k random(1, 9000000000000000)\nbegin;\n" + recordInsert + "commit;\n"

// batchScript is n messages per transaction, statement by statement or in
// one pipeline.
func batchScript(n int, pipelined bool) string {
	var b strings.Builder
	if pipelined {
		b.WriteString("\\startpipeline\n")
	}
	b.WriteString("begin;\n")
	for range n {
		b.WriteString("\\set k random(1, 9000000000000000)\n" + recordInsert)
	}
	b.WriteString("commit;\n")
	if pipelined {
		b.WriteString("\\endpipeline\n")
	}
	return b.String()
}

// The read a duplicate costs: the record of a key that exists.
const recordSelect = `select id, message_id, business_key, fingerprint, fingerprint_key_id, status, attempts from {{s}}.consumption_records where scope = 'bench' and `

var (
	dupScript      = fmt.Sprintf("\\set k random(1, %d)\n%smessage_id = 'dup-' || :k;\n", dupKeys, recordSelect)
	dupBatchScript = fmt.Sprintf("\\set k random(1, %d)\n%smessage_id = any (array(select 'dup-' || g from generate_series(:k, :k + 99) g));\n",
		dupKeys-99, recordSelect)
)

// loadPgbenchDups inserts the records the duplicate checks read, once per
// run.
func loadPgbenchDups(ctx context.Context, b *bench) error {
	if !b.once("pgbench-dups") {
		return nil
	}
	_, err := b.pool.Exec(ctx, strings.ReplaceAll(`insert into {{s}}.consumption_records (scope, message_id, fingerprint, fingerprint_key_id, status, attempts, expires_at)
		select 'bench', 'dup-' || g, '\x00'::bytea, 'k1', 'SUCCEEDED', 1, now() + interval '24 hours' from generate_series(1, $1::int) g`,
		"{{s}}", b.pgbSch), dupKeys)
	if err == nil {
		_, err = b.pool.Exec(ctx, `analyze `+table(b.pgbSch, "consumption_records"))
	}
	return err
}

// pgbenchRun runs script with conns connections for the run's duration (the
// warm-up's when warm); msgsPerTx converts transactions into messages. The WAL is
// counted around pgbench; allocations are not (another process).
func pgbenchRun(script string, conns, msgsPerTx int) func(ctx context.Context, b *bench, warm bool) (sample, error) {
	return func(ctx context.Context, b *bench, warm bool) (sample, error) {
		f, err := os.CreateTemp("", "benchreport-*.pgbench")
		if err != nil {
			return sample{}, err
		}
		defer func() { _ = os.Remove(f.Name()) }()
		if _, err := f.WriteString(strings.ReplaceAll(script, "{{s}}", `"`+b.pgbSch+`"`)); err != nil {
			_ = f.Close()
			return sample{}, err
		}
		if err := f.Close(); err != nil {
			return sample{}, err
		}
		d := b.cfg.Duration
		if warm {
			d = b.cfg.Warmup
		}
		// At least 2s: pgbench's -T includes connecting (about 0.5s for 32
		// connections with SCRAM), which its tps leaves out.
		secs := max(2, int(math.Round(d.Seconds())))
		before, err := b.wal(ctx)
		if err != nil {
			return sample{}, err
		}
		app := "benchreport-pgbench-" + b.tag
		out, err := runTool(ctx, "", b.pgbench, "-n", "-M", "prepared", "-f", f.Name(), "-c", strconv.Itoa(conns),
			"-j", strconv.Itoa(min(conns, 4)), "-T", strconv.Itoa(secs), withAppName(b.dsn, app))
		if err != nil {
			return sample{}, err
		}
		if err := b.backendsGone(ctx, app); err != nil {
			return sample{}, err
		}
		after, err := b.wal(ctx)
		if err != nil {
			return sample{}, err
		}
		res, err := parsePgbench(out)
		if err != nil {
			return sample{}, fmt.Errorf("%w: %s", err, lastLines(out, 6))
		}
		msgs := res.Txns * int64(msgsPerTx)
		// pgbench's tps excludes connecting: Elapsed is derived from it.
		el := time.Duration(float64(res.Txns) / res.TPS * float64(time.Second))
		return sample{Msgs: msgs, Elapsed: el, WAL: after.sub(before)}, nil
	}
}

// withAppName adds application_name to a connection string (URL or
// key=value form).
func withAppName(dsn, app string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		return dsn + sep + "application_name=" + app
	}
	return dsn + " application_name=" + app
}

// backendsGone waits (up to 5s) until the server's backends of application
// app have exited, and a little longer: a backend reports its WAL counts
// to pg_stat_wal as it exits, just after it leaves pg_stat_activity.
func (b *bench) backendsGone(ctx context.Context, app string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		var n int
		if err := b.pool.QueryRow(ctx, `select count(*) from pg_stat_activity where application_name = $1`, app).Scan(&n); err != nil {
			return err
		}
		if n == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	return nil
}

// produce writes n messages with message-id headers to topic, untimed.
func (b *bench) produce(ctx context.Context, topic string, n int) error {
	w := &kafka.Writer{Addr: kafka.TCP(b.brokers...), Topic: topic, RequiredAcks: kafka.RequireAll,
		BatchTimeout: 5 * time.Millisecond, BatchSize: 1000, Balancer: &kafka.RoundRobin{}}
	defer func() { _ = w.Close() }()
	tag := b.runTag("k")
	msgs := make([]kafka.Message, 0, 1000)
	for i := range n {
		msgs = append(msgs, kafka.Message{Value: payload,
			Headers: []kafka.Header{{Key: "message-id", Value: []byte(tag + "-" + strconv.Itoa(i))}}})
		if len(msgs) == cap(msgs) || i == n-1 {
			if err := w.WriteMessages(ctx, msgs...); err != nil {
				return err
			}
			msgs = msgs[:0]
		}
	}
	return nil
}

// kafkaMsgs is the run's Kafka message count (a tenth when warm).
func (b *bench) kafkaMsgs(warm bool) int {
	if warm {
		return max(b.cfg.KafkaMsgs/10, 100)
	}
	return b.cfg.KafkaMsgs
}

// rawKafkaRead reads a topic of 4 partitions with a kafka-go consumer-group
// Reader, committing every 100 messages: from the first message to the
// last commit (joining the group is not timed).
func rawKafkaRead(ctx context.Context, b *bench, warm bool) (sample, error) {
	n := b.kafkaMsgs(warm)
	topic, err := b.newTopic(ctx, 4)
	if err != nil {
		return sample{}, err
	}
	if err := b.produce(ctx, topic, n); err != nil {
		return sample{}, err
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: b.brokers, GroupID: "raw-" + topic, Topic: topic,
		StartOffset: kafka.FirstOffset, MaxWait: 100 * time.Millisecond, SessionTimeout: 6 * time.Second,
		HeartbeatInterval: time.Second, RebalanceTimeout: 6 * time.Second})
	defer func() { _ = r.Close() }()
	m, err := b.startMeter(ctx)
	if err != nil {
		return sample{}, err
	}
	var first time.Time
	batch := make([]kafka.Message, 0, 100)
	for i := range n {
		km, err := r.FetchMessage(ctx)
		if err != nil {
			return sample{}, err
		}
		if i == 0 {
			first = time.Now()
		}
		batch = append(batch, km)
		if len(batch) == cap(batch) || i == n-1 {
			if err := r.CommitMessages(ctx, batch...); err != nil {
				return sample{}, err
			}
			batch = batch[:0]
		}
	}
	s, err := m.stop(ctx, int64(n), first)
	s.WAL = walDelta{} // no Postgres in it: n/a, not the server's other traffic
	return s, err
}

// rawKafkaWrite writes the relay's messages (the same envelopes, batches
// of the relay's BatchSize) from memory with a kafka-go Writer, acks=all.
func rawKafkaWrite(ctx context.Context, b *bench, warm bool) (sample, error) {
	rows := b.relayRows(warm)
	topic, err := b.relayTopic(ctx)
	if err != nil {
		return sample{}, err
	}
	km := relayEnvelopes(b, topic, rows)
	w := &kafka.Writer{Addr: kafka.TCP(b.brokers...), RequiredAcks: kafka.RequireAll, Balancer: kafka.Murmur2Balancer{},
		BatchTimeout: 2 * time.Millisecond, BatchSize: relayBatch}
	defer func() { _ = w.Close() }()
	m, err := b.startMeter(ctx)
	if err != nil {
		return sample{}, err
	}
	for i := 0; i < len(km); i += relayBatch {
		if err := w.WriteMessages(ctx, km[i:min(i+relayBatch, len(km))]...); err != nil {
			return sample{}, err
		}
	}
	s, err := m.stop(ctx, int64(rows), time.Time{})
	s.WAL = walDelta{} // no Postgres in it: n/a, not the server's other traffic
	return s, err
}
