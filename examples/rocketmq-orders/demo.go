package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/idemq/idemq/broker/rocketmqadapter"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The demo's cast of orders.
const (
	numGood     = 12        // ord-001 … ord-012: ordinary orders
	flakyOrder  = "ord-013" // fails twice downstream, then succeeds
	poisonOrder = "ord-014" // fails every time: "address invalid"
	crashOrder  = "ord-015" // the consumer processes are SIGKILLed after its commit, before its ack
	maxAttempts = 4
)

func orderID(i int) string { return fmt.Sprintf("ord-%03d", i) }

// sent is one message the demo produced.
type sent struct {
	order     Order
	messageID string // the message-id property ("" when none)
	uniqKey   string // the UNIQ_KEY (MsgId) stamped by the producer
	note      string
}

// identity is the message ID idemq derives for s.
func (s sent) identity() string {
	if s.messageID != "" {
		return s.messageID
	}
	return s.uniqKey
}

// tagged is an event of one consumer process generation.
type tagged struct {
	event
	gen int // 1 before the kill, 2 after the restart
}

// demo holds the run's state.
type demo struct {
	ctx                        context.Context
	self                       string
	suffix, topic, schema      string
	groupIdemq, groupNaive     string
	pool                       *pgxpool.Pool
	store                      *pgstore.Store
	prod                       rocketmq.Producer
	logPath                    string
	logFile                    *os.File
	verbose                    bool
	sends                      []sent
	mu                         sync.Mutex
	events                     []tagged
	procs                      map[string]*child
	crashCommitted             bool
	crashKilled                []string
	failures, oks, storyLines  []string
	idemqRows, naiveRows       map[string]int
	idemqAmounts               map[string][]int64
	deadLetters                []dedup.DeadLetter
	flakyRecord, poisonRecord  dedup.Record
	flakyErr, poisonErr        error
	crashRecordBeforeKill      dedup.Record
	idemqWaitErr, naiveWaitErr error
	readyAt                    time.Time
}

func runDemo(args []string) error {
	fs := flag.NewFlagSet("demo", flag.ExitOnError)
	keep := fs.Bool("keep", false, "keep the demo's Postgres schema for inspection (default: drop it at the end)")
	verbose := fs.Bool("v", false, "copy the consumer processes' logs to stderr")
	_ = fs.Parse(args)

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	self, err := os.Executable()
	if err != nil {
		self = os.Args[0]
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	suffix := time.Now().Format("150405") + hex.EncodeToString(b)
	d := &demo{ctx: ctx, self: self, suffix: suffix, verbose: *verbose,
		topic: "orders-" + suffix, groupIdemq: "orders-idemq-" + suffix, groupNaive: "orders-naive-" + suffix,
		schema: "orders_demo_" + suffix, procs: map[string]*child{}}
	defer d.killAll()

	start := time.Now()
	fmt.Printf("idemq RocketMQ orders demo\n  topic %s, groups %s (idemq) and %s (naive), schema %s\n\n",
		d.topic, d.groupIdemq, d.groupNaive, d.schema)
	if err := d.setup(); err != nil {
		return err
	}
	defer d.pool.Close()
	defer func() { _ = d.prod.Shutdown() }()
	if !*keep {
		defer func() {
			_, _ = d.pool.Exec(context.Background(), "drop schema if exists "+pgx.Identifier{d.schema}.Sanitize()+" cascade")
		}()
	}
	if err := d.story(); err != nil {
		fmt.Printf("\nthe story stopped early: %v\n", err)
		d.failures = append(d.failures, "story: "+err.Error())
	}
	d.stopAll()
	if err := d.collect(); err != nil {
		return err
	}
	d.summary(time.Since(start))
	if len(d.failures) > 0 {
		fmt.Printf("\nconsumer logs: %s\n", d.logPath)
		return fmt.Errorf("%d invariant(s) failed", len(d.failures))
	}
	_ = os.Remove(d.logPath)
	return nil
}

func (d *demo) say(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	d.storyLines = append(d.storyLines, line)
	fmt.Printf("  %s\n", line)
}

func (d *demo) setup() error {
	var err error
	d.pool, err = pgxpool.New(d.ctx, postgresDSN())
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	if err := d.pool.Ping(d.ctx); err != nil {
		return fmt.Errorf("postgres at %s: %w (start the services: bash scripts/services.sh up)", postgresDSN(), err)
	}
	fp, err := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "demo", Secret: fingerprintSecret()})
	if err != nil {
		return err
	}
	if d.store, err = pgstore.New(d.pool, pgstore.Config{Schema: d.schema, Fingerprinter: fp, MaxAttempts: maxAttempts}); err != nil {
		return err
	}
	if err := d.store.Migrate(d.ctx); err != nil {
		return err
	}
	if err := createTables(d.ctx, d.pool, d.schema); err != nil {
		return err
	}
	if err := rocketmqadapter.EnsureTopic(d.ctx, nameServers(), brokerAddr(), d.topic, 4); err != nil {
		return fmt.Errorf("%w (is RocketMQ up? bash scripts/services.sh up)", err)
	}
	for _, g := range []string{d.groupIdemq, d.groupNaive} {
		if err := rocketmqadapter.EnsureRetryTopic(d.ctx, nameServers(), brokerAddr(), g); err != nil {
			return err
		}
	}
	d.prod, err = rocketmq.NewProducer(
		producer.WithNsResolver(primitive.NewPassthroughResolver(nameServers())),
		producer.WithInstanceName(rocketmqadapter.InstanceName("orders-producer")),
		producer.WithGroupName("orders-producer-"+d.suffix),
		producer.WithRetry(2),
	)
	if err != nil {
		return err
	}
	if err := d.prod.Start(); err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	d.logPath = filepath.Join(os.TempDir(), "rocketmq-orders-demo-"+d.suffix+".log")
	d.logFile, err = os.Create(d.logPath)
	return err
}

// story runs the redelivery story; it returns an error only when a step
// cannot go on (the summary then shows what happened so far).
func (d *demo) story() error {
	fmt.Println("story")
	// 1. Two consumer processes on the same topic: the listener wrapped by
	// idemq, and the same listener without it.
	for _, mode := range []string{"idemq", "naive"} {
		if err := d.startConsumer(mode, 1, crashOrder); err != nil {
			return err
		}
	}
	if err := d.waitReady(1); err != nil {
		return err
	}
	d.readyAt = time.Now()
	d.say("started 2 consumer processes: %s (idemq, max attempts %d) and %s (naive, max reconsume 3)", d.groupIdemq, maxAttempts, d.groupNaive)

	// 2. The orders, each with a message-id property as idemq's outbox relay
	// would set.
	var originals []Order
	for i := 1; i <= numGood; i++ {
		originals = append(originals, Order{OrderID: orderID(i), Customer: fmt.Sprintf("c-%d", i%4+1), AmountCents: int64(i*100 + 99)})
	}
	originals = append(originals,
		Order{OrderID: flakyOrder, Customer: "c-1", AmountCents: 1399, FailTimes: 2},
		Order{OrderID: poisonOrder, Customer: "c-2", AmountCents: 1499, Poison: true})
	for _, o := range originals {
		note := ""
		switch o.OrderID {
		case flakyOrder:
			note = "flaky"
		case poisonOrder:
			note = "poison"
		}
		if err := d.send(o, "msg-"+o.OrderID, note); err != nil {
			return err
		}
	}
	d.say("sent %d orders (ord-001…ord-014); %s fails twice downstream, %s always fails (address invalid)", len(originals), flakyOrder, poisonOrder)
	d.waitSettled(90 * time.Second)

	// 3. Re-sends: the same intent as a new message (new UNIQ_KEY).
	for _, i := range []int{2, 3, 4} {
		if err := d.send(originals[i-1], "msg-"+orderID(i), "resend-same-id"); err != nil {
			return err
		}
	}
	for _, i := range []int{5, 6} {
		if err := d.send(originals[i-1], "", "resend-new-id"); err != nil {
			return err
		}
	}
	conflicting := originals[6]
	conflicting.AmountCents += 5000
	if err := d.send(conflicting, "", "conflict"); err != nil {
		return err
	}
	d.say("re-sent ord-002, ord-003, ord-004 with their message-id (a relay republishing after a crash)")
	d.say("re-sent ord-005, ord-006 without message-id: new UNIQ_KEY, same order ID in Keys (an application retry)")
	d.say("re-sent ord-007 with another amount (%d instead of %d cents)", conflicting.AmountCents, originals[6].AmountCents)
	d.waitSettled(60 * time.Second)

	// 4. Crash between commit and ack. The client persists consumed offsets
	// every 5 s: let the flush cover everything so far, then send one more
	// order; both consumers commit it and are SIGKILLed before answering the
	// broker.
	wait := 5500 * time.Millisecond
	if w := time.Until(d.readyAt.Add(16 * time.Second)); w > wait {
		wait = w // the first flush runs 10 s after the client starts
	}
	d.say("waiting %s for the consumers' offset flush (every 5 s, first 10 s after start)", wait.Round(100*time.Millisecond))
	time.Sleep(wait)
	crash := Order{OrderID: crashOrder, Customer: "c-3", AmountCents: 1599}
	if err := d.send(crash, "msg-"+crashOrder, "crash"); err != nil {
		return err
	}
	if err := d.waitFor(30*time.Second, "both consumers to commit "+crashOrder, func() bool {
		return d.count(func(e tagged) bool { return e.Ev == "stalled" && e.Order == crashOrder }) >= 2
	}); err != nil {
		return err
	}
	rec, err := d.store.Lookup(d.ctx, d.groupIdemq, "msg-"+crashOrder)
	d.crashRecordBeforeKill = rec
	d.crashCommitted = err == nil && rec.Status == dedup.StatusSucceeded && d.rows(ordersTable, crashOrder) == 1
	for _, mode := range []string{"idemq", "naive"} {
		pid := d.kill(mode)
		d.crashKilled = append(d.crashKilled, fmt.Sprintf("%s pid %d", mode, pid))
	}
	d.say("%s committed in Postgres by both consumers (idemq record %s, attempts %d); SIGKILL %s before the broker ack",
		crashOrder, rec.Status, rec.Attempts, strings.Join(d.crashKilled, ", "))

	// 5. Restart both in the same groups: the broker redelivers from the
	// last persisted offset.
	for _, mode := range []string{"idemq", "naive"} {
		if err := d.startConsumer(mode, 2, ""); err != nil {
			return err
		}
	}
	if err := d.waitReady(2); err != nil {
		return err
	}
	err = d.waitFor(60*time.Second, "the redelivery of "+crashOrder+" after the restart", func() bool {
		return d.count(func(e tagged) bool {
			return e.gen == 2 && e.Ev == "result" && e.Order == crashOrder && e.Ack && e.Mode == "idemq"
		}) >= 1 && d.count(func(e tagged) bool {
			return e.gen == 2 && e.Ev == "result" && e.Order == crashOrder && e.Mode == "naive"
		}) >= 1
	})
	if err != nil {
		return err
	}
	time.Sleep(2 * time.Second) // stray copies
	d.say("restarted both consumers; the broker redelivered %s to each", crashOrder)
	return nil
}

// send produces one message (SendSync of a single message, so the producer
// stamps a UNIQ_KEY).
func (d *demo) send(o Order, messageID, note string) error {
	res, err := d.prod.SendSync(d.ctx, newOrderMessage(d.topic, o, messageID))
	if err != nil {
		return fmt.Errorf("send %s: %w", o.OrderID, err)
	}
	if res.Status != primitive.SendOK {
		return fmt.Errorf("send %s: status %d", o.OrderID, res.Status)
	}
	d.mu.Lock()
	d.sends = append(d.sends, sent{order: o, messageID: messageID, uniqKey: res.MsgID, note: note})
	d.mu.Unlock()
	return nil
}

// waitSettled waits until every message sent so far has a final answer from
// both consumers: idemq acknowledged it; the naive consumer acknowledged it
// or gave it up to %DLQ% (poison: 4 deliveries).
func (d *demo) waitSettled(timeout time.Duration) {
	d.mu.Lock()
	sends := append([]sent(nil), d.sends...)
	d.mu.Unlock()
	needIdemq := map[string]int{}
	for _, s := range sends {
		needIdemq[s.identity()]++
	}
	d.idemqWaitErr = d.waitFor(timeout, "idemq to settle", func() bool {
		got := map[string]int{}
		for _, e := range d.snapshot() {
			if e.Mode == "idemq" && e.Ev == "result" && e.Ack {
				got[e.MessageID]++
			}
		}
		for id, n := range needIdemq {
			if got[id] < n {
				return false
			}
		}
		return true
	})
	d.naiveWaitErr = d.waitFor(timeout, "the naive consumer to settle", func() bool {
		acked, tried := map[string]bool{}, map[string]int{}
		for _, e := range d.snapshot() {
			if e.Mode == "naive" && e.Ev == "result" {
				tried[e.MessageID]++
				if e.Ack {
					acked[e.MessageID] = true
				}
			}
		}
		for _, s := range sends {
			if !acked[s.uniqKey] && (!s.order.Poison || tried[s.uniqKey] < 4) {
				return false
			}
		}
		return true
	})
}

func (d *demo) waitFor(timeout time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if mode := d.exited(); mode != "" {
			return fmt.Errorf("the %s consumer process exited while waiting for %s (see %s)", mode, what, d.logPath)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		if d.ctx.Err() != nil {
			return d.ctx.Err()
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

func (d *demo) waitReady(gen int) error {
	return d.waitFor(60*time.Second, "the consumers to start", func() bool {
		return d.count(func(e tagged) bool { return e.Ev == "ready" && e.gen == gen }) >= 2
	})
}

func (d *demo) snapshot() []tagged {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]tagged(nil), d.events...)
}

func (d *demo) count(f func(tagged) bool) int {
	n := 0
	for _, e := range d.snapshot() {
		if f(e) {
			n++
		}
	}
	return n
}

// child is one consumer process; eof is closed once its stdout is drained.
type child struct {
	cmd *exec.Cmd
	eof chan struct{}
}

// wait reaps the process after its events have been read (exec.Cmd.Wait
// closes the pipe, which would drop unread lines).
func (c *child) wait() {
	<-c.eof
	_ = c.cmd.Wait()
}

// startConsumer re-executes this program as a separate OS process running
// the consume subcommand, and reads its events.
func (d *demo) startConsumer(mode string, gen int, stall string) error {
	group := d.groupIdemq
	if mode == "naive" {
		group = d.groupNaive
	}
	args := []string{"consume", "-mode", mode, "-topic", d.topic, "-group", group, "-schema", d.schema,
		"-max-attempts", fmt.Sprint(maxAttempts)}
	if stall != "" {
		args = append(args, "-stall-order", stall)
	}
	cmd := exec.Command(d.self, args...)
	cmd.Env = os.Environ()
	var stderr io.Writer = d.logFile
	if d.verbose {
		stderr = io.MultiWriter(d.logFile, os.Stderr)
	}
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s consumer: %w", mode, err)
	}
	c := &child{cmd: cmd, eof: make(chan struct{})}
	d.mu.Lock()
	d.procs[mode] = c
	d.mu.Unlock()
	go func() {
		defer close(c.eof)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var e event
			if json.Unmarshal(sc.Bytes(), &e) != nil {
				continue
			}
			d.mu.Lock()
			d.events = append(d.events, tagged{event: e, gen: gen})
			d.mu.Unlock()
		}
	}()
	return nil
}

// exited names a consumer process that ended on its own, or "".
func (d *demo) exited() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	for mode, c := range d.procs {
		select {
		case <-c.eof:
			return mode
		default:
		}
	}
	return ""
}

// kill SIGKILLs a consumer process and reaps it; it returns the pid.
func (d *demo) kill(mode string) int {
	d.mu.Lock()
	c := d.procs[mode]
	delete(d.procs, mode)
	d.mu.Unlock()
	if c == nil {
		return 0
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	c.wait()
	return c.cmd.Process.Pid
}

// stopAll shuts the consumers down gracefully (SIGTERM), then kills what is
// left after 20s.
func (d *demo) stopAll() {
	d.mu.Lock()
	procs := d.procs
	d.procs = map[string]*child{}
	d.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { c.wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				_ = c.cmd.Process.Kill()
				<-done
			}
		}()
	}
	wg.Wait()
}

func (d *demo) killAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.procs {
		_ = c.cmd.Process.Kill()
		c.wait()
	}
	d.procs = map[string]*child{}
	if d.logFile != nil {
		_ = d.logFile.Close()
	}
}

func (d *demo) rows(table, order string) int {
	var n int
	_ = d.pool.QueryRow(d.ctx, `select count(*) from `+pgx.Identifier{d.schema, table}.Sanitize()+` where order_id = $1`, order).Scan(&n)
	return n
}

func (d *demo) rowsByOrder(table string) (map[string]int, map[string][]int64, error) {
	rows, err := d.pool.Query(d.ctx, `select order_id, amount_cents from `+pgx.Identifier{d.schema, table}.Sanitize()+` order by id`)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	n, amounts := map[string]int{}, map[string][]int64{}
	for rows.Next() {
		var id string
		var a int64
		if err := rows.Scan(&id, &a); err != nil {
			return nil, nil, err
		}
		n[id]++
		amounts[id] = append(amounts[id], a)
	}
	return n, amounts, rows.Err()
}

// collect reads the final state from Postgres.
func (d *demo) collect() error {
	var err error
	if d.idemqRows, d.idemqAmounts, err = d.rowsByOrder(ordersTable); err != nil {
		return err
	}
	if d.naiveRows, _, err = d.rowsByOrder(naiveTable); err != nil {
		return err
	}
	if d.deadLetters, err = d.store.DeadLetters(d.ctx, d.groupIdemq, 0, 1000); err != nil {
		return err
	}
	d.flakyRecord, d.flakyErr = d.store.Lookup(d.ctx, d.groupIdemq, "msg-"+flakyOrder)
	d.poisonRecord, d.poisonErr = d.store.Lookup(d.ctx, d.groupIdemq, "msg-"+poisonOrder)
	return nil
}

func (d *demo) check(ok bool, format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	if ok {
		d.oks = append(d.oks, line)
		fmt.Printf("  [ok]   %s\n", line)
		return
	}
	d.failures = append(d.failures, line)
	fmt.Printf("  [FAIL] %s\n", line)
}

func (d *demo) summary(took time.Duration) {
	evs := d.snapshot()
	type side struct {
		delivered, handlerRuns, retries int
		outcomes                        map[string]int
	}
	sides := map[string]*side{"idemq": {outcomes: map[string]int{}}, "naive": {outcomes: map[string]int{}}}
	crashRunsAfterRestart, crashDupAfterRestart := 0, 0
	var flakyReconsume []string
	for _, e := range evs {
		s := sides[e.Mode]
		if s == nil {
			continue
		}
		switch e.Ev {
		case "handler":
			s.handlerRuns++
			if e.Mode == "idemq" && e.Order == crashOrder && e.gen == 2 {
				crashRunsAfterRestart++
			}
			if e.Mode == "idemq" && e.Order == flakyOrder {
				flakyReconsume = append(flakyReconsume, fmt.Sprintf("attempt %d/reconsume %d", e.Attempt, e.Reconsume))
			}
		case "result":
			s.delivered++
			key := e.Outcome
			if e.By != "" {
				key += ":" + e.By
			}
			s.outcomes[key]++
			if e.Outcome == string(dedup.OutcomeRetry) {
				s.retries++
			}
			if e.Mode == "idemq" && e.Order == crashOrder && e.gen == 2 && e.Outcome == string(dedup.OutcomeDuplicate) && e.Ack {
				crashDupAfterRestart++
			}
		}
	}
	dlReasons := map[string]int{}
	for _, dl := range d.deadLetters {
		dlReasons[dl.Reason]++
	}
	doubled := func(rows map[string]int) []string {
		var out []string
		for id, n := range rows {
			if n > 1 {
				out = append(out, fmt.Sprintf("%s×%d", id, n))
			}
		}
		sort.Strings(out)
		return out
	}
	sumRows := func(rows map[string]int) int {
		t := 0
		for _, n := range rows {
			t += n
		}
		return t
	}
	goodOrders := []string{}
	for i := 1; i <= numGood; i++ {
		goodOrders = append(goodOrders, orderID(i))
	}
	goodOrders = append(goodOrders, flakyOrder, crashOrder)
	missing := func(rows map[string]int) int {
		n := 0
		for _, id := range goodOrders {
			if rows[id] == 0 {
				n++
			}
		}
		return n
	}
	idq, nv := sides["idemq"], sides["naive"]
	dupI := idq.outcomes["duplicate:message_id"] + idq.outcomes["duplicate:business_key"]

	fmt.Printf("\nsummary (%d messages sent, %s)\n", len(d.sends), took.Round(time.Second))
	row := func(label string, a, b any) { fmt.Printf("  %-38s %10v %16v\n", label, a, b) }
	row("", "with idemq", "naive listener")
	row("deliveries to the listener", idq.delivered, nv.delivered)
	row("handler runs", idq.handlerRuns, nv.handlerRuns)
	row("answered ConsumeRetryLater", idq.retries, nv.retries)
	row("duplicates skipped", dupI, 0)
	row("  matched by message-id", idq.outcomes["duplicate:message_id"], "-")
	row("  matched by business key (Keys)", idq.outcomes["duplicate:business_key"], "-")
	row("conflicts (same key, other payload)", idq.outcomes["conflict:business_key"]+idq.outcomes["conflict:message_id"], "not detected")
	row("dead letters in Postgres", len(d.deadLetters), "-")
	for _, r := range sortedKeys(dlReasons) {
		row("  "+r, dlReasons[r], "-")
	}
	row("order rows", sumRows(d.idemqRows), sumRows(d.naiveRows))
	row("orders applied more than once", len(doubled(d.idemqRows)), len(doubled(d.naiveRows)))
	row("good orders missing", missing(d.idemqRows), missing(d.naiveRows))
	if dn := doubled(d.naiveRows); len(dn) > 0 {
		fmt.Printf("  naive listener, double-applied: %s\n", strings.Join(dn, " "))
		fmt.Printf("  (its poison order was applied on every delivery, then moved to %%DLQ%%%s)\n", d.groupNaive)
	}

	fmt.Println("\ninvariants (idemq)")
	d.check(d.idemqWaitErr == nil && d.naiveWaitErr == nil, "every message reached a final answer (%v)", firstErr(d.idemqWaitErr, d.naiveWaitErr))
	once := missing(d.idemqRows) == 0 && len(doubled(d.idemqRows)) == 0
	d.check(once, "each of the %d good orders applied exactly once (rows: %d, missing %d, doubled %v)", len(goodOrders), sumRows(d.idemqRows)-d.idemqRows[poisonOrder], missing(d.idemqRows), doubled(d.idemqRows))
	d.check(idq.outcomes["duplicate:message_id"] >= 3 && idq.outcomes["duplicate:business_key"] >= 2,
		"re-sends skipped: %d by message_id (≥3: ord-002…004), %d by business_key (≥2: ord-005, ord-006)", idq.outcomes["duplicate:message_id"], idq.outcomes["duplicate:business_key"])
	amt := d.idemqAmounts[orderID(7)]
	d.check(idq.outcomes["conflict:business_key"] >= 1 && dlReasons[dedup.ReasonPayloadConflict] == 1 && len(amt) == 1 && amt[0] == 799,
		"conflicting re-send of ord-007 not applied (amount %v, want [799]), dead letter %s ×%d", amt, dedup.ReasonPayloadConflict, dlReasons[dedup.ReasonPayloadConflict])
	d.check(d.flakyErr == nil && d.flakyRecord.Status == dedup.StatusSucceeded && d.flakyRecord.Attempts == 3 && d.idemqRows[flakyOrder] == 1,
		"%s through %%RETRY%%: %s after %d attempts (%s), record reconsume_times %d, %d row", flakyOrder, d.flakyRecord.Status, d.flakyRecord.Attempts, strings.Join(flakyReconsume, ", "), d.flakyRecord.ReconsumeTimes, d.idemqRows[flakyOrder])
	d.check(d.poisonErr == nil && d.poisonRecord.Status == dedup.StatusFailedFinal && d.poisonRecord.Attempts == maxAttempts && d.idemqRows[poisonOrder] == 0 && dlReasons[dedup.ReasonAttemptsExhausted] == 1 && strings.Contains(d.poisonRecord.LastError, "address invalid"),
		"poison %s: %s after %d attempts (last error %q), %d rows, dead letter %s ×%d", poisonOrder, d.poisonRecord.Status, d.poisonRecord.Attempts, d.poisonRecord.LastError, d.idemqRows[poisonOrder], dedup.ReasonAttemptsExhausted, dlReasons[dedup.ReasonAttemptsExhausted])
	d.check(d.crashCommitted && crashDupAfterRestart >= 1 && crashRunsAfterRestart == 0 && d.idemqRows[crashOrder] == 1,
		"SIGKILL after commit: %s committed before the kill (%v), redelivered after restart as a duplicate (%d), handler runs after restart %d, rows %d",
		crashOrder, d.crashCommitted, crashDupAfterRestart, crashRunsAfterRestart, d.idemqRows[crashOrder])
	if len(d.failures) == 0 {
		fmt.Println("\nRESULT: PASS — every order applied exactly once with idemq")
	} else {
		fmt.Printf("\nRESULT: FAIL — %d invariant(s) failed\n", len(d.failures))
	}
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func firstErr(errs ...error) any {
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return "all settled"
}
