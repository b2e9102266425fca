package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/idemq/idemq/broker/rocketmqadapter"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/wire"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// queues is the drill topic's queue count (read and write).
const queues = 4

// runFlags are the run subcommand's settings.
type runFlags struct {
	modes        string
	messages     int
	kills        int
	interval     time.Duration
	handlerDelay time.Duration
	keep         bool
}

// result is what one mode's run measured, from durable state: the effects
// and deliveries tables, the idemq tables and the broker's committed offsets.
type result struct {
	mode          string
	messages      int
	kills         int
	inBacklog     int   // SIGKILLs that came before every message was applied
	effects       int   // rows of the effects table (one per message ID)
	applies       int   // committed handler runs (sum of applies)
	deliveries    int   // deliveries with an acknowledgeable outcome
	duplicates    int   // of which the outcome was duplicate
	maxPerMessage int   // most deliveries of one message
	deadLetters   int   // dead letters of the scope
	lag           int64 // broker lag after the graceful stop
	took          time.Duration
}

// exactlyOnce reports whether every message's effect was applied exactly
// once and nothing was dead-lettered.
func (r result) exactlyOnce() bool {
	return r.effects == r.messages && r.applies == r.messages && r.deadLetters == 0
}

// envInt is the environment variable name as an int, or def.
func envInt(name string, def int) int {
	var n int
	if v := os.Getenv(name); v != "" {
		if _, err := fmt.Sscan(v, &n); err == nil {
			return n
		}
	}
	return def
}

// runDrill runs the backlog drill for every mode and prints the table. It
// fails when exactly-once does not hold in a mode.
func runDrill(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var f runFlags
	fs.StringVar(&f.modes, "modes", "push,pull", "comma-separated modes to run: push (rocketmqadapter.NewPushConsumer), pull (rocketmqadapter.Source)")
	fs.IntVar(&f.messages, "messages", envInt("DRILL_MESSAGES", 3000), "messages sent before the consumers start (env DRILL_MESSAGES)")
	fs.IntVar(&f.kills, "kills", envInt("DRILL_KILLS", 20), "SIGKILLs of a consumer process, alternating between the two (env DRILL_KILLS)")
	fs.DurationVar(&f.interval, "interval", 3*time.Second, "time between a restarted consumer being ready and the next SIGKILL")
	fs.DurationVar(&f.handlerDelay, "handler-delay", 60*time.Millisecond,
		"time each handler run takes; the default makes the pull Source's backlog (4 queues, one delivery at a time each) last through most of the kills")
	fs.BoolVar(&f.keep, "keep", false, "keep each run's Postgres schema for inspection (default: drop it)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if f.messages < 1 || f.kills < 0 || f.interval <= 0 {
		return errors.New("run: -messages must be at least 1, -kills at least 0 and -interval positive")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, postgresDSN())
	if err != nil {
		return err
	}
	defer pool.Close()

	var results []result
	start := time.Now()
	for _, mode := range strings.Split(f.modes, ",") {
		mode = strings.TrimSpace(mode)
		if mode != "push" && mode != "pull" {
			return fmt.Errorf("run: mode %q: want push or pull", mode)
		}
		r, err := runMode(ctx, pool, self, mode, f)
		if err != nil {
			return fmt.Errorf("%s: %w", mode, err)
		}
		results = append(results, r)
	}
	printTable(results, f, time.Since(start))
	for _, r := range results {
		if !r.exactlyOnce() {
			return fmt.Errorf("%s: exactly-once broken: %d effect rows, %d applies, %d dead letters for %d messages",
				r.mode, r.effects, r.applies, r.deadLetters, r.messages)
		}
	}
	return nil
}

// runMode runs the drill once: a fresh topic, group and schema; N messages
// sent; two consumer processes, one SIGKILLed and restarted every interval
// (kills in all); then both stopped with SIGTERM once every message is
// applied and the deliveries settled.
func runMode(ctx context.Context, pool *pgxpool.Pool, self, mode string, f runFlags) (result, error) {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	suffix := time.Now().Format("150405") + hex.EncodeToString(b)
	topic, group, schema := "drill-"+mode+"-"+suffix, "drill-"+mode+"-"+suffix, "rmq_drill_"+mode+"_"+suffix
	res := result{mode: mode, messages: f.messages}
	fmt.Fprintf(os.Stderr, "== %s: topic %s, schema %s\n", mode, topic, schema)

	fp, err := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "drill", Secret: fingerprintSecret()})
	if err != nil {
		return res, err
	}
	store, err := pgstore.New(pool, pgstore.Config{Schema: schema, Fingerprinter: fp, MaxAttempts: maxAttempts})
	if err != nil {
		return res, err
	}
	if err := store.Migrate(ctx); err != nil {
		return res, err
	}
	if !f.keep {
		defer func() {
			_, _ = pool.Exec(context.Background(), "drop schema if exists "+pgx.Identifier{schema}.Sanitize()+" cascade")
		}()
	}
	if err := drillTables(ctx, pool, schema); err != nil {
		return res, err
	}
	tctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = rocketmqadapter.EnsureTopic(tctx, nameServers(), brokerAddr(), topic, queues)
	if err == nil {
		err = rocketmqadapter.EnsureRetryTopic(tctx, nameServers(), brokerAddr(), group)
	}
	cancel()
	if err != nil {
		return res, err
	}
	ends, err := send(ctx, topic, f.messages)
	if err != nil {
		return res, err
	}
	fmt.Fprintf(os.Stderr, "   sent %d messages\n", f.messages)

	logDir, err := os.MkdirTemp("", "rocketmq-drill-")
	if err != nil {
		return res, err
	}
	started := time.Now()
	args := []string{"consume", "-mode", mode, "-topic", topic, "-group", group, "-schema", schema,
		"-handler-delay", f.handlerDelay.String()}
	procs := make([]*child, 2)
	defer func() {
		for _, p := range procs {
			if p != nil {
				p.kill()
			}
		}
	}()
	for i := range procs {
		if procs[i], err = startChild(ctx, self, args, fmt.Sprintf("%c", 'a'+i), logDir, 0); err != nil {
			return res, err
		}
	}
	q := queries{pool: pool, schema: schema, scope: group}
	for k := 0; k < f.kills; k++ {
		if err := sleep(ctx, f.interval); err != nil {
			return res, err
		}
		i := k % len(procs)
		procs[i].kill()
		applied := q.count(ctx, effectsTable, "")
		if applied < f.messages {
			res.inBacklog++
		}
		if procs[i], err = startChild(ctx, self, args, procs[i].name, logDir, procs[i].gen+1); err != nil {
			return res, err
		}
		res.kills++
		fmt.Fprintf(os.Stderr, "   kill %d/%d (%s): %d of %d applied, %d deliveries\n", k+1, f.kills, procs[i].name,
			applied, f.messages, q.count(ctx, deliveriesTable, ""))
	}
	// Every message applied, then no delivery for quiet (late copies).
	deadline := time.Now().Add(4 * time.Minute)
	for q.count(ctx, effectsTable, "") < f.messages {
		if time.Now().After(deadline) {
			return res, fmt.Errorf("only %d of %d messages applied after 4 minutes (consumer logs: %s)",
				q.count(ctx, effectsTable, ""), f.messages, logDir)
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return res, err
		}
	}
	const quiet = 3 * time.Second
	last, since := q.count(ctx, deliveriesTable, ""), time.Now()
	for time.Since(since) < quiet && time.Now().Before(deadline) {
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return res, err
		}
		if n := q.count(ctx, deliveriesTable, ""); n != last {
			last, since = n, time.Now()
		}
	}
	// Graceful stop of both at once.
	var wg sync.WaitGroup
	errs := make([]error, len(procs))
	for i, p := range procs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = p.terminate() }()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return res, fmt.Errorf("%w (consumer logs: %s)", err, logDir)
	}
	res.took = time.Since(started)
	_ = os.RemoveAll(logDir)

	committed, err := brokerOffsets(group, topic)
	if err != nil {
		return res, err
	}
	for qid, end := range ends {
		if c := max(committed[qid], 0); c < end {
			res.lag += end - c
		}
	}
	res.effects = q.count(ctx, effectsTable, "")
	res.applies = q.scalar(ctx, `select coalesce(sum(applies), 0) from `+q.table(effectsTable))
	res.deliveries = q.count(ctx, deliveriesTable, "")
	res.duplicates = q.count(ctx, deliveriesTable, "outcome = '"+string(dedup.OutcomeDuplicate)+"'")
	res.maxPerMessage = q.scalar(ctx, `select coalesce(max(n), 0) from (select count(*) n from `+q.table(deliveriesTable)+` group by message_id) d`)
	res.deadLetters = q.scalar(ctx, `select count(*) from `+q.table("dead_letters")+` where scope = $1`, group)
	return res, q.err
}

// queries reads the drill's counts; the first error sticks in err.
type queries struct {
	pool   *pgxpool.Pool
	schema string
	scope  string
	err    error
}

func (q *queries) table(name string) string { return pgx.Identifier{q.schema, name}.Sanitize() }

func (q *queries) count(ctx context.Context, table, where string) int {
	sql := `select count(*) from ` + q.table(table)
	if where != "" {
		sql += ` where ` + where
	}
	return q.scalar(ctx, sql)
}

func (q *queries) scalar(ctx context.Context, sql string, args ...any) int {
	var n int64
	if err := q.pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil && q.err == nil {
		q.err = err
	}
	return int(n)
}

// send writes n messages ("drill-<i>" in the message-id property) to topic
// from 4 goroutines and returns each queue's end offset (highest offset
// written + 1), from the send results.
func send(ctx context.Context, topic string, n int) (map[int]int64, error) {
	p, err := rocketmq.NewProducer(
		producer.WithNsResolver(primitive.NewPassthroughResolver(nameServers())),
		producer.WithInstanceName(rocketmqadapter.InstanceName("drill-producer")),
		producer.WithGroupName("drill-producer"),
		producer.WithRetry(2),
	)
	if err != nil {
		return nil, err
	}
	if err := p.Start(); err != nil {
		return nil, err
	}
	defer func() { _ = p.Shutdown() }()
	var mu sync.Mutex
	ends := map[int]int64{}
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for w := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n && errs[w] == nil; i += len(errs) {
				m := primitive.NewMessage(topic, []byte("backlog"))
				m.WithProperty(wire.MessageIDHeader, fmt.Sprintf("drill-%d", i))
				sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				r, err := p.SendSync(sctx, m)
				cancel()
				switch {
				case err != nil:
					errs[w] = err
				case r.Status != primitive.SendOK || r.MessageQueue == nil:
					errs[w] = fmt.Errorf("send drill-%d: %+v", i, r)
				default:
					mu.Lock()
					ends[r.MessageQueue.QueueId] = max(ends[r.MessageQueue.QueueId], r.QueueOffset+1)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return ends, errors.Join(errs...)
}

// brokerOffsets reads group's committed offset of every queue of topic from
// the broker (-1: none), through a pull consumer of the group in Assign mode
// with no queue assigned: CurrentOffset then asks the broker. Call it once
// the group's consumers are gone.
func brokerOffsets(group, topic string) (map[int]int64, error) {
	pc, err := rocketmq.NewPullConsumer(
		rmqconsumer.WithGroupName(group),
		rmqconsumer.WithNsResolver(primitive.NewPassthroughResolver(nameServers())),
		rmqconsumer.WithInstance(rocketmqadapter.InstanceName("drill-offsets")),
	)
	if err != nil {
		return nil, err
	}
	if err := pc.Assign(topic, nil); err != nil {
		return nil, err
	}
	if err := pc.Start(); err != nil {
		return nil, err
	}
	defer func() { _ = pc.Shutdown() }()
	mqs, err := pc.GetTopicRouteInfo(topic)
	if err != nil {
		return nil, err
	}
	out := map[int]int64{}
	for _, mq := range mqs {
		off, err := pc.CurrentOffset(mq)
		if err != nil {
			return nil, err
		}
		out[mq.QueueId] = off
	}
	if len(out) != queues {
		return nil, fmt.Errorf("offsets of %d queues, want %d: %v", len(out), queues, out)
	}
	return out, nil
}

// child is one consumer process.
type child struct {
	name   string
	gen    int // restarts before this one
	cmd    *exec.Cmd
	log    *os.File
	exited chan error // cmd.Wait's result
}

// startChild starts "self args..." and waits until it prints "ready".
func startChild(ctx context.Context, self string, args []string, name, logDir string, gen int) (*child, error) {
	cmd := exec.Command(self, append(args, "-name", name)...) // #nosec G204 -- this program re-run as a consumer
	logf, err := os.Create(filepath.Join(logDir, fmt.Sprintf("%s-%d.log", name, gen)))
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{name: name, gen: gen, cmd: cmd, log: logf, exited: make(chan error, 1)}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "ready" {
				close(ready)
				break
			}
		}
		for sc.Scan() { // keep the pipe drained
		}
	}()
	go func() { c.exited <- cmd.Wait(); close(c.exited) }()
	select {
	case <-ready:
		return c, nil
	case err := <-c.exited:
		return nil, fmt.Errorf("consumer %s ended before it was ready: %v (log %s)", name, err, logf.Name())
	case <-time.After(60 * time.Second):
		c.kill()
		return nil, fmt.Errorf("consumer %s not ready after 60s (log %s)", name, logf.Name())
	case <-ctx.Done():
		c.kill()
		return nil, ctx.Err()
	}
}

// kill SIGKILLs the process and waits until it is reaped.
func (c *child) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	for range c.exited { // until reaped (closed after cmd.Wait; a SIGKILLed process exits with an error)
	}
	_ = c.log.Close()
}

// terminate sends SIGTERM and waits up to a minute for a clean exit.
func (c *child) terminate() error {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err, ok := <-c.exited:
		_ = c.log.Close()
		if ok && err != nil {
			return fmt.Errorf("consumer %s: exit after SIGTERM: %w (log %s)", c.name, err, c.log.Name())
		}
		return nil
	case <-time.After(time.Minute):
		c.kill()
		return fmt.Errorf("consumer %s did not exit a minute after SIGTERM (log %s)", c.name, c.log.Name())
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// printTable prints the results side by side, one column per mode.
func printTable(rs []result, f runFlags, total time.Duration) {
	fmt.Printf("\nRocketMQ backlog drill: %d messages sent first to a topic with %d queues, 2 consumer processes,\n"+
		"one SIGKILLed and restarted every %s (%d kills), then both stopped with SIGTERM\n\n", f.messages, queues, f.interval, f.kills)
	row := func(label string, cell func(r result) string) {
		fmt.Printf("%-36s", label)
		for _, r := range rs {
			fmt.Printf(" %12s", cell(r))
		}
		fmt.Println()
	}
	row("mode", func(r result) string { return r.mode })
	row("messages", func(r result) string { return fmt.Sprint(r.messages) })
	row("consumer SIGKILLs", func(r result) string { return fmt.Sprint(r.kills) })
	row("  of which during the backlog", func(r result) string { return fmt.Sprint(r.inBacklog) })
	row("effects applied (unique rows)", func(r result) string { return fmt.Sprint(r.effects) })
	row("handler commits (sum of applies)", func(r result) string { return fmt.Sprint(r.applies) })
	row("deliveries", func(r result) string { return fmt.Sprint(r.deliveries) })
	row("deliveries / message", func(r result) string {
		return fmt.Sprintf("%.2f", float64(r.deliveries)/float64(r.messages))
	})
	row("duplicates absorbed", func(r result) string { return fmt.Sprint(r.duplicates) })
	row("most deliveries of one message", func(r result) string { return fmt.Sprint(r.maxPerMessage) })
	row("dead letters", func(r result) string { return fmt.Sprint(r.deadLetters) })
	row("broker lag after graceful stop", func(r result) string { return fmt.Sprint(r.lag) })
	row("consume time (first start to stop)", func(r result) string { return r.took.Round(100 * time.Millisecond).String() })
	row("exactly-once", func(r result) string {
		if r.exactlyOnce() {
			return "held"
		}
		return "BROKEN"
	})
	fmt.Printf("\ntotal %s\n", total.Round(time.Second))
}
