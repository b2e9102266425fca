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
	"sync/atomic"
	"time"

	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/dedup/redisfast"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/submittoken"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
)

// The redis-failover drill: scripts/topology/redis.sh starts a master, a
// replica and three Sentinels; each phase gets a fresh set, stops the
// replica (its socket buffers filled, so the master's further writes wait in
// the master's memory), SIGKILLs the master while work flows, and lets the
// sentinels promote the replica. The phases:
//
//   - fastpath: pgstore on the services' Postgres with the Redis fast path
//     (redisfast) through a Sentinel client; atomic and batched consumers.
//     The fast path is a hint: no duplicate effect, no skipped message (a
//     promise: exit 1 otherwise).
//   - store: the Redis-only store (redisstore), lease handler writing one
//     row per call to Postgres; after the failover the whole topic is
//     consumed again by a new group of the same scope. Applied messages
//     without a SUCCEEDED record on the new master run again: the window of
//     asynchronous replication, measured, not a failure.
//   - tokens: submit tokens issued and consumed across the kill, then
//     consumed again: tokens consumed twice or issued and lost (a window).

// rfoPhases are the drill's phases, in order.
var rfoPhases = []string{"fastpath", "store", "tokens"}

type rfoFlags struct {
	phases     string
	messages   int
	keys       int
	tokens     int
	at         float64
	lag        time.Duration
	settle     time.Duration
	restartOld bool
}

// rfoRun is what one phase measured, from durable state unless noted.
type rfoRun struct {
	phase       string
	messages    int // messages (distinct IDs) or tokens
	atKill      int // applied (each consumer) or tokens issued when the master was killed
	recovery    time.Duration
	failoverFor time.Duration // kill until the sentinels name a new master that answers as master
	pausedFor   time.Duration // from the replica's stop (at most) to the kill

	// fastpath and store: from the topic and Postgres
	copies              int // messages on the topic
	distinctIDs         int // distinct message IDs on the topic
	modes               []rfoMode
	fpEntries           int // fast-path keys on the new master
	fpAtFailover        int // fast-path keys on the new master once it answered
	succeededAtFailover int // SUCCEEDED records (both scopes) then
	fpHits              int64
	fpMisses            int64
	fpErrors            int64
	breakerOpen         int64

	// store
	applied        int // messages with a handler call, first pass
	calls1         int // handler calls, first pass
	succeededRedis int // SUCCEEDED records on the new master after the first pass
	recordsLost    int // applied messages without a SUCCEEDED record on the new master
	calls2         int // handler calls when everything was consumed again
	rerunIDs       int // distinct messages of those calls
	deadLetters    int64

	// tokens
	issued, issueErrs  int
	consumedFirst      int // first Consume nil
	unknownFirst       int // first Consume ErrTokenUnknown: issued, then lost
	errFirst           int // first Consume failed (outcome unknown)
	consumedTwice      int // a token whose first Consume succeeded, consumed again
	forgotten          int // a consumed token unknown afterwards
	usedAfter          int // ErrTokenUsed on the second Consume (as it should)
	unknownOutcomeRan  int // failed first Consume: the token was found used afterwards
	unknownOutcomeFree int // failed first Consume: the second Consume took it
}

type rfoMode struct {
	name      string
	effects   int
	distinct  int
	succeeded int
	lag       int64
	counters  map[string]int64
}

func (r rfoRun) duplicateEffects() int {
	n := 0
	for _, m := range r.modes {
		n += m.effects - m.distinct
	}
	return n
}

func (r rfoRun) skipped() int {
	n := 0
	for _, m := range r.modes {
		n += r.distinctIDs - m.distinct
	}
	return n
}

func runRedisFailover(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("redis-failover", flag.ContinueOnError)
	var f rfoFlags
	fs.StringVar(&f.phases, "phases", strings.Join(rfoPhases, ","), "phases to run, in order: fastpath (pgstore + redisfast), store (redisstore), tokens (submittoken)")
	fs.IntVar(&f.messages, "messages", 2000, "messages per phase (fastpath: every 5th produced twice, then all again after the failover)")
	fs.IntVar(&f.keys, "keys", 40, "message keys")
	fs.IntVar(&f.tokens, "tokens", 3000, "submit tokens issued (and consumed) in the tokens phase")
	fs.Float64Var(&f.at, "at", 0.3, "fraction of the work done when the master is killed")
	fs.DurationVar(&f.lag, "lag", 300*time.Millisecond, "how long the replica is stopped (socket buffers full) before the master is killed; under 1s (down-after-milliseconds); 0: not stopped, the window is loopback replication's own")
	fs.DurationVar(&f.settle, "settle", 10*time.Second, "no progress for this long, with every group's lag 0, ends a consumer phase")
	fs.BoolVar(&f.restartOld, "restart-old", false, "restart the killed master (empty) after the failover and wait until the sentinels make it a replica (about 10s more per phase)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if f.messages < 10 || f.tokens < 10 || f.at <= 0 || f.at >= 1 || f.keys < 1 || f.lag < 0 || f.lag >= time.Second {
		return errors.New("-messages and -tokens must be at least 10, -at between 0 and 1, -keys at least 1, -lag 0 to under 1s")
	}
	var runs []rfoRun
	start := time.Now()
	for _, ph := range strings.Split(f.phases, ",") {
		ph = strings.TrimSpace(ph)
		fmt.Fprintf(os.Stderr, "== redis-failover, %s\n", ph)
		var r rfoRun
		var err error
		switch ph {
		case "fastpath":
			r, err = rfoFastPath(ctx, f)
		case "store":
			r, err = rfoStore(ctx, f)
		case "tokens":
			r, err = rfoTokens(ctx, f)
		default:
			err = fmt.Errorf("-phases: unknown phase %q", ph)
		}
		_ = topology(context.WithoutCancel(ctx), "redis", "down")
		if err != nil {
			return fmt.Errorf("%s: %w", ph, err)
		}
		runs = append(runs, r)
	}
	rfoPrint(runs, f, time.Since(start))
	for _, r := range runs {
		if r.phase != "fastpath" {
			continue
		}
		if r.duplicateEffects() != 0 || r.skipped() != 0 {
			return fmt.Errorf("fast path: exactly-once broken: %d duplicate effects, %d messages skipped", r.duplicateEffects(), r.skipped())
		}
		for _, m := range r.modes {
			if m.lag != 0 {
				return fmt.Errorf("fast path, %s: group lag %d after the run", m.name, m.lag)
			}
		}
	}
	return nil
}

// sentinelClient is a go-redis client of the topology's master through its
// sentinels; failFast sets it as redisfast.FailFast would a plain client's.
func sentinelClient(failFast bool) *redis.Client {
	o := &redis.FailoverOptions{
		MasterName:    env("TOPOLOGY_REDIS_MASTER_NAME", "idemq"),
		SentinelAddrs: strings.Split(env("TOPOLOGY_REDIS_SENTINELS", "127.0.0.1:26391,127.0.0.1:26392,127.0.0.1:26393"), ","),
	}
	if failFast {
		o.DialerRetries, o.MaxRetries, o.ContextTimeoutEnabled = 1, -1, true
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout = redisfast.MaxTimeout, redisfast.MaxTimeout, redisfast.MaxTimeout, redisfast.MaxTimeout
	}
	return redis.NewFailoverClient(o)
}

// rfoFault stops the replica for lag (not at all for 0), kills the master and waits for the
// failover. recovery is the time from the kill to the first SET that a
// fresh Sentinel client gets an OK for; failoverFor until the sentinels name
// a new master (scripts/topology/redis.sh wait-failover).
func rfoFault(ctx context.Context, f rfoFlags, r *rfoRun) error {
	paused := time.Now()
	if f.lag > 0 {
		if err := topology(ctx, "redis", "pause-replication"); err != nil {
			return err
		}
		if err := sleep(ctx, f.lag); err != nil {
			return err
		}
	}
	probe := sentinelClient(false)
	defer func() { _ = probe.Close() }()
	if err := topology(ctx, "redis", "kill-master"); err != nil {
		return err
	}
	killed := time.Now()
	if f.lag > 0 {
		r.pausedFor = killed.Sub(paused)
	}
	recovered := make(chan time.Duration, 1)
	go func() {
		for ctx.Err() == nil && time.Since(killed) < 2*time.Minute {
			pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			err := probe.Set(pctx, "drill:probe", killed.UnixNano(), time.Minute).Err()
			cancel()
			if err == nil {
				recovered <- time.Since(killed)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		recovered <- -1
	}()
	if err := topology(ctx, "redis", "wait-failover"); err != nil {
		return err
	}
	r.failoverFor = time.Since(killed)
	r.recovery = <-recovered
	if r.recovery < 0 {
		return errors.New("no write through the sentinel client 2 minutes after the kill")
	}
	logf("master killed; sentinels named the new master %s after the kill, first write through the sentinel client %s after it",
		r.failoverFor.Round(time.Millisecond), r.recovery.Round(time.Millisecond))
	if f.restartOld {
		return topology(ctx, "redis", "restart-old")
	}
	return nil
}

// rfoEnv is what the consumer phases share: the services' Postgres (a
// schema of the run's own, dropped at the end), Kafka, a fingerprinter.
type rfoEnv struct {
	sfx, schema string
	pool        *pgxpool.Pool
	fp          *dedup.Fingerprinter
	brokers     []string
	logger      *slog.Logger
}

func rfoSetup(ctx context.Context) (*rfoEnv, error) {
	e := &rfoEnv{sfx: suffix(), brokers: kafkaBrokers(),
		logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))}
	e.schema = "drill_rfo_" + e.sfx
	cfg, err := pgxpool.ParseConfig(env("TEST_POSTGRES_DSN", "postgres://idemq:idemq@127.0.0.1:5432/idemq?sslmode=disable"))
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 8
	if e.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, err
	}
	if err := e.pool.Ping(ctx); err != nil {
		e.pool.Close()
		return nil, fmt.Errorf("the services' Postgres (TEST_POSTGRES_DSN; eval \"$(bash scripts/services.sh env)\"): %w", err)
	}
	if e.fp, err = dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "drill", Secret: []byte("redis-failover-drill-secret-0123456789")}); err != nil {
		e.pool.Close()
		return nil, err
	}
	s := pgx.Identifier{e.schema}.Sanitize()
	if _, err := e.pool.Exec(ctx, `create schema `+s+`;
create table `+s+`.effects (n bigint generated always as identity primary key, mode text not null, message_id text not null, pass int not null default 1)`); err != nil {
		e.pool.Close()
		return nil, err
	}
	return e, nil
}

func (e *rfoEnv) close() {
	_, _ = e.pool.Exec(context.Background(), `drop schema if exists `+pgx.Identifier{e.schema}.Sanitize()+` cascade`)
	e.pool.Close()
}

func (e *rfoEnv) q(ctx context.Context, sql string, args ...any) (int, error) {
	var n int64
	err := e.pool.QueryRow(ctx, sql, args...).Scan(&n)
	return int(n), err
}

// effects counts effect rows of mode ("" all) and pass (0 any); -1 when
// Postgres does not answer.
func (e *rfoEnv) effects(ctx context.Context, mode string, pass int) int {
	qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	n, err := e.q(qctx, `select count(*) from `+pgx.Identifier{e.schema}.Sanitize()+`.effects where ($1 = '' or mode = $1) and ($2 = 0 or pass = $2)`, mode, pass)
	if err != nil {
		return -1
	}
	return n
}

// runner is a set of consumers running on their sources until stop; their
// errors go to errs.
type runner struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	errs   chan error
}

func startConsumers(ctx context.Context, cons map[string]*consumer.Consumer, srcs map[string]consumer.Source) *runner {
	rctx, cancel := context.WithCancel(ctx)
	r := &runner{cancel: cancel, errs: make(chan error, len(cons))}
	for name, c := range cons {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			if err := c.Run(rctx, srcs[name]); err != nil && !errors.Is(err, context.Canceled) {
				r.errs <- fmt.Errorf("consumer %s: %w", name, err)
			}
		}()
	}
	return r
}

func (r *runner) stop() { r.cancel(); r.wg.Wait() }

// waitFor polls cond every 50ms until it holds, a consumer fails or limit
// passes.
func (r *runner) waitFor(ctx context.Context, what string, limit time.Duration, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for !cond() {
		if err := checkErrs(r.errs); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %s", what, limit)
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// settle waits until every group's lag on topic is 0 and the effect count
// has not moved for f.settle.
func (e *rfoEnv) settle(ctx context.Context, r *runner, f rfoFlags, topic string, groups []string) error {
	last, since := -1, time.Now()
	return r.waitFor(ctx, "every group caught up and settled", 5*time.Minute, func() bool {
		n := e.effects(ctx, "", 0)
		if n != last {
			last, since = n, time.Now()
		}
		for _, g := range groups {
			if l, err := groupLag(ctx, e.brokers, g, topic); err != nil || l != 0 {
				return false
			}
		}
		return time.Since(since) >= f.settle
	})
}

func (e *rfoEnv) source(group, topic string) (consumer.Source, error) {
	return kafkaadapter.NewSource(kafkaadapter.Config{Logger: e.logger, Reader: kafka.ReaderConfig{
		Brokers: e.brokers, GroupID: group, Topic: topic, MaxWait: 200 * time.Millisecond}})
}

// countKeys counts the keys matching pattern on the master (SCAN).
func countKeys(ctx context.Context, c *redis.Client, pattern string) (int, error) {
	n := 0
	iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		n++
	}
	return n, iter.Err()
}

// rfoFastPath: pgstore with the Redis fast path, atomic and batched
// consumers; N messages with every 5th twice, the master killed at -at, then
// all N again once Redis answers.
func rfoFastPath(ctx context.Context, f rfoFlags) (rfoRun, error) {
	res := rfoRun{phase: "fastpath", messages: f.messages}
	if err := topology(ctx, "redis", "up"); err != nil {
		return res, err
	}
	e, err := rfoSetup(ctx)
	if err != nil {
		return res, err
	}
	defer e.close()
	fastClient := sentinelClient(true)
	defer func() { _ = fastClient.Close() }()
	prefix := "drill-rfo-" + e.sfx
	fast, err := redisfast.New(redisfast.Config{Client: fastClient, Prefix: prefix, TTL: time.Hour,
		BreakerCooldown: time.Second, Logger: e.logger})
	if err != nil {
		return res, err
	}
	store, err := pgstore.New(e.pool, pgstore.Config{Schema: e.schema, Fingerprinter: e.fp, FastPath: fast, MaxAttempts: 5, Logger: e.logger})
	if err != nil {
		return res, err
	}
	if err := store.Migrate(ctx); err != nil {
		return res, err
	}
	topic := "drill-rfo-fast-" + e.sfx
	if err := kafkaadapter.EnsureTopics(ctx, e.brokers, 4, topic); err != nil {
		return res, err
	}
	var idx []int
	for i := range f.messages {
		idx = append(idx, i)
		if i%5 == 0 {
			idx = append(idx, i)
		}
	}
	if err := produceIDs(ctx, e.brokers, topic, "m", idx, f.keys); err != nil {
		return res, err
	}
	modes := []string{"atomic", "batched"}
	s := pgx.Identifier{e.schema}.Sanitize()
	cons, srcs, groups := map[string]*consumer.Consumer{}, map[string]consumer.Source{}, []string{}
	counters := map[string]*consumer.Counters{}
	for _, mode := range modes {
		counters[mode] = &consumer.Counters{}
		cfg := consumer.Config{Scope: "rfo-" + mode, Store: store, Metrics: counters[mode], Logger: e.logger,
			RetryInitial: 50 * time.Millisecond, RetryMax: time.Second,
			Handler: func(ctx context.Context, tx pgx.Tx, msg *dedup.Message) error {
				_, err := tx.Exec(ctx, `insert into `+s+`.effects (mode, message_id) values ($1, $2)`, mode, msg.Identity.MessageID)
				return err
			}}
		if mode == "batched" {
			cfg.BatchSize = 20
		}
		c, err := consumer.New(cfg)
		if err != nil {
			return res, err
		}
		g := "rfo-" + mode + "-" + e.sfx
		src, err := e.source(g, topic)
		if err != nil {
			return res, err
		}
		cons[mode], srcs[mode], groups = c, src, append(groups, g)
	}
	logf("%d messages (%d copies) on %s; atomic and batched consumers start", f.messages, len(idx), topic)
	run := startConsumers(ctx, cons, srcs)
	defer run.stop()
	want := int(float64(f.messages) * f.at)
	if err := run.waitFor(ctx, "the consumers reach -at", 5*time.Minute, func() bool {
		least := f.messages
		for _, m := range modes {
			least = min(least, e.effects(ctx, m, 0))
		}
		res.atKill = least
		return least >= want
	}); err != nil {
		return res, err
	}
	if err := rfoFault(ctx, f, &res); err != nil {
		return res, err
	}
	reader := sentinelClient(false)
	defer func() { _ = reader.Close() }()
	// What the failover left: the fast path's entries on the new master, and
	// the SUCCEEDED records they stand for (counted just before, so an entry
	// remembered in between only makes the gap look smaller).
	if res.succeededAtFailover, err = e.q(ctx, `select count(*) from `+s+`.consumption_records where status = 'SUCCEEDED'`); err != nil {
		return res, err
	}
	if res.fpAtFailover, err = countKeys(ctx, reader, prefix+":*"); err != nil {
		return res, err
	}
	// Every message again, now that Redis answers: the fast path's entries
	// that survived answer them, the others fall through to Postgres.
	all := make([]int, f.messages)
	for i := range all {
		all[i] = i
	}
	if err := produceIDs(ctx, e.brokers, topic, "m", all, f.keys); err != nil {
		return res, err
	}
	if err := e.settle(ctx, run, f, topic, groups); err != nil {
		return res, err
	}
	run.stop()
	res.fpHits, res.fpMisses, res.fpErrors = store.FastPathStats()
	res.breakerOpen = fast.BreakerStats().Opened

	tc, err := readTopic(ctx, e.brokers, topic)
	if err != nil {
		return res, err
	}
	res.copies, res.distinctIDs = tc.messages, len(tc.copies)
	for _, mode := range modes {
		m := rfoMode{name: mode, counters: counters[mode].Snapshot()}
		if m.effects, err = e.q(ctx, `select count(*) from `+s+`.effects where mode = $1`, mode); err != nil {
			return res, err
		}
		if m.distinct, err = e.q(ctx, `select count(distinct message_id) from `+s+`.effects where mode = $1`, mode); err != nil {
			return res, err
		}
		if m.succeeded, err = e.q(ctx, `select count(*) from `+s+`.consumption_records where scope = $1 and status = 'SUCCEEDED'`, "rfo-"+mode); err != nil {
			return res, err
		}
		if m.lag, err = groupLag(ctx, e.brokers, "rfo-"+mode+"-"+e.sfx, topic); err != nil {
			return res, err
		}
		res.modes = append(res.modes, m)
	}
	if res.fpEntries, err = countKeys(ctx, reader, prefix+":*"); err != nil {
		return res, err
	}
	return res, nil
}

// rfoStore: the Redis-only store, a lease handler that inserts one row per
// call; the master killed at -at; then the topic consumed again by a new
// group of the same scope.
func rfoStore(ctx context.Context, f rfoFlags) (rfoRun, error) {
	res := rfoRun{phase: "store", messages: f.messages}
	if err := topology(ctx, "redis", "up"); err != nil {
		return res, err
	}
	e, err := rfoSetup(ctx)
	if err != nil {
		return res, err
	}
	defer e.close()
	client := sentinelClient(false)
	defer func() { _ = client.Close() }()
	prefix := "drill-rfo-" + e.sfx
	rs, err := redisstore.New(redisstore.Config{Client: client, Prefix: prefix, Fingerprinter: e.fp, MaxAttempts: 5, Logger: e.logger})
	if err != nil {
		return res, err
	}
	topic := "drill-rfo-store-" + e.sfx
	if err := kafkaadapter.EnsureTopics(ctx, e.brokers, 4, topic); err != nil {
		return res, err
	}
	if err := produce(ctx, e.brokers, topic, "m", f.messages, f.keys); err != nil {
		return res, err
	}
	s := pgx.Identifier{e.schema}.Sanitize()
	var pass atomic.Int32
	pass.Store(1)
	newConsumer := func(group string) (map[string]*consumer.Consumer, map[string]consumer.Source, error) {
		c, err := consumer.New(consumer.Config{Scope: "rfo-store", Store: rs, Logger: e.logger,
			RetryInitial: 50 * time.Millisecond, RetryMax: time.Second, Lease: dedup.LeaseOptions{TTL: 5 * time.Second},
			LeaseHandler: func(ctx context.Context, msg *dedup.Message) error {
				_, err := e.pool.Exec(ctx, `insert into `+s+`.effects (mode, message_id, pass) values ('store', $1, $2)`, msg.Identity.MessageID, pass.Load())
				return err
			}})
		if err != nil {
			return nil, nil, err
		}
		src, err := e.source(group, topic)
		return map[string]*consumer.Consumer{"store": c}, map[string]consumer.Source{"store": src}, err
	}
	g1, g2 := "rfo-store-"+e.sfx, "rfo-store-again-"+e.sfx
	cons, srcs, err := newConsumer(g1)
	if err != nil {
		return res, err
	}
	logf("%d messages on %s; the Redis-only store's consumer starts", f.messages, topic)
	run := startConsumers(ctx, cons, srcs)
	defer run.stop()
	want := int(float64(f.messages) * f.at)
	if err := run.waitFor(ctx, "the consumer reaches -at", 5*time.Minute, func() bool {
		res.atKill = e.effects(ctx, "store", 1)
		return res.atKill >= want
	}); err != nil {
		return res, err
	}
	if err := rfoFault(ctx, f, &res); err != nil {
		return res, err
	}
	if err := e.settle(ctx, run, f, topic, []string{g1}); err != nil {
		return res, err
	}
	run.stop()

	// What the new master holds for the messages that ran.
	rows, err := e.pool.Query(ctx, `select distinct message_id from `+s+`.effects where pass = 1`)
	if err != nil {
		return res, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return res, err
	}
	res.applied = len(ids)
	if res.calls1, err = e.q(ctx, `select count(*) from `+s+`.effects where pass = 1`); err != nil {
		return res, err
	}
	status := map[string]string{}
	iter := client.Scan(ctx, 0, prefix+":*:rec:*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		st, err := client.HGet(ctx, k, "status").Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return res, err
		}
		status[k[strings.LastIndex(k, ":rec:")+len(":rec:"):]] = st
	}
	if err := iter.Err(); err != nil {
		return res, err
	}
	for _, id := range ids {
		if status[id] == "SUCCEEDED" {
			res.succeededRedis++
		} else {
			res.recordsLost++
		}
	}
	dl := client.Scan(ctx, 0, prefix+":*:dead_letters", 100).Iterator()
	for dl.Next(ctx) {
		n, err := client.XLen(ctx, dl.Val()).Result()
		if err != nil {
			return res, err
		}
		res.deadLetters += n
	}
	if err := dl.Err(); err != nil {
		return res, err
	}
	logf("first pass: %d messages applied, %d with a SUCCEEDED record on the new master; the topic is consumed again (group %s)", res.applied, res.succeededRedis, g2)

	pass.Store(2)
	cons, srcs, err = newConsumer(g2)
	if err != nil {
		return res, err
	}
	run2 := startConsumers(ctx, cons, srcs)
	defer run2.stop()
	if err := e.settle(ctx, run2, f, topic, []string{g2}); err != nil {
		return res, err
	}
	run2.stop()
	if res.calls2, err = e.q(ctx, `select count(*) from `+s+`.effects where pass = 2`); err != nil {
		return res, err
	}
	if res.rerunIDs, err = e.q(ctx, `select count(distinct message_id) from `+s+`.effects where pass = 2`); err != nil {
		return res, err
	}
	m := rfoMode{name: "store"}
	if m.effects, err = e.q(ctx, `select count(*) from `+s+`.effects`); err != nil {
		return res, err
	}
	if m.distinct, err = e.q(ctx, `select count(distinct message_id) from `+s+`.effects`); err != nil {
		return res, err
	}
	if m.lag, err = groupLag(ctx, e.brokers, g1, topic); err != nil {
		return res, err
	}
	res.modes = []rfoMode{m}
	tc, err := readTopic(ctx, e.brokers, topic)
	if err != nil {
		return res, err
	}
	res.copies, res.distinctIDs = tc.messages, len(tc.copies)
	return res, nil
}

// rfoTokens: one worker issues a token and consumes it at once, across the
// kill, until -tokens are issued; then every token is consumed again.
func rfoTokens(ctx context.Context, f rfoFlags) (rfoRun, error) {
	res := rfoRun{phase: "tokens", messages: f.tokens}
	if err := topology(ctx, "redis", "up"); err != nil {
		return res, err
	}
	client := sentinelClient(false)
	defer func() { _ = client.Close() }()
	ts, err := submittoken.New(submittoken.Config{Client: client, Prefix: "drill-rfo-" + suffix(), TTL: 10 * time.Minute})
	if err != nil {
		return res, err
	}
	const scope = "drill"
	type tok struct {
		token string
		first error
	}
	var (
		mu     sync.Mutex
		toks   []tok
		issErr int
	)
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(toks) }
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for wctx.Err() == nil && count() < f.tokens {
			t, err := ts.Issue(wctx, scope)
			if err != nil {
				mu.Lock()
				issErr++
				mu.Unlock()
				time.Sleep(10 * time.Millisecond)
				continue
			}
			cerr := ts.Consume(wctx, scope, t)
			mu.Lock()
			toks = append(toks, tok{t, cerr})
			mu.Unlock()
			time.Sleep(time.Millisecond)
		}
	}()
	stopWorker := func() { cancel(); <-done }
	defer stopWorker()
	want := int(float64(f.tokens) * f.at)
	for count() < want {
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return res, err
		}
	}
	res.atKill = count()
	if err := rfoFault(ctx, f, &res); err != nil {
		return res, err
	}
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		return res, errors.New("tokens not all issued 5 minutes after the failover")
	case <-ctx.Done():
		return res, ctx.Err()
	}
	res.issued, res.issueErrs = len(toks), issErr
	for _, t := range toks {
		var err2 error
		for range 10 { // a second Consume, retried while Redis fails (never after an answer)
			err2 = ts.Consume(ctx, scope, t.token)
			if err2 == nil || errors.Is(err2, submittoken.ErrTokenUsed) || errors.Is(err2, submittoken.ErrTokenUnknown) {
				break
			}
			if err := sleep(ctx, 200*time.Millisecond); err != nil {
				return res, err
			}
		}
		switch {
		case t.first == nil:
			res.consumedFirst++
			switch {
			case err2 == nil:
				res.consumedTwice++
			case errors.Is(err2, submittoken.ErrTokenUsed):
				res.usedAfter++
			case errors.Is(err2, submittoken.ErrTokenUnknown):
				res.forgotten++
			default:
				return res, fmt.Errorf("second consume: %w", err2)
			}
		case errors.Is(t.first, submittoken.ErrTokenUnknown):
			res.unknownFirst++
		case errors.Is(t.first, submittoken.ErrTokenUsed):
			return res, errors.New("a fresh token's first Consume answered ErrTokenUsed")
		default:
			res.errFirst++
			switch {
			case err2 == nil:
				res.unknownOutcomeFree++
			case errors.Is(err2, submittoken.ErrTokenUsed):
				res.unknownOutcomeRan++
			case errors.Is(err2, submittoken.ErrTokenUnknown):
				res.unknownFirst++ // issued, lost before either Consume could find it
			default:
				return res, fmt.Errorf("second consume: %w", err2)
			}
		}
	}
	return res, nil
}

func rfoPrint(runs []rfoRun, f rfoFlags, total time.Duration) {
	pause := fmt.Sprintf("the replica stopped for %s behind full socket buffers (the master's later writes exist only in its memory),\n", f.lag)
	if f.lag == 0 {
		pause = "the replica streaming as usual (loopback, asynchronous),\n"
	}
	t := table{title: fmt.Sprintf("Redis failover drill: a master, a replica and 3 Sentinels (quorum 2, down-after 1s) on loopback; in each phase, with %d%% of\n"+
		"the work done, %sthe master SIGKILLed, the replica promoted by the sentinels; clients through go-redis's Sentinel client.", int(f.at*100), pause)}
	for _, r := range runs {
		t.columns = append(t.columns, map[string]string{"fastpath": "fast path", "store": "Redis store", "tokens": "submit token"}[r.phase])
	}
	cells := func(fn func(r rfoRun) string) []string {
		var out []string
		for _, r := range runs {
			out = append(out, fn(r))
		}
		return out
	}
	only := func(phase string, fn func(r rfoRun) string) func(r rfoRun) string {
		return func(r rfoRun) string {
			if r.phase != phase {
				return "-"
			}
			return fn(r)
		}
	}
	consumers := func(fn func(r rfoRun) string) func(r rfoRun) string {
		return func(r rfoRun) string {
			if r.phase == "tokens" {
				return "-"
			}
			return fn(r)
		}
	}
	row := func(label string, cs []string) { // a row no phase of this run has is left out
		for _, c := range cs {
			if c != "-" {
				t.row(label, cs...)
				return
			}
		}
	}
	d := func(x time.Duration) string { return x.Round(10 * time.Millisecond).String() }
	row("faults", cells(func(rfoRun) string { return "1 master kill" }))
	row("messages / tokens", cells(func(r rfoRun) string { return fmt.Sprint(r.messages) }))
	row("done when the master was killed", cells(func(r rfoRun) string { return fmt.Sprint(r.atKill) }))
	row("replica stopped before the kill (at most)", cells(func(r rfoRun) string { return d(r.pausedFor) }))
	row("sentinels name the new master after", cells(func(r rfoRun) string { return d(r.failoverFor) }))
	row("first write through Sentinel client after", cells(func(r rfoRun) string { return d(r.recovery) }))
	row("copies on the topic / distinct IDs", cells(consumers(func(r rfoRun) string { return fmt.Sprintf("%d / %d", r.copies, r.distinctIDs) })))
	for _, mode := range []string{"atomic", "batched"} {
		row("fast path "+mode+": effects / distinct", cells(only("fastpath", func(r rfoRun) string {
			for _, m := range r.modes {
				if m.name == mode {
					return fmt.Sprintf("%d / %d", m.effects, m.distinct)
				}
			}
			return "-"
		})))
		row("fast path "+mode+": duplicates absorbed", cells(only("fastpath", func(r rfoRun) string {
			for _, m := range r.modes {
				if m.name == mode {
					return fmt.Sprintf("%d", r.copies-m.effects)
				}
			}
			return "-"
		})))
		row("fast path "+mode+": SUCCEEDED records (PG)", cells(only("fastpath", func(r rfoRun) string {
			for _, m := range r.modes {
				if m.name == mode {
					return fmt.Sprint(m.succeeded)
				}
			}
			return "-"
		})))
	}
	row("fast path: entries / SUCCEEDED (PG) after failover", cells(only("fastpath", func(r rfoRun) string {
		return fmt.Sprintf("%d / %d", r.fpAtFailover, r.succeededAtFailover)
	})))
	row("fast path: entries on the new master at the end", cells(only("fastpath", func(r rfoRun) string { return fmt.Sprint(r.fpEntries) })))
	row("fast path: hits / misses / errors (store counters)", cells(only("fastpath", func(r rfoRun) string {
		return fmt.Sprintf("%d / %d / %d", r.fpHits, r.fpMisses, r.fpErrors)
	})))
	row("fast path: breaker opened", cells(only("fastpath", func(r rfoRun) string { return fmt.Sprint(r.breakerOpen) })))
	row("store: messages applied, first pass", cells(only("store", func(r rfoRun) string { return fmt.Sprint(r.applied) })))
	row("store: handler calls, first pass", cells(only("store", func(r rfoRun) string { return fmt.Sprint(r.calls1) })))
	row("store: SUCCEEDED on the new master", cells(only("store", func(r rfoRun) string { return fmt.Sprint(r.succeededRedis) })))
	row("store: records lost in the failover", cells(only("store", func(r rfoRun) string { return fmt.Sprint(r.recordsLost) })))
	row("store: dead letters", cells(only("store", func(r rfoRun) string { return fmt.Sprint(r.deadLetters) })))
	row("store: calls / messages, consumed again", cells(only("store", func(r rfoRun) string { return fmt.Sprintf("%d / %d", r.calls2, r.rerunIDs) })))
	row("tokens: issued / issue errors", cells(only("tokens", func(r rfoRun) string { return fmt.Sprintf("%d / %d", r.issued, r.issueErrs) })))
	row("tokens: consumed / unknown / error (1st)", cells(only("tokens", func(r rfoRun) string {
		return fmt.Sprintf("%d / %d / %d", r.consumedFirst, r.unknownFirst, r.errFirst)
	})))
	row("tokens: used on the 2nd Consume", cells(only("tokens", func(r rfoRun) string { return fmt.Sprint(r.usedAfter) })))
	row("tokens: consumed twice", cells(only("tokens", func(r rfoRun) string { return fmt.Sprint(r.consumedTwice) })))
	row("tokens: consumed, then unknown", cells(only("tokens", func(r rfoRun) string { return fmt.Sprint(r.forgotten) })))
	row("tokens: 1st failed: ran / free after", cells(only("tokens", func(r rfoRun) string {
		return fmt.Sprintf("%d / %d", r.unknownOutcomeRan, r.unknownOutcomeFree)
	})))
	row("duplicate effects", cells(func(r rfoRun) string {
		if r.phase == "tokens" {
			return fmt.Sprint(r.consumedTwice)
		}
		return fmt.Sprint(r.duplicateEffects())
	}))
	row("lost (messages skipped / tokens gone)", cells(func(r rfoRun) string {
		if r.phase == "tokens" {
			return fmt.Sprint(r.unknownFirst + r.forgotten)
		}
		return fmt.Sprint(r.skipped())
	}))
	row("exactly-once", cells(func(r rfoRun) string {
		clean := r.duplicateEffects() == 0 && r.skipped() == 0
		if r.phase == "tokens" {
			clean = r.consumedTwice == 0 && r.unknownFirst == 0 && r.forgotten == 0
		}
		switch {
		case clean:
			return "held"
		case r.phase == "fastpath":
			return "BROKEN"
		default:
			return "window"
		}
	}))
	t.print()
	fmt.Printf("\ntotal %s\n", total.Round(time.Second))
}
