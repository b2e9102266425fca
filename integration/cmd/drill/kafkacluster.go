package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/kafkapub"
	"github.com/idemq/idemq/wire"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
)

// kcSchema holds the drill's tables on the services' Postgres
// (TEST_POSTGRES_DSN); it is dropped and made again at each run.
const kcSchema = "drill_kafka_cluster"

type kcFlags struct {
	kills      int
	rate       int
	keys       int
	partitions int
	add        int
	reset      bool
	settle     time.Duration
	recovery   time.Duration
}

// kcKill is what one SIGKILL of a partition leader measured.
type kcKill struct {
	node, partition int
	elected         time.Duration // until the metadata names another leader of the partition
	consumed        time.Duration // until the group committed past the partition's end offset at the kill
	relayed         time.Duration // until an out-topic partition the node led grew past its end offset at the kill
	isr             time.Duration // from the restart until the node is back in every partition's ISR
}

// recovery is when both the consumers and the relay made progress again.
func (k kcKill) recovery() time.Duration { return max(k.consumed, k.relayed) }

// kcResult is the drill's findings, from durable state.
type kcResult struct {
	kills             []kcKill
	produced          int // message IDs acknowledged (acks=all) to the producer
	messages          int // distinct message IDs on the input topic
	inputCopies       int // input records beyond the first copy of each ID
	ackedMissing      int // acknowledged IDs not on the input topic
	effects           int
	distinct          int
	lost              int // input messages without an effect
	strange           int // effects of IDs not on the input topic
	perMember         map[int]int
	succeeded         int
	deadLetters       int
	relay             relayCheck // the outbox against the relayed topic
	consumedOrder     int        // keys whose effects (in commit order) do not follow the input order
	relayOrder        int        // keys whose relayed first copies do not follow the outbox order (seq)
	backwards         []string   // committed offsets that went down (not by the reset)
	partitionsBefore  int
	partitionsAfter   int
	addedConsumedIn   time.Duration // from kafka-topics --alter until every added partition had a commit
	addedMessages     int64         // messages on the added partitions (end offsets)
	resetDone         bool
	redelivered       int64 // messages the group consumed again after the reset (its commits from 0 to the end)
	newEffectsOnReset int   // effect rows made after the reset (must be 0)
	newOutboxOnReset  int
	dupAbsorbed       int64 // in-process counter: deliveries found duplicate, both phases
	dupOnReset        int64
	lagAfter          int64
	faultPhase        time.Duration
}

func (r kcResult) duplicateEffects() int { return r.effects - r.distinct }

// broken lists the guarantees the run did not keep.
func (r kcResult) broken(f kcFlags) []string {
	var out []string
	add := func(cond bool, format string, args ...any) {
		if cond {
			out = append(out, fmt.Sprintf(format, args...))
		}
	}
	add(r.duplicateEffects() != 0, "%d duplicate effects", r.duplicateEffects())
	add(r.lost != 0, "%d messages without an effect", r.lost)
	add(r.strange != 0, "%d effects of messages not on the input topic", r.strange)
	add(r.ackedMissing != 0, "%d acknowledged (acks=all) messages missing from the input topic", r.ackedMissing)
	add(r.relay.outboxRows != r.distinct, "%d outbox rows for %d effects", r.relay.outboxRows, r.distinct)
	add(r.relay.unpublished != 0 || r.relay.missing != 0, "%d outbox rows unpublished, %d not on the relayed topic", r.relay.unpublished, r.relay.missing)
	add(r.relay.phantoms != 0, "%d relayed messages without an outbox row", r.relay.phantoms)
	add(r.relay.orderFaults != 0, "%d keys out of order on the relayed topic", r.relay.orderFaults)
	add(len(r.backwards) != 0, "committed offsets went backwards %d times: %s", len(r.backwards), strings.Join(r.backwards, "; "))
	add(r.deadLetters != 0, "%d dead letters", r.deadLetters)
	add(r.lagAfter != 0, "group lag %d at the end", r.lagAfter)
	add(f.add > 0 && r.partitionsAfter != r.partitionsBefore+f.add, "input topic has %d partitions, want %d", r.partitionsAfter, r.partitionsBefore+f.add)
	add(f.reset && (r.newEffectsOnReset != 0 || r.newOutboxOnReset != 0), "the replay after the offset reset made %d effects and %d outbox rows",
		r.newEffectsOnReset, r.newOutboxOnReset)
	add(f.reset && r.redelivered < int64(r.messages), "the replay after the offset reset consumed %d records, fewer than the %d messages", r.redelivered, r.messages)
	return out
}

func runKafkaCluster(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("kafka-cluster", flag.ContinueOnError)
	var f kcFlags
	fs.IntVar(&f.kills, "kills", 4, "partition leaders SIGKILLed (each restarted and back in the ISR before the next)")
	fs.IntVar(&f.rate, "rate", 40, "messages per second produced (acks=all) while the faults run")
	fs.IntVar(&f.keys, "keys", 40, "message keys (per-key order is checked on the relayed topic)")
	fs.IntVar(&f.partitions, "partitions", 4, "partitions of the input and relayed topics at the start")
	fs.IntVar(&f.add, "add-partitions", 2, "partitions added to the input topic with kafka-topics --alter while the group consumes (0: none)")
	fs.BoolVar(&f.reset, "reset", true, "at the end, stop the group, reset its offsets to earliest with kafka-consumer-groups and consume everything again")
	fs.DurationVar(&f.settle, "settle", 5*time.Second, "no new effect for this long, with the group's lag 0 and the outbox published, ends a phase")
	fs.DurationVar(&f.recovery, "recovery-timeout", 90*time.Second, "a kill whose partition is not consumed and relayed again within this fails the drill")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if f.kills < 0 || f.rate < 1 || f.keys < 1 || f.partitions < 1 || f.add < 0 {
		return errors.New("-kills and -add-partitions must not be negative; -rate, -keys and -partitions must be at least 1")
	}
	start := time.Now()
	fmt.Fprintln(os.Stderr, "== kafka-cluster: three KRaft nodes on 127.0.0.1:19092-19094")
	// The cluster goes down whatever happens (the context may be cancelled by then).
	defer func() { _ = topology(context.WithoutCancel(ctx), "kafka", "down") }()
	if err := topology(ctx, "kafka", "up"); err != nil {
		return err
	}
	r, err := kcRun(ctx, f)
	if err != nil {
		return err
	}
	kcPrint(r, f, time.Since(start))
	if b := r.broken(f); len(b) > 0 {
		return fmt.Errorf("exactly-once broken: %s", strings.Join(b, ", "))
	}
	return nil
}

func kcBrokers() []string {
	base := 19092
	if p, err := strconv.Atoi(env("TOPOLOGY_KAFKA_PORT", "19092")); err == nil {
		base = p
	}
	return []string{fmt.Sprintf("127.0.0.1:%d", base), fmt.Sprintf("127.0.0.1:%d", base+1), fmt.Sprintf("127.0.0.1:%d", base+2)}
}

// kcGroup is the consumer group's two members, each a consumer.Run of its
// own with its own kafkaadapter.Source, as two processes would have.
type kcGroup struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	errs   chan error
}

func (g *kcGroup) stop() {
	g.cancel()
	g.wg.Wait()
}

func kcRun(ctx context.Context, f kcFlags) (kcResult, error) {
	var res kcResult
	brokers := kcBrokers()
	root, _ := repoRoot()
	logPath := filepath.Join(root, ".cache", "topology", "kafka", "drill.log")
	logFile, err := os.Create(logPath) // #nosec G304 -- our own cache
	if err != nil {
		return res, err
	}
	defer func() { _ = logFile.Close() }()
	logger := slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelInfo}))
	logf("the consumers' and the relay's log: %s", logPath)

	dsn := env("TEST_POSTGRES_DSN", "postgres://idemq:idemq@127.0.0.1:5432/idemq?sslmode=disable")
	pool, err := kcPool(ctx, dsn)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	s := pgx.Identifier{kcSchema}.Sanitize()
	if _, err := pool.Exec(ctx, `drop schema if exists `+s+` cascade`); err != nil {
		return res, err
	}
	setup, err := setupStoreOutbox(ctx, pool, "kafka-cluster", kcSchema, 5, logger)
	if err != nil {
		return res, err
	}
	store, ob := setup.store, setup.ob
	// No unique constraint: a second effect of a message is a second row.
	if _, err := pool.Exec(ctx, `create table `+s+`.effects (n bigint generated always as identity primary key,
member int not null, message_id text not null, at timestamptz not null default clock_timestamp())`); err != nil {
		return res, err
	}

	sfx := suffix()
	in, out, group := "drill-kc-"+sfx, "drill-kc-out-"+sfx, "drill-kc-"+sfx
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second}
	if err := kcCreateTopics(ctx, cl, brokers, f.partitions, in, out); err != nil {
		return res, err
	}
	res.partitionsBefore = f.partitions
	logf("topics %s and %s: %d partitions, replication factor 3, min.insync.replicas 2", in, out, f.partitions)

	// The relay runs from here to the end.
	relayCtx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	pub, err := kafkapub.New(kafkapub.Config{Brokers: brokers, WriteTimeout: 5 * time.Second, MetadataTTL: 2 * time.Second})
	if err != nil {
		return res, err
	}
	relay, err := outbox.NewRelay(ob, pub, outbox.RelayConfig{Name: "drill-relay", PollInterval: 200 * time.Millisecond,
		RetryInitial: 100 * time.Millisecond, RetryMax: time.Second, Logger: logger})
	if err != nil {
		return res, err
	}
	relayErr := make(chan error, 1)
	var relayWG sync.WaitGroup
	relayWG.Add(1)
	go func() {
		defer relayWG.Done()
		if err := relay.Run(relayCtx); err != nil && !errors.Is(err, context.Canceled) {
			relayErr <- err
		}
	}()
	defer relayWG.Wait()
	defer stopRelay()

	counters := []*consumer.Counters{{}, {}}
	startGroup := func(c *consumer.Counters) (*kcGroup, error) {
		gctx, cancel := context.WithCancel(ctx)
		g := &kcGroup{cancel: cancel, errs: make(chan error, 2)}
		for member := 1; member <= 2; member++ {
			cons, err := consumer.New(consumer.Config{Scope: "kc", Store: store, Metrics: c, Logger: logger,
				RetryInitial: 50 * time.Millisecond, RetryMax: time.Second,
				Handler: func(ctx context.Context, tx pgx.Tx, msg *dedup.Message) error {
					if _, err := tx.Exec(ctx, `insert into `+s+`.effects (member, message_id) values ($1, $2)`, member, msg.Identity.MessageID); err != nil {
						return err
					}
					_, err := ob.Add(ctx, tx, outbox.Message{Topic: out, Key: msg.Key, Payload: msg.Payload, CausationID: outbox.Causation(msg)})
					return err
				}})
			if err != nil {
				cancel()
				return nil, err
			}
			src, err := kafkaadapter.NewSource(kafkaadapter.Config{Logger: logger.With("member", member), Reader: kafka.ReaderConfig{
				Brokers: brokers, GroupID: group, Topic: in, MaxWait: 200 * time.Millisecond,
				SessionTimeout: 10 * time.Second, RebalanceTimeout: 20 * time.Second, PartitionWatchInterval: 2 * time.Second}})
			if err != nil {
				cancel()
				return nil, err
			}
			g.wg.Add(1)
			go func() {
				defer g.wg.Done()
				if err := cons.Run(gctx, src); err != nil && !errors.Is(err, context.Canceled) {
					g.errs <- fmt.Errorf("member %d: %w", member, err)
				}
			}()
		}
		return g, nil
	}
	grp, err := startGroup(counters[0])
	if err != nil {
		return res, err
	}
	defer func() { grp.stop() }()
	failed := func() error {
		if err := checkErrs(grp.errs); err != nil {
			return err
		}
		return checkErrs(relayErr)
	}

	mon := newOffsetMonitor(cl, group, in)
	monCtx, stopMon := context.WithCancel(ctx)
	defer stopMon()
	go mon.run(monCtx)

	prod := newProducer(brokers, in, f.keys, f.rate)
	prodCtx, stopProd := context.WithCancel(ctx)
	defer stopProd()
	prodDone := make(chan struct{})
	go func() { defer close(prodDone); prod.run(prodCtx) }()

	// Steady state first: the group has joined and commits.
	faultStart := time.Now()
	if err := waitFor(ctx, 2*time.Minute, failed, "the group's first commits", func() bool {
		c := mon.latest()
		return len(c) > 0 && prod.acked() > 0
	}); err != nil {
		return res, err
	}
	logf("two members consume %s, the relay publishes to %s; %d messages/s produced", in, out, f.rate)

	for i := range f.kills {
		k, err := kcKillOne(ctx, cl, mon, f, in, out, i%f.partitions, failed)
		if err != nil {
			return res, fmt.Errorf("kill %d: %w", i+1, err)
		}
		res.kills = append(res.kills, k)
		logf("kill %d: node %d (leader of %s/%d) SIGKILLed; new leader elected after %s, consumed again after %s, relayed again after %s; restarted, back in every ISR after %s",
			i+1, k.node, in, k.partition, k.elected.Round(10*time.Millisecond), k.consumed.Round(10*time.Millisecond),
			k.relayed.Round(10*time.Millisecond), k.isr.Round(10*time.Millisecond))
		if err := sleep(ctx, time.Second); err != nil {
			return res, err
		}
	}

	if f.add > 0 {
		// Adding partitions moves keys to other partitions: the producer
		// pauses and the group drains first, as an operator must for
		// per-key order to hold across the change.
		prod.pause(true)
		if err := waitFor(ctx, 2*time.Minute, failed, "the group to drain before adding partitions", func() bool {
			lag, err := groupLag(ctx, brokers, group, in)
			return err == nil && lag == 0
		}); err != nil {
			return res, err
		}
		want := f.partitions + f.add
		alterAt := time.Now()
		if err := topology(ctx, "kafka", "topics", "--alter", "--topic", in, "--partitions", strconv.Itoa(want)); err != nil {
			return res, err
		}
		if err := waitFor(ctx, time.Minute, failed, "every broker listing the added partitions", func() bool {
			for _, b := range brokers {
				l, err := kcLeaders(ctx, &kafka.Client{Addr: kafka.TCP(b), Timeout: 5 * time.Second}, in)
				if err != nil || len(l) != want {
					return false
				}
			}
			return true
		}); err != nil {
			return res, err
		}
		logf("kafka-topics --alter --topic %s --partitions %d while the group consumes", in, want)
		prod.reopen() // its next messages go by the new partition count
		prod.pause(false)
		if err := waitFor(ctx, 2*time.Minute, failed, "every added partition consumed", func() bool {
			c := mon.latest()
			for p := f.partitions; p < want; p++ {
				if c[p] <= 0 {
					return false
				}
			}
			return true
		}); err != nil {
			return res, err
		}
		res.addedConsumedIn = time.Since(alterAt)
		logf("every added partition consumed (committed) %s after the alter", res.addedConsumedIn.Round(10*time.Millisecond))
		if err := sleep(ctx, time.Second); err != nil {
			return res, err
		}
	}
	stopProd()
	<-prodDone
	res.faultPhase = time.Since(faultStart)
	res.produced = prod.acked()
	logf("producer stopped: %d messages acknowledged", res.produced)

	if err := kcSettle(ctx, pool, s, brokers, group, in, f.settle, failed); err != nil {
		return res, err
	}
	grp.stop()
	q := func(sql string, args ...any) int {
		var n int64
		if err == nil {
			err = pool.QueryRow(ctx, sql, args...).Scan(&n)
		}
		return int(n)
	}
	effectsBefore := q(`select count(*) from ` + s + `.effects`)
	outboxBefore := q(`select count(*) from ` + s + `.outbox`)
	if err != nil {
		return res, err
	}
	res.dupAbsorbed = counters[0].Snapshot()["duplicate"]

	if f.reset {
		// The group is empty now (its members left): Kafka's tool resets
		// its offsets, and two new members consume everything again.
		mon.pause(true)
		if err := waitFor(ctx, time.Minute, func() error { return nil }, "kafka-consumer-groups --reset-offsets", func() bool {
			return topology(ctx, "kafka", "consumer-groups", "--group", group, "--topic", in, "--reset-offsets", "--to-earliest", "--execute") == nil
		}); err != nil {
			return res, err
		}
		c := mon.read(ctx)
		for p, o := range c {
			if o != 0 {
				return res, fmt.Errorf("after the reset partition %d's committed offset is %d, not 0", p, o)
			}
		}
		logf("kafka-consumer-groups --reset-offsets --to-earliest --execute: %d partitions at offset 0; the group starts again", len(c))
		mon.forget()
		mon.pause(false)
		res.resetDone = true
		grp, err = startGroup(counters[1])
		if err != nil {
			return res, err
		}
		if err := kcSettle(ctx, pool, s, brokers, group, in, f.settle, failed); err != nil {
			return res, err
		}
		grp.stop()
		res.newEffectsOnReset = q(`select count(*) from `+s+`.effects`) - effectsBefore
		res.newOutboxOnReset = q(`select count(*) from `+s+`.outbox`) - outboxBefore
		if err != nil {
			return res, err
		}
		for _, o := range mon.latest() {
			res.redelivered += max(o, 0) // committed from 0 after the reset
		}
		res.dupOnReset = counters[1].Snapshot()["duplicate"]
		res.dupAbsorbed += res.dupOnReset
	}
	stopMon()
	res.backwards = mon.backwardsSeen()
	stopRelay()
	relayWG.Wait()
	if err := failed(); err != nil {
		return res, err
	}

	// Durable state: the topics, the group's offsets and the tables.
	res.lagAfter, err = groupLag(ctx, brokers, group, in)
	if err != nil {
		return res, err
	}
	md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{in}})
	if err != nil {
		return res, err
	}
	res.partitionsAfter = len(md.Topics[0].Partitions)
	if f.add > 0 {
		ends, err := kcEndOffsets(ctx, cl, in, res.partitionsAfter)
		if err != nil {
			return res, err
		}
		for p := f.partitions; p < res.partitionsAfter; p++ {
			res.addedMessages += ends[p]
		}
	}
	input, err := readTopic(ctx, brokers, in)
	if err != nil {
		return res, err
	}
	res.messages = len(input.copies)
	res.inputCopies = input.messages - len(input.copies)
	for _, id := range prod.ackedIDs() {
		if input.copies[id] == 0 {
			res.ackedMissing++
		}
	}
	applied := map[string]int{}
	res.perMember = map[int]int{}
	rows, err := pool.Query(ctx, `select message_id, member from `+s+`.effects`)
	if err != nil {
		return res, err
	}
	for rows.Next() {
		var id string
		var member int
		if err := rows.Scan(&id, &member); err != nil {
			return res, err
		}
		applied[id]++
		res.perMember[member]++
		res.effects++
	}
	if err := rows.Err(); err != nil {
		return res, err
	}
	res.distinct = len(applied)
	for id := range input.copies {
		if applied[id] == 0 {
			res.lost++
		}
	}
	for id := range applied {
		if input.copies[id] == 0 {
			res.strange++
		}
	}
	res.succeeded = q(`select count(*) from ` + s + `.consumption_records where scope = 'kc' and status = 'SUCCEEDED'`)
	res.deadLetters = q(`select count(*) from ` + s + `.dead_letters where scope = 'kc'`)
	if err != nil {
		return res, err
	}
	if res.relay, err = checkRelay(ctx, pool, s+`.outbox`, brokers, out); err != nil {
		return res, err
	}
	// Where an order fault comes from: the consumers (effects committed out
	// of the input order) or the relay (published out of the outbox order).
	effectOrder := map[string][]int{}
	rows, err = pool.Query(ctx, `select e.message_id from `+s+`.effects e order by e.n`)
	if err != nil {
		return res, err
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return res, err
		}
		if i, err := strconv.Atoi(strings.TrimPrefix(id, "m-")); err == nil {
			k := fmt.Sprintf("k-%d", i%f.keys)
			effectOrder[k] = append(effectOrder[k], i)
		}
	}
	if err := rows.Err(); err != nil {
		return res, err
	}
	res.consumedOrder = topicContents{byKey: effectOrder}.orderFaults()
	rank := map[string]int{} // payload within its key -> position in the outbox
	rows, err = pool.Query(ctx, `select convert_from(key, 'UTF8'), convert_from(payload, 'UTF8') from `+s+`.outbox order by seq`)
	if err != nil {
		return res, err
	}
	n := 0
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return res, err
		}
		rank[k+"/"+v] = n
		n++
	}
	if err := rows.Err(); err != nil {
		return res, err
	}
	byRank := map[string][]int{}
	for k, vs := range res.relay.topic.byKey {
		for _, v := range vs {
			if r, ok := rank[k+"/"+strconv.Itoa(v)]; ok {
				byRank[k] = append(byRank[k], r)
			}
		}
	}
	res.relayOrder = topicContents{byKey: byRank}.orderFaults()
	return res, nil
}

// kcPool connects to the services' Postgres, waiting up to 6 minutes: on
// a shared machine CI restarts it between runs.
func kcPool(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 12
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(6 * time.Minute)
	for {
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := pool.Ping(pctx)
		cancel()
		if err == nil {
			return pool, nil
		}
		if time.Now().After(deadline) {
			pool.Close()
			return nil, fmt.Errorf("postgres (%s) does not answer: %w", dsn, err)
		}
		logf("waiting for postgres: %v", err)
		if err := sleep(ctx, 5*time.Second); err != nil {
			pool.Close()
			return nil, err
		}
	}
}

// kcCreateTopics creates the topics with replication factor 3 and
// min.insync.replicas 2, and waits until every partition has a leader and
// three replicas in sync.
func kcCreateTopics(ctx context.Context, cl *kafka.Client, brokers []string, partitions int, topics ...string) error {
	req := &kafka.CreateTopicsRequest{}
	for _, t := range topics {
		req.Topics = append(req.Topics, kafka.TopicConfig{Topic: t, NumPartitions: partitions, ReplicationFactor: 3,
			ConfigEntries: []kafka.ConfigEntry{{ConfigName: "min.insync.replicas", ConfigValue: "2"}}})
	}
	resp, err := cl.CreateTopics(ctx, req)
	if err != nil {
		return fmt.Errorf("create topics: %w", err)
	}
	for t, terr := range resp.Errors {
		if terr != nil {
			return fmt.Errorf("create topic %s: %w", t, terr)
		}
	}
	// Every broker must know the topics: a member's first requests (the
	// horizon check's DescribeConfigs among them) may go to any of them.
	return waitFor(ctx, time.Minute, func() error { return nil }, "the topics' replicas in sync, on every broker", func() bool {
		for _, b := range brokers {
			one := &kafka.Client{Addr: kafka.TCP(b), Timeout: 5 * time.Second}
			if kcAllInSync(ctx, one, topics...) != nil {
				return false
			}
		}
		return true
	})
}

// kcAllInSync returns nil when every partition of topics has a leader and
// all three replicas in sync.
func kcAllInSync(ctx context.Context, cl *kafka.Client, topics ...string) error {
	md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
	if err != nil {
		return err
	}
	if len(md.Topics) != len(topics) {
		return fmt.Errorf("metadata lists %d of %d topics", len(md.Topics), len(topics))
	}
	for _, t := range md.Topics {
		if t.Error != nil {
			return t.Error
		}
		if len(t.Partitions) == 0 {
			return fmt.Errorf("%s: no partitions", t.Name)
		}
		for _, p := range t.Partitions {
			if p.Error != nil {
				return fmt.Errorf("%s/%d: %w", t.Name, p.ID, p.Error)
			}
			if len(p.Isr) < len(p.Replicas) || len(p.Replicas) < 3 {
				return fmt.Errorf("%s/%d: %d of %d replicas in sync", t.Name, p.ID, len(p.Isr), len(p.Replicas))
			}
		}
	}
	return nil
}

// kcLeaders maps each partition of topic to its leader's node id.
func kcLeaders(ctx context.Context, cl *kafka.Client, topic string) (map[int]int, error) {
	md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, err
	}
	if len(md.Topics) != 1 || md.Topics[0].Error != nil {
		return nil, fmt.Errorf("metadata of %s: %v", topic, md.Topics)
	}
	out := map[int]int{}
	for _, p := range md.Topics[0].Partitions {
		if p.Error == nil {
			out[p.ID] = p.Leader.ID
		} else {
			out[p.ID] = -1
		}
	}
	return out, nil
}

// kcEndOffsets lists the end offsets (high watermarks) of topic's first n
// partitions; a partition whose leader does not answer is absent.
func kcEndOffsets(ctx context.Context, cl *kafka.Client, topic string, n int) (map[int]int64, error) {
	var reqs []kafka.OffsetRequest
	for p := range n {
		reqs = append(reqs, kafka.LastOffsetOf(p))
	}
	resp, err := cl.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, err
	}
	out := map[int]int64{}
	for _, p := range resp.Topics[topic] {
		if p.Error == nil {
			out[p.Partition] = p.LastOffset
		}
	}
	return out, nil
}

// kcKillOne SIGKILLs the leader of partition part of in, measures until the
// partition is consumed again and the relay publishes again to a partition
// of out that node led, restarts the node and waits until it is back in
// every ISR.
func kcKillOne(ctx context.Context, cl *kafka.Client, mon *offsetMonitor, f kcFlags, in, out string, part int, failed func() error) (kcKill, error) {
	var k kcKill
	k.partition = part
	leaders, err := kcLeaders(ctx, cl, in)
	if err != nil {
		return k, err
	}
	k.node = leaders[part]
	if k.node < 1 || k.node > 3 {
		return k, fmt.Errorf("%s/%d has no leader (%d)", in, part, k.node)
	}
	outLeaders, err := kcLeaders(ctx, cl, out)
	if err != nil {
		return k, err
	}
	var outParts []int
	for p, n := range outLeaders {
		if n == k.node {
			outParts = append(outParts, p)
		}
	}
	inEnds, err := kcEndOffsets(ctx, cl, in, len(leaders))
	if err != nil {
		return k, err
	}
	outEnds, err := kcEndOffsets(ctx, cl, out, len(outLeaders))
	if err != nil {
		return k, err
	}
	inEnd, ok := inEnds[part]
	if !ok {
		return k, fmt.Errorf("no end offset for %s/%d", in, part)
	}
	if err := topology(ctx, "kafka", "kill", strconv.Itoa(k.node)); err != nil {
		return k, err
	}
	killed := time.Now()
	err = waitFor(ctx, f.recovery, failed, fmt.Sprintf("%s/%d consumed and %s relayed again after node %d's kill", in, part, out, k.node), func() bool {
		now := time.Since(killed)
		if k.elected == 0 {
			if l, err := kcLeaders(ctx, cl, in); err == nil && l[part] > 0 && l[part] != k.node {
				k.elected = now
			}
		}
		if k.consumed == 0 && mon.latest()[part] > inEnd {
			k.consumed = now
		}
		if k.relayed == 0 {
			if ends, err := kcEndOffsets(ctx, cl, out, len(outLeaders)); err == nil {
				for _, p := range outParts {
					if e, ok := ends[p]; ok && e > outEnds[p] {
						k.relayed = now
					}
				}
				if len(outParts) == 0 { // the node led none of out: any growth
					var a, b int64
					for p := range ends {
						a, b = a+ends[p], b+outEnds[p]
					}
					if a > b {
						k.relayed = now
					}
				}
			}
		}
		return k.elected > 0 && k.consumed > 0 && k.relayed > 0
	})
	if err != nil {
		return k, err
	}
	if err := topology(ctx, "kafka", "start", strconv.Itoa(k.node)); err != nil {
		return k, err
	}
	restarted := time.Now()
	if err := waitFor(ctx, 3*time.Minute, failed, fmt.Sprintf("node %d back in every ISR", k.node), func() bool {
		return kcAllInSync(ctx, cl, in, out) == nil
	}); err != nil {
		return k, err
	}
	k.isr = time.Since(restarted)
	return k, nil
}

// kcSettle waits until the group's lag is 0, every outbox row is published
// and no effect was added for settle.
func kcSettle(ctx context.Context, pool *pgxpool.Pool, s string, brokers []string, group, in string, settle time.Duration, failed func() error) error {
	last, since := -1, time.Now()
	return waitFor(ctx, 5*time.Minute, failed, "the group caught up and the outbox published", func() bool {
		var n, pending int
		qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := pool.QueryRow(qctx, `select (select count(*) from `+s+`.effects), (select count(*) from `+s+`.outbox where published_at is null)`).Scan(&n, &pending)
		cancel()
		if err != nil {
			return false
		}
		lag, err := groupLag(ctx, brokers, group, in)
		if err != nil {
			return false
		}
		if n != last {
			last, since = n, time.Now()
		}
		return lag == 0 && pending == 0 && time.Since(since) >= settle
	})
}

// waitFor polls cond every 100ms until it holds, failed returns an error,
// or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, failed func() error, what string, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for {
		if err := failed(); err != nil {
			return err
		}
		if cond() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not after %s", what, timeout)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// offsetMonitor reads the group's committed offsets (OffsetFetch) every
// 200ms and records every partition whose committed offset went down.
type offsetMonitor struct {
	cl           *kafka.Client
	group, topic string

	mu        sync.Mutex
	paused    bool
	last      map[int]int64
	backwards []string
}

func newOffsetMonitor(cl *kafka.Client, group, topic string) *offsetMonitor {
	return &offsetMonitor{cl: cl, group: group, topic: topic, last: map[int]int64{}}
}

func (m *offsetMonitor) run(ctx context.Context) {
	for ctx.Err() == nil {
		m.mu.Lock()
		paused := m.paused
		m.mu.Unlock()
		if !paused {
			c := m.read(ctx)
			m.mu.Lock()
			if !m.paused {
				for p, o := range c {
					if prev, ok := m.last[p]; ok && o < prev {
						m.backwards = append(m.backwards, fmt.Sprintf("%s/%d %d -> %d at %s", m.topic, p, prev, o, time.Now().Format("15:04:05.000")))
					}
					if o >= 0 {
						m.last[p] = o
					}
				}
			}
			m.mu.Unlock()
		}
		_ = sleep(ctx, 200*time.Millisecond)
	}
}

// read is one OffsetFetch of every partition (nil when it fails); a
// partition without a commit is absent.
func (m *offsetMonitor) read(ctx context.Context) map[int]int64 {
	md, err := m.cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{m.topic}})
	if err != nil || len(md.Topics) != 1 {
		return nil
	}
	var ids []int
	for _, p := range md.Topics[0].Partitions {
		ids = append(ids, p.ID)
	}
	resp, err := m.cl.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: m.group, Topics: map[string][]int{m.topic: ids}})
	if err != nil || resp.Error != nil {
		return nil
	}
	out := map[int]int64{}
	for _, p := range resp.Topics[m.topic] {
		if p.Error == nil && p.CommittedOffset >= 0 {
			out[p.Partition] = p.CommittedOffset
		}
	}
	return out
}

func (m *offsetMonitor) latest() map[int]int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[int]int64, len(m.last))
	for p, o := range m.last {
		out[p] = o
	}
	return out
}

func (m *offsetMonitor) pause(on bool) {
	m.mu.Lock()
	m.paused = on
	m.mu.Unlock()
}

// forget drops what was seen: after the deliberate reset to earliest.
func (m *offsetMonitor) forget() {
	m.mu.Lock()
	m.last = map[int]int64{}
	m.mu.Unlock()
}

func (m *offsetMonitor) backwardsSeen() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.backwards)
}

// producer writes messages at a steady rate with acks=all: ID "m-<i>" in
// the message-ID header, key "k-<i mod keys>", value "<i>", in order. A
// failed write is retried (its records only) before the next, so each key's
// first copies stay in order.
type producer struct {
	brokers []string
	topic   string
	keys    int
	rate    int
	writing sync.Mutex // held while a tick's messages are written
	w       *kafka.Writer
	mu      sync.Mutex
	next    int
	ids     []string
	held    bool
}

func newProducer(brokers []string, topic string, keys, rate int) *producer {
	p := &producer{brokers: brokers, topic: topic, keys: keys, rate: rate}
	p.w = p.writer()
	return p
}

func (p *producer) writer() *kafka.Writer {
	// A Transport of its own: kafka.DefaultTransport's metadata cache,
	// shared by every Writer, would keep the old partition count.
	return &kafka.Writer{Addr: kafka.TCP(p.brokers...), Topic: p.topic, Balancer: kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: 2 * time.Millisecond, MaxAttempts: 3, WriteTimeout: 5 * time.Second,
		Transport: &kafka.Transport{}}
}

// reopen replaces the Writer and its Transport, so that the next message
// reads the topic's partitions afresh (a Transport caches them); call it
// paused.
func (p *producer) reopen() {
	p.writing.Lock()
	defer p.writing.Unlock()
	_ = p.w.Close()
	p.w = p.writer()
}

// pause holds the producer (on), once the messages being written are
// written, or lets it go on.
func (p *producer) pause(on bool) {
	p.mu.Lock()
	p.held = on
	p.mu.Unlock()
	p.writing.Lock()
	p.writing.Unlock() //nolint:staticcheck // waits for the write in progress
}

func (p *producer) run(ctx context.Context) {
	defer func() {
		p.writing.Lock()
		_ = p.w.Close()
		p.writing.Unlock()
	}()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	owed := 0.0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		p.writing.Lock()
		p.mu.Lock()
		paused := p.held
		p.mu.Unlock()
		if paused {
			p.writing.Unlock()
			continue
		}
		owed += float64(p.rate) / 10
		var msgs []kafka.Message
		for ; owed >= 1; owed-- {
			i := p.next
			p.next++
			msgs = append(msgs, kafka.Message{Key: []byte(fmt.Sprintf("k-%d", i%p.keys)), Value: []byte(strconv.Itoa(i)),
				Headers: []kafka.Header{{Key: wire.MessageIDHeader, Value: []byte(fmt.Sprintf("m-%d", i))}}})
		}
		for len(msgs) > 0 && ctx.Err() == nil {
			err := p.w.WriteMessages(ctx, msgs...)
			var failed []kafka.Message
			var werrs kafka.WriteErrors
			p.mu.Lock()
			for j, m := range msgs {
				switch {
				case err == nil, errors.As(err, &werrs) && j < len(werrs) && werrs[j] == nil:
					p.ids = append(p.ids, string(m.Headers[0].Value))
				default:
					failed = append(failed, m)
				}
			}
			p.mu.Unlock()
			msgs = failed
			if len(failed) > 0 {
				_ = sleep(ctx, 200*time.Millisecond)
			}
		}
		p.writing.Unlock()
	}
}

func (p *producer) acked() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ids)
}

func (p *producer) ackedIDs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.ids)
}

func durations(ks []kcKill, f func(kcKill) time.Duration) string {
	if len(ks) == 0 {
		return "-"
	}
	var ds []time.Duration
	for _, k := range ks {
		ds = append(ds, f(k))
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	r := func(d time.Duration) string { return d.Round(10 * time.Millisecond).String() }
	return fmt.Sprintf("%s / %s / %s", r(ds[0]), r(ds[len(ds)/2]), r(ds[len(ds)-1]))
}

func kcPrint(r kcResult, f kcFlags, total time.Duration) {
	t := table{title: fmt.Sprintf("Kafka cluster drill: three KRaft nodes (broker + controller), topics RF 3, min.insync.replicas 2. A group of two\n"+
		"members (atomic mode, Postgres) consumes while %d messages/s are produced (acks=all); each effect writes an outbox row that\n"+
		"the relay publishes (acks=all). %d partition leaders SIGKILLed and restarted; %d partitions added with kafka-topics;\n"+
		"then the group stopped, its offsets reset to earliest with kafka-consumer-groups, and everything consumed again.",
		f.rate, f.kills, f.add), columns: []string{"value"}}
	row := func(label string, format string, args ...any) { t.row(label, fmt.Sprintf(format, args...)) }
	row("faults: leader kills / partitions added / offset reset", "%d / %d / %v", len(r.kills), r.partitionsAfter-r.partitionsBefore, r.resetDone)
	for i, k := range r.kills {
		row(fmt.Sprintf("kill %d: node, partition; recovery", i+1), "node %d, p%d; %s", k.node, k.partition, k.recovery().Round(10*time.Millisecond))
	}
	row("recovery per kill, min / median / max", "%s", durations(r.kills, kcKill.recovery))
	row("  leader re-elected after", "%s", durations(r.kills, func(k kcKill) time.Duration { return k.elected }))
	row("  partition consumed again after", "%s", durations(r.kills, func(k kcKill) time.Duration { return k.consumed }))
	row("  relay published again after", "%s", durations(r.kills, func(k kcKill) time.Duration { return k.relayed }))
	row("  restarted node back in every ISR after", "%s", durations(r.kills, func(k kcKill) time.Duration { return k.isr }))
	row("messages on the input topic (distinct IDs)", "%d", r.messages)
	row("  acknowledged to the producer / missing", "%d / %d", r.produced, r.ackedMissing)
	row("  extra copies on the input topic (producer retries)", "%d", r.inputCopies)
	if f.add > 0 {
		row("  on the added partitions; all consumed after", "%d; %s", r.addedMessages, r.addedConsumedIn.Round(10*time.Millisecond))
	}
	row("effect rows / distinct messages", "%d / %d", r.effects, r.distinct)
	members := []string{}
	for m := 1; m <= 2; m++ {
		members = append(members, fmt.Sprint(r.perMember[m]))
	}
	row("  effects by member 1 / 2", "%s", strings.Join(members, " / "))
	row("SUCCEEDED records / dead letters", "%d / %d", r.succeeded, r.deadLetters)
	row("duplicates absorbed (in-process counter)", "%d", r.dupAbsorbed)
	if f.reset {
		row("replay after reset: records consumed / new effects / new outbox rows", "%d / %d / %d", r.redelivered, r.newEffectsOnReset, r.newOutboxOnReset)
	}
	row("committed offsets gone backwards", "%d", len(r.backwards))
	row("group lag at the end", "%d", r.lagAfter)
	row("relay: outbox rows / unpublished", "%d / %d", r.relay.outboxRows, r.relay.unpublished)
	row("relay: distinct on topic / extra copies", "%d / %d", r.relay.published, r.relay.copies)
	row("relay: missing / without outbox row", "%d / %d", r.relay.missing, r.relay.phantoms)
	row("relay: per-key order faults (relayed topic)", "%d", r.relay.orderFaults)
	row("  keys out of order: effects vs input / topic vs outbox", "%d / %d", r.consumedOrder, r.relayOrder)
	row("duplicate effects", "%d", r.duplicateEffects())
	row("lost (messages without effect)", "%d", r.lost)
	verdict := "held"
	if len(r.broken(f)) > 0 {
		verdict = "BROKEN"
	}
	row("exactly-once", "%s", verdict)
	t.print()
	fmt.Printf("\nfault phase %s, total %s\n", r.faultPhase.Round(time.Second), total.Round(time.Second))
}
