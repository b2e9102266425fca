package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/kafkapub"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
)

// pgfoSchema holds the drill's tables on the topology's cluster (which
// exists only for the drill: pg.sh up starts it empty).
const pgfoSchema = "drill"

// pgfoModes are the consumers the drill runs side by side, one consumer
// group and scope each, on one input topic.
var pgfoModes = []string{"atomic", "batched", "lease"}

type pgfoFlags struct {
	replications string
	messages     int
	keys         int
	at           float64
	lag          time.Duration
	settle       time.Duration
}

// pgfoMode is what one consumer (or the relay) measured, from durable state.
type pgfoMode struct {
	name        string
	effects     int   // effect rows (atomic, batched: business rows; lease: provider rows)
	distinct    int   // messages with an effect
	calls       int   // lease: downstream calls (same idempotency key repeated on a takeover)
	succeeded   int   // SUCCEEDED consumption records
	deadLetters int   // dead letters of the scope
	lag         int64 // the group's lag after the run
	counters    map[string]int64
}

// pgfoRun is one replication setting's run.
type pgfoRun struct {
	replication   string
	messages      int
	appliedAtKill int
	lostAtKill    int // effects of atomic mode on the primary the standby had not received (read before the kill)
	recovery      time.Duration
	serverChanges int64
	modes         []pgfoMode
	unknown       map[string]int // "outcome not recorded; will be redelivered" log lines per scope
	relay         relayCheck     // the outbox on the new primary against the relayed topic
}

func (r pgfoRun) mode(name string) pgfoMode {
	for _, m := range r.modes {
		if m.name == name {
			return m
		}
	}
	return pgfoMode{}
}

// duplicateEffects and lost over every consumer, and the relay's missing.
func (r pgfoRun) duplicateEffects() int {
	n := 0
	for _, m := range r.modes {
		n += m.effects - m.distinct
	}
	return n
}

func (r pgfoRun) lost() int {
	n := 0
	for _, m := range r.modes {
		n += r.messages - m.distinct
	}
	return n + r.relay.missing
}

func runPGFailover(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("pg-failover", flag.ContinueOnError)
	var f pgfoFlags
	fs.StringVar(&f.replications, "replication", "sync,async", "standby settings to run, in order: sync (synchronous_standby_names, synchronous_commit = on), async")
	fs.IntVar(&f.messages, "messages", 3000, "messages on the input topic (4 partitions), each consumed by the atomic, batched and lease consumers")
	fs.IntVar(&f.keys, "keys", 40, "message keys (per-key order is checked on the relayed topic)")
	fs.Float64Var(&f.at, "at", 0.3, "fraction of the messages applied by every consumer when the primary is killed")
	fs.DurationVar(&f.lag, "lag", time.Second, "how long the standby's walreceiver is stopped before the primary is killed: the replication delay of the failover")
	fs.DurationVar(&f.settle, "settle", 20*time.Second, "no progress for this long, with every group's lag 0 and the outbox published, ends a run")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if f.messages < 10 || f.at <= 0 || f.at >= 1 || f.keys < 1 {
		return errors.New("-messages must be at least 10, -at between 0 and 1, -keys at least 1")
	}
	var runs []pgfoRun
	start := time.Now()
	for _, repl := range strings.Split(f.replications, ",") {
		repl = strings.TrimSpace(repl)
		if repl != "sync" && repl != "async" {
			return fmt.Errorf("-replication %q: want sync or async", repl)
		}
		fmt.Fprintf(os.Stderr, "== pg-failover, %s standby\n", repl)
		r, err := pgfoOnce(ctx, repl, f)
		_ = topology(context.WithoutCancel(ctx), "pg", "down")
		if err != nil {
			return fmt.Errorf("%s: %w", repl, err)
		}
		runs = append(runs, r)
	}
	pgfoPrint(runs, f, time.Since(start))
	for _, r := range runs {
		if r.replication == "sync" && (r.duplicateEffects() != 0 || r.lost() != 0 || r.relay.orderFaults != 0 || r.relay.phantoms != 0) {
			return fmt.Errorf("sync standby: exactly-once broken: %d duplicate effects, %d lost, %d order faults, %d phantoms",
				r.duplicateEffects(), r.lost(), r.relay.orderFaults, r.relay.phantoms)
		}
		for _, m := range r.modes {
			if m.deadLetters != 0 {
				return fmt.Errorf("%s standby, %s: %d dead letters (a failover is not a message's failure)", r.replication, m.name, m.deadLetters)
			}
		}
	}
	return nil
}

// pgfoOnce runs the drill on a fresh primary/standby pair.
func pgfoOnce(ctx context.Context, repl string, f pgfoFlags) (pgfoRun, error) {
	res := pgfoRun{replication: repl, messages: f.messages}
	if err := topology(ctx, "pg", "up", repl); err != nil {
		return res, err
	}
	p1, p2 := env("TOPOLOGY_PG_PRIMARY_PORT", "5441"), env("TOPOLOGY_PG_STANDBY_PORT", "5442")
	dsn := fmt.Sprintf("postgres://idemq:idemq@127.0.0.1:%s,127.0.0.1:%s/idemq?sslmode=disable&target_session_attrs=read-write&connect_timeout=3", p1, p2)
	primaryDSN := fmt.Sprintf("postgres://idemq:idemq@127.0.0.1:%s/idemq?sslmode=disable&connect_timeout=3", p1)
	standbyDSN := fmt.Sprintf("postgres://idemq:idemq@127.0.0.1:%s/idemq?sslmode=disable&connect_timeout=3", p2)

	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return res, err
	}
	cfg.MaxConns = 16
	unknown := &logCounter{match: "outcome not recorded", counts: map[string]int{}}
	logger := slog.New(&countingHandler{Handler: slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}), c: unknown})
	watch, err := pgstore.WatchFailover(cfg, pgstore.FailoverOptions{Logger: logger})
	if err != nil {
		return res, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return res, err
	}
	defer pool.Close()

	sfx := suffix()
	in, out := "drill-pgfo-"+sfx, "drill-pgfo-out-"+sfx
	setup, err := setupStoreOutbox(ctx, pool, "pg-failover", pgfoSchema, 5, logger)
	if err != nil {
		return res, err
	}
	store, ob := setup.store, setup.ob
	s := pgx.Identifier{pgfoSchema}.Sanitize()
	if _, err := pool.Exec(ctx, `
create table `+s+`.effects (n bigint generated always as identity primary key, mode text not null, message_id text not null);
create table `+s+`.provider (key text primary key, message_id text not null, calls int not null default 1);
create table `+s+`.probe (n bigint generated always as identity primary key, at timestamptz not null default now())`); err != nil {
		return res, err
	}
	brokers := kafkaBrokers()
	if err := kafkaadapter.EnsureTopics(ctx, brokers, 4, in, out); err != nil {
		return res, err
	}
	if err := produce(ctx, brokers, in, "m", f.messages, f.keys); err != nil {
		return res, err
	}
	logf("%d messages on %s; consumers %s and the relay to %s start", f.messages, in, strings.Join(pgfoModes, ", "), out)

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, len(pgfoModes)+1)
	counters := map[string]*consumer.Counters{}
	for _, mode := range pgfoModes {
		c := &consumer.Counters{}
		counters[mode] = c
		cons, err := pgfoConsumer(pool, store, ob, mode, out, c, logger)
		if err != nil {
			return res, err
		}
		src, err := kafkaadapter.NewSource(kafkaadapter.Config{Logger: logger, Reader: kafka.ReaderConfig{
			Brokers: brokers, GroupID: "pgfo-" + mode + "-" + sfx, Topic: in, MaxWait: 200 * time.Millisecond}})
		if err != nil {
			return res, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := cons.Run(runCtx, src); err != nil && !errors.Is(err, context.Canceled) {
				errs <- fmt.Errorf("consumer %s: %w", mode, err)
			}
		}()
	}
	pub, err := kafkapub.New(kafkapub.Config{Brokers: brokers})
	if err != nil {
		return res, err
	}
	defer func() { _ = pub.Close() }()
	relay, err := outbox.NewRelay(ob, pub, outbox.RelayConfig{Name: "drill-relay", PollInterval: 200 * time.Millisecond,
		RetryInitial: 100 * time.Millisecond, RetryMax: time.Second, Logger: logger})
	if err != nil {
		return res, err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := relay.Run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
			errs <- fmt.Errorf("relay: %w", err)
		}
	}()
	stopAll := func() { cancel(); wg.Wait() }

	// The fault, once every consumer has applied -at of the messages.
	want := int(float64(f.messages) * f.at)
	for {
		if err := checkErrs(errs); err != nil {
			stopAll()
			return res, err
		}
		least := f.messages
		for _, mode := range pgfoModes {
			least = min(least, countEffects(ctx, pool, s, mode))
		}
		if least >= want {
			res.appliedAtKill = least
			break
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			stopAll()
			return res, err
		}
	}
	if err := topology(ctx, "pg", "pause-replication"); err != nil {
		stopAll()
		return res, err
	}
	if err := sleep(ctx, f.lag); err != nil {
		stopAll()
		return res, err
	}
	// What the primary has that the standby lacks, just before the kill:
	// commits that exist only on the primary (async) or wait for the
	// standby's ack, unacknowledged (sync).
	onPrimary, _ := countOn(ctx, primaryDSN, `select count(*) from `+s+`.effects where mode = 'atomic'`)
	onStandby, _ := countOn(ctx, standbyDSN, `select count(*) from `+s+`.effects where mode = 'atomic'`)
	res.lostAtKill = onPrimary - onStandby
	if err := topology(ctx, "pg", "kill-primary"); err != nil {
		stopAll()
		return res, err
	}
	killed := time.Now()
	if err := topology(ctx, "pg", "promote"); err != nil {
		stopAll()
		return res, err
	}
	// Recovery: the first write committed through the pool (the same
	// multi-host DSN the consumers use) after the kill. Work may be left or
	// not (an asynchronous standby lets the consumers finish on the old
	// primary), so the probe is a write of its own.
	for {
		pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
		_, perr := pool.Exec(pctx, `insert into `+s+`.probe default values`)
		pcancel()
		if perr == nil {
			break
		}
		if time.Since(killed) > 3*time.Minute {
			stopAll()
			return res, fmt.Errorf("no write committed 3 minutes after the failover: %w", perr)
		}
		if err := checkErrs(errs); err != nil {
			stopAll()
			return res, err
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			stopAll()
			return res, err
		}
	}
	res.recovery = time.Since(killed)
	logf("failover: primary killed with %d of %d applied (each consumer), %d atomic effects only on the primary; first write through the pool %s after the kill",
		res.appliedAtKill, f.messages, res.lostAtKill, res.recovery.Round(time.Millisecond))

	// Until every group is caught up, the outbox published, and nothing
	// moves for -settle.
	last, since := -1, time.Now()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		if err := checkErrs(errs); err != nil {
			stopAll()
			return res, err
		}
		n := countEffects(ctx, pool, s, "")
		pending, _ := countOn(ctx, dsn, `select count(*) from `+s+`.outbox where published_at is null`)
		var lag int64
		for _, mode := range pgfoModes {
			l, err := groupLag(ctx, brokers, "pgfo-"+mode+"-"+sfx, in)
			if err != nil {
				l = 1
			}
			lag += l
		}
		if n != last {
			last, since = n, time.Now()
		}
		if lag == 0 && pending == 0 && time.Since(since) >= f.settle {
			break
		}
		if time.Now().After(deadline) {
			stopAll()
			return res, fmt.Errorf("not settled 5 minutes after the failover: lag %d, %d outbox rows unpublished, %d effects", lag, pending, n)
		}
		if err := sleep(ctx, 250*time.Millisecond); err != nil {
			stopAll()
			return res, err
		}
	}
	stopAll()
	res.serverChanges = watch.Changes()
	res.unknown = unknown.snapshot()

	// Durable state, read from the new primary.
	q := func(sql string, args ...any) int {
		var n int64
		if err == nil {
			err = pool.QueryRow(ctx, sql, args...).Scan(&n)
		}
		return int(n)
	}
	for _, mode := range pgfoModes {
		scope := "pgfo-" + mode
		m := pgfoMode{name: mode, counters: counters[mode].Snapshot()}
		if mode == "lease" {
			m.effects = q(`select count(*) from ` + s + `.provider`)
			m.distinct = q(`select count(distinct message_id) from ` + s + `.provider`)
			m.calls = q(`select coalesce(sum(calls), 0) from ` + s + `.provider`)
		} else {
			m.effects = q(`select count(*) from `+s+`.effects where mode = $1`, mode)
			m.distinct = q(`select count(distinct message_id) from `+s+`.effects where mode = $1`, mode)
		}
		m.succeeded = q(`select count(*) from `+s+`.consumption_records where scope = $1 and status = 'SUCCEEDED'`, scope)
		m.deadLetters = q(`select count(*) from `+s+`.dead_letters where scope = $1`, scope)
		m.lag, _ = groupLag(ctx, brokers, "pgfo-"+mode+"-"+sfx, in)
		res.modes = append(res.modes, m)
	}
	if err != nil {
		return res, err
	}
	res.relay, err = checkRelay(ctx, pool, s+`.outbox`, brokers, out)
	return res, err
}

// pgfoConsumer builds one mode's consumer. Atomic mode also writes an
// outbox row per message (the relay's input); lease mode calls a
// "provider" outside the record's transaction that keys its effect by the
// lease's idempotency key and counts calls.
func pgfoConsumer(pool *pgxpool.Pool, store *pgstore.Store, ob *outbox.Outbox, mode, out string, m consumer.Metrics, logger *slog.Logger) (*consumer.Consumer, error) {
	s := pgx.Identifier{pgfoSchema}.Sanitize()
	cfg := consumer.Config{Scope: "pgfo-" + mode, Store: store, Metrics: m, Logger: logger,
		RetryInitial: 50 * time.Millisecond, RetryMax: time.Second}
	switch mode {
	case "atomic":
		cfg.Handler = func(ctx context.Context, tx pgx.Tx, msg *dedup.Message) error {
			if _, err := tx.Exec(ctx, `insert into `+s+`.effects (mode, message_id) values ('atomic', $1)`, msg.Identity.MessageID); err != nil {
				return err
			}
			_, err := ob.Add(ctx, tx, outbox.Message{Topic: out, Key: msg.Key, Payload: msg.Payload, CausationID: outbox.Causation(msg)})
			return err
		}
	case "batched":
		cfg.BatchSize = 20
		cfg.Handler = func(ctx context.Context, tx pgx.Tx, msg *dedup.Message) error {
			_, err := tx.Exec(ctx, `insert into `+s+`.effects (mode, message_id) values ('batched', $1)`, msg.Identity.MessageID)
			return err
		}
	case "lease":
		cfg.Lease = dedup.LeaseOptions{TTL: 5 * time.Second}
		cfg.LeaseHandler = func(ctx context.Context, msg *dedup.Message) error {
			l, ok := dedup.LeaseFromContext(ctx)
			if !ok {
				return dedup.Permanent(errors.New("lease handler without a lease"))
			}
			_, err := pool.Exec(ctx, `insert into `+s+`.provider (key, message_id) values ($1, $2)
on conflict (key) do update set calls = provider.calls + 1`, l.IdempotencyKey(), msg.Identity.MessageID)
			return err
		}
	}
	return consumer.New(cfg)
}

func checkErrs(errs chan error) error {
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// countEffects counts effect rows of mode ("" for all), through the pool;
// -1 when the database does not answer.
func countEffects(ctx context.Context, pool *pgxpool.Pool, s, mode string) int {
	qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var n int
	var err error
	switch mode {
	case "":
		err = pool.QueryRow(qctx, `select (select count(*) from `+s+`.effects) + (select count(*) from `+s+`.provider)`).Scan(&n)
	case "lease":
		err = pool.QueryRow(qctx, `select count(*) from `+s+`.provider`).Scan(&n)
	default:
		err = pool.QueryRow(qctx, `select count(*) from `+s+`.effects where mode = $1`, mode).Scan(&n)
	}
	if err != nil {
		return -1
	}
	return n
}

// countOn runs a count on one server through a connection of its own.
func countOn(ctx context.Context, dsn, sql string) (int, error) {
	qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(qctx, dsn)
	if err != nil {
		return -1, err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	var n int
	err = conn.QueryRow(qctx, sql).Scan(&n)
	return n, err
}

func pgfoPrint(runs []pgfoRun, f pgfoFlags, total time.Duration) {
	t := table{title: fmt.Sprintf("Postgres failover drill: %d messages on 4 partitions, consumed by an atomic, a batched (20) and a lease consumer\n"+
		"(one group each) through a multi-host DSN (target_session_attrs=read-write); the atomic handler writes an outbox row\n"+
		"that the relay publishes. With %d%% applied, the standby's WAL receiver stopped for %s, the primary SIGKILLed, the standby promoted.",
		f.messages, int(f.at*100), f.lag)}
	for _, r := range runs {
		t.columns = append(t.columns, r.replication+" standby")
	}
	cells := func(fn func(r pgfoRun) string) []string {
		var out []string
		for _, r := range runs {
			out = append(out, fn(r))
		}
		return out
	}
	t.row("messages (per consumer)", cells(func(r pgfoRun) string { return fmt.Sprint(r.messages) })...)
	t.row("applied per consumer at the kill", cells(func(r pgfoRun) string { return fmt.Sprint(r.appliedAtKill) })...)
	t.row("atomic effects only on the old primary", cells(func(r pgfoRun) string { return fmt.Sprint(r.lostAtKill) })...)
	t.row("first write through the pool after the kill", cells(func(r pgfoRun) string { return r.recovery.Round(10 * time.Millisecond).String() })...)
	t.row("server changes seen (WatchFailover)", cells(func(r pgfoRun) string { return fmt.Sprint(r.serverChanges) })...)
	for _, mode := range pgfoModes {
		t.row(mode+": effects / distinct messages", cells(func(r pgfoRun) string {
			m := r.mode(mode)
			return fmt.Sprintf("%d / %d", m.effects, m.distinct)
		})...)
		t.row(mode+": duplicates absorbed", cells(func(r pgfoRun) string { return fmt.Sprint(r.mode(mode).counters["duplicate"]) })...)
		t.row(mode+": outcome unknown, redelivered", cells(func(r pgfoRun) string { return fmt.Sprint(r.unknown["pgfo-"+mode]) })...)
		t.row(mode+": failed attempts (retry outcomes)", cells(func(r pgfoRun) string { return fmt.Sprint(r.mode(mode).counters["retry"]) })...)
		t.row(mode+": SUCCEEDED records / dead letters", cells(func(r pgfoRun) string {
			m := r.mode(mode)
			return fmt.Sprintf("%d / %d", m.succeeded, m.deadLetters)
		})...)
		if mode == "lease" {
			t.row("lease: downstream calls (same key repeated)", cells(func(r pgfoRun) string {
				m := r.mode(mode)
				return fmt.Sprintf("%d (%d)", m.calls, m.calls-m.effects)
			})...)
		}
		t.row(mode+": group lag after the run", cells(func(r pgfoRun) string { return fmt.Sprint(r.mode(mode).lag) })...)
	}
	t.row("relay: outbox rows / unpublished", cells(func(r pgfoRun) string { return fmt.Sprintf("%d / %d", r.relay.outboxRows, r.relay.unpublished) })...)
	t.row("relay: distinct on topic / extra copies", cells(func(r pgfoRun) string { return fmt.Sprintf("%d / %d", r.relay.published, r.relay.copies) })...)
	t.row("relay: published, row lost with its commit", cells(func(r pgfoRun) string { return fmt.Sprint(r.relay.phantoms) })...)
	t.row("relay: per-key order faults", cells(func(r pgfoRun) string { return fmt.Sprint(r.relay.orderFaults) })...)
	t.row("duplicate effects (all consumers)", cells(func(r pgfoRun) string { return fmt.Sprint(r.duplicateEffects()) })...)
	t.row("lost (messages without effect, rows unpublished)", cells(func(r pgfoRun) string { return fmt.Sprint(r.lost()) })...)
	t.row("exactly-once", cells(func(r pgfoRun) string {
		if r.duplicateEffects() == 0 && r.lost() == 0 && r.relay.orderFaults == 0 && r.relay.phantoms == 0 {
			return "held"
		}
		if r.replication == "async" {
			return "window"
		}
		return "BROKEN"
	})...)
	t.print()
	fmt.Printf("\ntotal %s\n", total.Round(time.Second))
}

// logCounter counts log records whose message contains match, per
// "scope" attribute (the consumer adds its scope with Logger.With).
type logCounter struct {
	match  string
	mu     sync.Mutex
	counts map[string]int
}

func (c *logCounter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, v := range c.counts {
		out[k] = v
	}
	return out
}

// countingHandler passes every record on to Handler and counts it in c.
type countingHandler struct {
	slog.Handler
	c     *logCounter
	scope string // from WithAttrs
}

func (h *countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.c.match) {
		scope := h.scope
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "scope" {
				scope = a.Value.String()
			}
			return true
		})
		h.c.mu.Lock()
		h.c.counts[scope]++
		h.c.mu.Unlock()
	}
	return h.Handler.Handle(ctx, r)
}

func (h *countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	child := &countingHandler{Handler: h.Handler.WithAttrs(as), c: h.c, scope: h.scope}
	for _, a := range as {
		if a.Key == "scope" {
			child.scope = a.Value.String()
		}
	}
	return child
}
