package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/wire"
	"github.com/segmentio/kafka-go"
)

// proc is one child process of the demo.
type proc struct {
	label, events string
	cmd           *exec.Cmd
	done          chan error
}

func start(label, events string, args ...string) (*proc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, append(args, "-events", events)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{label: label, events: events, cmd: cmd, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	return p, nil
}

// waitKilled waits for the process to die of its own injected SIGKILL.
func (p *proc) waitKilled(d time.Duration) error {
	select {
	case err := <-p.done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
				return nil
			}
		}
		return fmt.Errorf("%s ended without the injected SIGKILL: %v", p.label, err)
	case <-time.After(d):
		_ = p.cmd.Process.Kill()
		return fmt.Errorf("%s did not reach its crash point in %s", p.label, d)
	}
}

// stop sends SIGTERM and waits for a graceful exit.
func (p *proc) stop(d time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			return fmt.Errorf("%s did not shut down cleanly: %w", p.label, err)
		}
		return nil
	case <-time.After(d):
		_ = p.cmd.Process.Kill()
		return fmt.Errorf("%s did not stop within %s of SIGTERM", p.label, d)
	}
}

func readEvents(path string) ([]stats, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	var out []stats
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var s stats
		if json.Unmarshal(sc.Bytes(), &s) == nil {
			out = append(out, s)
		}
	}
	return out, sc.Err()
}

func sumCounter(evs []stats, event, name string) int64 {
	var n int64
	for _, e := range evs {
		if e.Event == event {
			n += e.Counters[name]
		}
	}
	return n
}

func runDemo(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ExitOnError)
	var c common
	c.register(fs)
	orders := fs.Int("orders", 30, "orders to produce")
	crashAfter := fs.Int("crash-after", 8, "SIGKILL the first confirmer after N committed orders")
	keep := fs.Bool("keep", false, "keep the demo's schema for inspection")
	_ = fs.Parse(args)
	ctx, cancel := context.WithTimeout(ctx, 110*time.Second)
	defer cancel()
	began := time.Now()

	run := strconv.FormatInt(time.Now().UnixNano()%1_000_000_000_000, 36)
	c.schema = "order_pipeline_" + run
	c.ordersTopic, c.outTopic = "orders-"+run, "order.confirmed-"+run
	confirmGroup, shipGroup := "confirmer-"+run, "shipper-"+run
	dir, err := os.MkdirTemp("", "idemq-order-pipeline-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()

	a, err := openApp(ctx, &c)
	if err != nil {
		return err
	}
	defer a.pool.Close()
	if err := a.migrate(ctx); err != nil {
		return fmt.Errorf("postgres at %s: %w (start the services with `make services-up`)", c.dsn, err)
	}
	if !*keep {
		defer func() { _, _ = a.pool.Exec(context.Background(), `drop schema if exists `+a.s+` cascade`) }()
	}
	if err := kafkaadapter.EnsureTopics(ctx, c.brokerList(), 3, c.ordersTopic, c.outTopic); err != nil {
		return fmt.Errorf("kafka at %s: %w (start the services with `make services-up`)", c.brokers, err)
	}
	want, err := produceOrders(ctx, &c, *orders)
	if err != nil {
		return err
	}
	fmt.Printf("produced %d orders to %s (3 partitions, keyed by order ID, message-id header per order)\n", len(want), c.ordersTopic)

	confirmArgs := append([]string{"confirm", "-group", confirmGroup}, c.args()...)
	relayArgs := append([]string{"relay"}, c.args()...)
	shipArgs := append([]string{"ship", "-group", shipGroup}, c.args()...)
	ev := func(name string) string { return filepath.Join(dir, name+".jsonl") }

	// 1. The confirmer dies between its database commit and its ack.
	p1, err := start("confirmer process 1", ev("confirmer-1"), append(confirmArgs, "-instance", "confirmer-1", "-crash-after", strconv.Itoa(*crashAfter))...)
	if err != nil {
		return err
	}
	if err := p1.waitKilled(60 * time.Second); err != nil {
		return err
	}
	// A COMMIT sent just before the SIGKILL can still land after it, so this
	// count is only what is visible now; the summary counts again from the
	// rows once everything has settled.
	var seen1 int
	_ = a.pool.QueryRow(ctx, `select count(*) from `+a.s+`.orders where confirmed_by = 'confirmer-1'`).Scan(&seen1)
	fmt.Printf("[confirmer] process 1 was SIGKILLed at its crash point before acking any order; %d of its orders are committed so far (order rows + outbox rows)\n", seen1)

	// 2. The relay dies between publishing and marking.
	r1, err := start("relay process 1", ev("relay-1"), append(relayArgs, "-name", "relay-1", "-crash-after-publish")...)
	if err != nil {
		return err
	}
	if err := r1.waitKilled(60 * time.Second); err != nil {
		return err
	}
	r1ev, _ := readEvents(r1.events)
	var republish []string
	for _, e := range r1ev {
		republish = append(republish, e.Published...)
	}
	var unpublished int
	_ = a.pool.QueryRow(ctx, `select count(*) from `+a.s+`.outbox where published_at is null`).Scan(&unpublished)
	fmt.Printf("[relay] process 1 published %d rows to %s (acks=all), then was SIGKILLed before marking them; %d rows still unpublished\n",
		len(republish), c.outTopic, unpublished)

	// 3. Restart the confirmer, start two relays and the shipper.
	fmt.Println("[restart] confirmer process 2, relay-2 and relay-3 (two relays on one table), shipper")
	var procs []*proc
	for _, p := range []struct {
		label, ev string
		args      []string
	}{
		{"confirmer process 2", "confirmer-2", append(confirmArgs, "-instance", "confirmer-2")},
		{"relay-2", "relay-2", append(relayArgs, "-name", "relay-2")},
		{"relay-3", "relay-3", append(relayArgs, "-name", "relay-3")},
		{"shipper", "shipper", shipArgs},
	} {
		pr, err := start(p.label, ev(p.ev), p.args...)
		if err != nil {
			return err
		}
		procs = append(procs, pr)
	}
	stopAll := func() error {
		var errs []error
		for _, p := range procs {
			errs = append(errs, p.stop(20*time.Second))
		}
		return errors.Join(errs...)
	}

	// 4. Wait until everything is through: all orders confirmed and
	// shipped, every outbox row published, both groups caught up.
	n := len(want)
	var lastState string
	for {
		var confirmed, shipped, pending int
		_ = a.pool.QueryRow(ctx, `select (select count(distinct order_id) from `+a.s+`.orders),
  (select count(distinct order_id) from `+a.s+`.shipments),
  (select count(*) from `+a.s+`.outbox where published_at is null)`).Scan(&confirmed, &shipped, &pending)
		lag1, err1 := kafkaadapter.GroupLag(ctx, c.brokerList(), confirmGroup, c.ordersTopic)
		lag2, err2 := kafkaadapter.GroupLag(ctx, c.brokerList(), shipGroup, c.outTopic)
		lastState = fmt.Sprintf("confirmed %d/%d, shipped %d/%d, outbox pending %d, lag %d/%d", confirmed, n, shipped, n, pending, lag1, lag2)
		if confirmed == n && shipped == n && pending == 0 && err1 == nil && err2 == nil && lag1 == 0 && lag2 == 0 {
			break
		}
		select {
		case <-ctx.Done():
			_ = stopAll()
			return fmt.Errorf("pipeline did not finish in time: %s", lastState)
		case <-time.After(300 * time.Millisecond):
		}
	}
	fmt.Printf("[done] %s; stopping all processes with SIGTERM\n", lastState)
	if err := stopAll(); err != nil {
		return err
	}
	return summarize(ctx, a, &c, want, republish, procs, time.Since(began))
}

// topicCopies reads the confirmed topic from the start and counts copies per
// message-id header, checking that the copies of one ID are identical.
func topicCopies(ctx context.Context, c *common) (map[string]int, bool, error) {
	copies := map[string]int{}
	first := map[string]string{}
	identical := true
	for p := range 3 {
		conn, err := kafka.DialLeader(ctx, "tcp", c.brokerList()[0], c.outTopic, p)
		if err != nil {
			return nil, false, err
		}
		lo, hi, err := conn.ReadOffsets()
		_ = conn.Close()
		if err != nil {
			return nil, false, err
		}
		if hi <= lo {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: c.brokerList(), Topic: c.outTopic, Partition: p, MaxWait: 100 * time.Millisecond})
		if err := r.SetOffset(lo); err != nil {
			return nil, false, err
		}
		for {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			m, err := r.ReadMessage(rctx)
			cancel()
			if err != nil {
				_ = r.Close()
				return nil, false, fmt.Errorf("read %s/%d: %w", c.outTopic, p, err)
			}
			var id string
			for _, h := range m.Headers {
				if h.Key == wire.MessageIDHeader {
					id = string(h.Value)
				}
			}
			sig := fmt.Sprintf("%q|%q|%v", m.Key, m.Value, m.Headers)
			if prev, ok := first[id]; ok && prev != sig {
				identical = false
			}
			first[id] = sig
			copies[id]++
			if m.Offset >= hi-1 {
				break
			}
		}
		_ = r.Close()
	}
	return copies, identical, nil
}

func produceOrders(ctx context.Context, c *common, n int) (map[string]Order, error) {
	w := &kafka.Writer{Addr: kafka.TCP(c.brokerList()...), Topic: c.ordersTopic, Balancer: kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: 10 * time.Millisecond}
	defer func() { _ = w.Close() }()
	want := map[string]Order{}
	var msgs []kafka.Message
	for i := 1; i <= n; i++ {
		o := Order{OrderID: fmt.Sprintf("ord-%02d", i), AmountCents: int64(1000 + 250*i)}
		want[o.OrderID] = o
		b, _ := json.Marshal(o)
		msgs = append(msgs, kafka.Message{Key: []byte(o.OrderID), Value: b,
			Headers: []kafka.Header{{Key: wire.MessageIDHeader, Value: []byte("order-msg-" + o.OrderID)}}})
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		return nil, fmt.Errorf("produce orders: %w", err)
	}
	return want, nil
}

// summarize prints the outcome and checks the invariants. Every number it
// checks comes from durable state read after all processes stopped: the
// business rows (and which confirmer process committed each), the outbox
// table, the topic's contents, and the counters each process wrote to its
// events file when it stopped or crashed. None depends on when a crash
// happened.
func summarize(ctx context.Context, a *app, c *common, want map[string]Order, republish []string, procs []*proc, took time.Duration) error {
	type line struct {
		confirmed, shipped int
		confirmationID     string
		shippedWith        []string
	}
	lines := map[string]*line{}
	for id := range want {
		lines[id] = &line{}
	}
	get := func(id string) *line {
		if lines[id] == nil {
			lines[id] = &line{}
		}
		return lines[id]
	}
	rows, err := a.pool.Query(ctx, `select order_id, confirmation_id::text, confirmed_by from `+a.s+`.orders`)
	if err != nil {
		return err
	}
	committedBy := map[string]int{}
	for rows.Next() {
		var id, cid, by string
		if err := rows.Scan(&id, &cid, &by); err != nil {
			return err
		}
		l := get(id)
		l.confirmed++
		l.confirmationID = cid
		committedBy[by]++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	committed1, committed2 := committedBy["confirmer-1"], committedBy["confirmer-2"]
	rows, err = a.pool.Query(ctx, `select order_id, confirmation_message_id from `+a.s+`.shipments`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var id, mid string
		if err := rows.Scan(&id, &mid); err != nil {
			return err
		}
		l := get(id)
		l.shipped++
		l.shippedWith = append(l.shippedWith, mid)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	var outboxRows, published, parked int
	if err := a.pool.QueryRow(ctx, `select count(*), count(published_at), count(parked_at) from `+a.s+`.outbox`).
		Scan(&outboxRows, &published, &parked); err != nil {
		return err
	}
	evs := map[string][]stats{}
	for _, p := range procs {
		evs[p.label], _ = readEvents(p.events)
	}
	confirmDup := sumCounter(evs["confirmer process 2"], "stopped", "duplicate")
	confirmProc := sumCounter(evs["confirmer process 2"], "stopped", "processed")
	shipDup := sumCounter(evs["shipper"], "stopped", "duplicate")
	shipProc := sumCounter(evs["shipper"], "stopped", "processed")
	copies, identical, err := topicCopies(ctx, c)
	if err != nil {
		return err
	}
	relay2 := sumCounter(evs["relay-2"], "stopped", "published")
	relay3 := sumCounter(evs["relay-3"], "stopped", "published")

	fmt.Printf("\n=== idemq outbox demo: %s → confirmer → outbox → relay → %s → shipper (schema %s) ===\n", c.ordersTopic, c.outTopic, c.schema)
	fmt.Printf("%-8s %-9s %-7s %s\n", "order", "confirmed", "shipped", "order.confirmed message-id (outbox UUIDv7)")
	ids := make([]string, 0, len(lines))
	for id := range lines {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var failed []string
	check := func(ok bool, what string) {
		if !ok {
			failed = append(failed, what)
		}
	}
	inRepublish := map[string]bool{}
	for _, id := range republish {
		inRepublish[id] = true
	}
	for _, id := range ids {
		l := lines[id]
		mark := ""
		if inRepublish[l.confirmationID] {
			mark = "  (published twice: relay-1 crash)"
		}
		fmt.Printf("%-8s %-9d %-7d %s%s\n", id, l.confirmed, l.shipped, l.confirmationID, mark)
		_, expected := want[id]
		check(expected, "order "+id+" was produced")
		check(l.confirmed == 1, fmt.Sprintf("order %s confirmed exactly once (got %d)", id, l.confirmed))
		check(l.shipped == 1, fmt.Sprintf("order %s shipped exactly once (got %d)", id, l.shipped))
		check(len(l.shippedWith) == 1 && l.shippedWith[0] == l.confirmationID, "order "+id+" shipped by its own confirmation")
	}
	fmt.Println()
	fmt.Printf("confirmer: process 1 committed %d orders and was SIGKILLed before acking; process 2 processed %d and absorbed %d redeliveries as duplicates\n",
		committed1, confirmProc, confirmDup)
	fmt.Printf("outbox:    %d rows, %d published, %d parked\n", outboxRows, published, parked)
	fmt.Printf("relay:     relay-1 published %d rows and was SIGKILLed before marking them; relay-2 marked %d, relay-3 marked %d (the %d republished with the same message ID, key and bytes)\n",
		len(republish), relay2, relay3, len(republish))
	var onTopic, twice int
	for _, n := range copies {
		onTopic += n
		if n > 1 {
			twice++
		}
	}
	fmt.Printf("topic:     %s holds %d messages for %d message IDs; %d IDs twice, every copy byte-identical (key, value, headers): %v\n",
		c.outTopic, onTopic, len(copies), twice, identical)
	fmt.Printf("shipper:   processed %d confirmations, absorbed %d relay republishes as duplicates\n", shipProc, shipDup)
	fmt.Printf("took %s\n", took.Round(100*time.Millisecond))

	n := len(want)
	check(committed1 >= 1, "the first confirmer committed orders before its SIGKILL")
	check(confirmDup >= int64(committed1), fmt.Sprintf("the %d orders committed before the crash came back as duplicates (got %d)", committed1, confirmDup))
	check(committed1+committed2 == n, fmt.Sprintf("the two confirmer processes committed the %d orders between them (%d + %d)", n, committed1, committed2))
	check(confirmProc == int64(committed2), fmt.Sprintf("confirmer process 2 processed exactly the %d orders it committed (got %d)", committed2, confirmProc))
	check(outboxRows == n && published == n && parked == 0, fmt.Sprintf("%d outbox rows, all published (got %d rows, %d published, %d parked)", n, outboxRows, published, parked))
	check(len(republish) >= 1, "relay-1 published rows before its SIGKILL")
	check(relay2+relay3 == int64(n), fmt.Sprintf("relay-2 and relay-3 marked all %d rows (got %d)", n, relay2+relay3))
	check(shipProc == int64(n), fmt.Sprintf("the shipper processed %d confirmations (got %d)", n, shipProc))
	check(len(copies) == n && identical, fmt.Sprintf("the topic holds the %d message IDs, copies identical", n))
	for _, id := range republish {
		check(copies[id] >= 2, "row "+id+" published by relay-1 was republished")
	}
	check(shipDup >= int64(len(republish)), fmt.Sprintf("every republished row was absorbed as a duplicate (%d republished, %d duplicates)", len(republish), shipDup))
	if len(failed) > 0 {
		fmt.Println("\nINVARIANTS FAILED:")
		for _, f := range failed {
			fmt.Println("  -", f)
		}
		return errInvariant
	}
	fmt.Printf("\ninvariants: OK: each of the %d orders confirmed once and shipped once; %d redelivered orders and %d relay republishes absorbed as duplicates, no user dedup code\n",
		n, confirmDup, shipDup)
	return nil
}
