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
	"strings"
	"syscall"
	"time"

	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/wire"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
)

const (
	startBalance = 100_00
	numPayments  = 24
	numAccounts  = 4
)

// streamMsg is one message the demo produces.
type streamMsg struct {
	messageID string
	p         Payment
	note      string
}

// stream builds the troubled stream: 24 payments, then a producer retry of
// m-05 (same message ID), an application re-send of p-07 under a new message
// ID, m-09 again with a different amount (conflict) and a poison payment.
func stream() []streamMsg {
	var out []streamMsg
	pay := func(i int) Payment {
		return Payment{PaymentID: fmt.Sprintf("p-%02d", i), Account: fmt.Sprintf("acct-%d", i%numAccounts+1), Amount: int64(100 * (i%5 + 1))}
	}
	for i := 1; i <= numPayments; i++ {
		out = append(out, streamMsg{messageID: fmt.Sprintf("m-%02d", i), p: pay(i)})
		switch i {
		case 8:
			out = append(out, streamMsg{messageID: "m-05", p: pay(5), note: "producer retry: m-05 again"})
		case 14:
			out = append(out, streamMsg{messageID: "m-07-resend", p: pay(7), note: "re-send: p-07 under a new message ID"})
		case 18:
			c := pay(9)
			c.Amount += 50
			out = append(out, streamMsg{messageID: "m-09", p: c, note: "conflict: m-09 with another amount"})
		case 20:
			out = append(out, streamMsg{messageID: "m-poison", p: Payment{PaymentID: "p-poison", Account: "acct-1", Amount: -5}, note: "poison: negative amount"})
		}
	}
	return out
}

func runDemo(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ExitOnError)
	var ep endpoints
	brokers := ep.register(fs)
	crashAfter := fs.Int("crash-after", 10, "SIGKILL each consumer after N committed deliveries")
	_ = fs.Parse(args)
	ep.brokers = splitBrokers(*brokers)

	run := strconv.FormatInt(time.Now().UnixNano()%1_000_000_000, 36)
	topic, schema := "payments-"+run, "payments_demo_"+run
	dir, err := os.MkdirTemp("", "idemq-demo-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()

	pool, err := pgxpool.New(ctx, ep.dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := createSchema(ctx, pool, schema); err != nil {
		return fmt.Errorf("postgres at %s: %w (start the services with `make services-up`)", ep.dsn, err)
	}
	s := pgx.Identifier{schema}.Sanitize()
	for a := 1; a <= numAccounts; a++ {
		for _, tbl := range []string{"accounts", "naive_accounts"} {
			if _, err := pool.Exec(ctx, `insert into `+s+`.`+tbl+` values ($1, $2)`, fmt.Sprintf("acct-%d", a), startBalance); err != nil {
				return err
			}
		}
	}
	if err := kafkaadapter.EnsureTopics(ctx, ep.brokers, 3, topic); err != nil {
		return fmt.Errorf("kafka at %v: %w (start the services with `make services-up`)", ep.brokers, err)
	}
	msgs := stream()
	if err := produce(ctx, ep.brokers, topic, msgs); err != nil {
		return err
	}
	fmt.Printf("produced %d messages to %s (3 partitions, keyed by account)\n", len(msgs), topic)
	for _, m := range msgs {
		if m.note != "" {
			fmt.Printf("  trouble: %s\n", m.note)
		}
	}

	sides := map[string]*side{}
	for _, mode := range []string{"idemq", "naive"} {
		sd := &side{mode: mode, group: "payments-" + mode + "-" + run, events: filepath.Join(dir, mode+".jsonl")}
		sides[mode] = sd
		if err := sd.run(ctx, ep, topic, schema, *crashAfter); err != nil {
			return fmt.Errorf("%s consumer: %w", mode, err)
		}
	}
	return summarize(ctx, pool, schema, topic, msgs, sides)
}

func produce(ctx context.Context, brokers []string, topic string, msgs []streamMsg) error {
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: 10 * time.Millisecond}
	defer func() { _ = w.Close() }()
	for _, m := range msgs {
		b, _ := json.Marshal(m.p)
		if err := w.WriteMessages(ctx, kafka.Message{Key: []byte(m.p.Account), Value: b,
			Headers: []kafka.Header{{Key: wire.MessageIDHeader, Value: []byte(m.messageID)}}}); err != nil {
			return fmt.Errorf("produce: %w", err)
		}
	}
	return nil
}

// side is one consumer (idemq or naive) run as separate OS processes.
type side struct {
	mode, group, events string
	killed              bool
	procs               int
}

func (sd *side) command(ep endpoints, topic, schema string, crashAfter int) *exec.Cmd {
	self, _ := os.Executable()
	cmd := exec.Command(self, "consume", "-mode", sd.mode, "-topic", topic, "-group", sd.group,
		"-schema", schema, "-brokers", strings.Join(ep.brokers, ","), "-dsn", ep.dsn,
		"-events", sd.events, "-crash-after", strconv.Itoa(crashAfter))
	cmd.Stderr = os.Stderr
	sd.procs++
	return cmd
}

// run starts a consumer that kills itself after crashAfter committed
// deliveries, restarts it in the same group, waits until the group has
// committed the whole topic, then stops it with SIGTERM.
func (sd *side) run(ctx context.Context, ep endpoints, topic, schema string, crashAfter int) error {
	first := sd.command(ep, topic, schema, crashAfter)
	fmt.Printf("[%s] consumer process 1 started; it will be SIGKILLed after %d committed deliveries\n", sd.mode, crashAfter)
	if err := first.Start(); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- first.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
				sd.killed = true
			}
		}
		if !sd.killed {
			return fmt.Errorf("process 1 ended without the injected SIGKILL: %v", err)
		}
	case <-wctx.Done():
		_ = first.Process.Kill()
		return errors.New("process 1 did not reach the crash point in 90s")
	}
	fmt.Printf("[%s] process 1 died of SIGKILL; restarting in group %s\n", sd.mode, sd.group)

	second := sd.command(ep, topic, schema, 0)
	if err := second.Start(); err != nil {
		return err
	}
	stop := func() { _ = second.Process.Signal(syscall.SIGTERM) }
	defer func() { _ = second.Process.Kill() }()
	for {
		lag, err := kafkaadapter.GroupLag(wctx, ep.brokers, sd.group, topic)
		if err == nil && lag == 0 {
			break
		}
		select {
		case <-wctx.Done():
			stop()
			_ = second.Wait()
			return fmt.Errorf("group %s did not catch up in 90s (lag %d, err %v)", sd.group, lag, err)
		case <-time.After(300 * time.Millisecond):
		}
	}
	stop()
	if err := second.Wait(); err != nil {
		return fmt.Errorf("process 2 did not shut down cleanly on SIGTERM: %w", err)
	}
	fmt.Printf("[%s] process 2 caught up (group lag 0) and shut down gracefully\n", sd.mode)
	return nil
}

// tally reads an events file.
func tally(path string) (map[string]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	out := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var ev map[string]any
		if json.Unmarshal(sc.Bytes(), &ev) != nil {
			continue
		}
		switch ev["ev"] {
		case "outcome":
			out["outcome:"+fmt.Sprint(ev["outcome"])]++
			if by, _ := ev["by"].(string); by != "" {
				out[fmt.Sprint(ev["outcome"])+":"+by]++
			}
		default:
			out[fmt.Sprint(ev["ev"])]++
		}
	}
	return out, sc.Err()
}

func summarize(ctx context.Context, pool *pgxpool.Pool, schema, topic string, msgs []streamMsg, sides map[string]*side) error {
	s := pgx.Identifier{schema}.Sanitize()
	// Expected: each of the 24 payments applied once with its first amount.
	want := map[string]Payment{}
	wantBal := map[string]int64{}
	for i := 1; i <= numAccounts; i++ {
		wantBal[fmt.Sprintf("acct-%d", i)] = startBalance
	}
	for _, m := range msgs {
		if _, seen := want[m.p.PaymentID]; seen || m.p.Amount <= 0 {
			continue
		}
		want[m.p.PaymentID] = m.p
		wantBal[m.p.Account] -= m.p.Amount
	}

	type stats struct {
		rows, distinct, extraMoney int64
		balancesOK                 bool
		wrongAmount                int
	}
	read := func(payTbl, accTbl string) (stats, error) {
		var st stats
		rows, err := pool.Query(ctx, `select payment_id, amount from `+s+`.`+payTbl)
		if err != nil {
			return st, err
		}
		seen := map[string]bool{}
		for rows.Next() {
			var id string
			var amt int64
			if err := rows.Scan(&id, &amt); err != nil {
				return st, err
			}
			st.rows++
			if seen[id] {
				st.extraMoney += amt
			} else if w, ok := want[id]; !ok || w.Amount != amt {
				st.wrongAmount++
			}
			seen[id] = true
		}
		if err := rows.Err(); err != nil {
			return st, err
		}
		st.distinct = int64(len(seen))
		st.balancesOK = true
		bal, err := pool.Query(ctx, `select account, balance from `+s+`.`+accTbl)
		if err != nil {
			return st, err
		}
		for bal.Next() {
			var a string
			var b int64
			if err := bal.Scan(&a, &b); err != nil {
				return st, err
			}
			if wantBal[a] != b {
				st.balancesOK = false
			}
		}
		return st, bal.Err()
	}
	is, err := read("payments", "accounts")
	if err != nil {
		return err
	}
	ns, err := read("naive_payments", "naive_accounts")
	if err != nil {
		return err
	}
	ie, err := tally(sides["idemq"].events)
	if err != nil {
		return err
	}
	ne, err := tally(sides["naive"].events)
	if err != nil {
		return err
	}
	dl := map[string]int{}
	rows, err := pool.Query(ctx, `select reason, count(*) from `+s+`.dead_letters group by reason`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var r string
		var n int
		if err := rows.Scan(&r, &n); err != nil {
			return err
		}
		dl[r] = n
	}
	var flakyAttempts int
	_ = pool.QueryRow(ctx, `select attempts from `+s+`.consumption_records where business_key = $1`, FlakyPayment).Scan(&flakyAttempts)

	delivered := func(ev map[string]int) int {
		n := 0
		for k, v := range ev {
			if strings.HasPrefix(k, "outcome:") && k != "outcome:retry" {
				n += v
			}
		}
		return n
	}
	yesno := func(b bool) string {
		if b {
			return "yes"
		}
		return "NO"
	}
	fmt.Printf("\n=== idemq redelivery demo: Kafka (topic %s, schema %s) ===\n", topic, schema)
	fmt.Printf("stream: %d messages = %d payments + producer retry + re-send + conflicting payload + poison\n\n", len(msgs), numPayments)
	row := func(label string, a, b any) { fmt.Printf("%-42s %-14v %v\n", label, a, b) }
	row("", "with idemq", "naive")
	row("consumer processes (first one SIGKILLed)", sides["idemq"].procs, sides["naive"].procs)
	row("deliveries handled (incl. replays)", delivered(ie), ne["naive_applied"]+ne["naive_error"])
	row("handler runs", ie["handler"], ne["naive_applied"]+ne["naive_error"])
	row("retries in place (transient failure)", ie["outcome:retry"], "-")
	row("duplicates skipped by message ID", ie["duplicate:message_id"], 0)
	row("duplicates skipped by business key", ie["duplicate:business_key"], 0)
	row("conflicts (not applied, dead-lettered)", ie["outcome:conflict"], 0)
	row("dead letters (poison + conflict)", dl[dedup.ReasonPermanentError]+dl[dedup.ReasonPayloadConflict], "0 (poison dropped)")
	row("payment rows / distinct payments", fmt.Sprintf("%d / %d", is.rows, is.distinct), fmt.Sprintf("%d / %d", ns.rows, ns.distinct))
	row("double-applied money (cents)", is.extraMoney, ns.extraMoney)
	row("balances equal expected sums", yesno(is.balancesOK), yesno(ns.balancesOK))

	var failed []string
	check := func(ok bool, what string) {
		if !ok {
			failed = append(failed, what)
		}
	}
	check(sides["idemq"].killed, "the idemq consumer was SIGKILLed between commit and ack")
	check(is.rows == int64(len(want)) && is.distinct == int64(len(want)), fmt.Sprintf("each of the %d payments applied exactly once", len(want)))
	check(is.wrongAmount == 0, "no payment applied with a conflicting amount")
	check(is.balancesOK, "balances equal the expected sums")
	// m-09 came back with its business key (p-09) and another amount: one
	// intent, two payloads.
	check(dl[dedup.ReasonPayloadConflict] == 1, "exactly one payload_conflict dead letter (m-09 with another amount)")
	check(len(dl) == 2, fmt.Sprintf("dead letters of two reasons only, got %v", dl))
	check(dl[dedup.ReasonPermanentError] == 1, "exactly one dead letter for the poison message")
	check(ie["duplicate:business_key"] >= 1, "the re-send was caught by business key")
	check(ie["duplicate:message_id"] >= 1, "the producer retry was caught by message ID")
	check(flakyAttempts == 2, "the transient failure of "+FlakyPayment+" succeeded on attempt 2")
	sort.Strings(failed)
	fmt.Println()
	if len(failed) > 0 {
		fmt.Println("INVARIANTS FAILED:")
		for _, f := range failed {
			fmt.Println("  -", f)
		}
		return errors.New("idemq invariants failed")
	}
	fmt.Printf("invariants (idemq): OK: every payment applied once, balances exact, %d dead letters kept, crash absorbed\n", dl[dedup.ReasonPermanentError]+dl[dedup.ReasonPayloadConflict])
	fmt.Printf("\nthe schema %s is kept for a look:\n  go run ./cmd/idemq dead-letters list --schema %s --scope %s\n  go run ./cmd/idemq inspect --schema %s --scope %s --message-id m-09\n  (drop it with: drop schema %s cascade)\n",
		schema, schema, sides["idemq"].group, schema, sides["idemq"].group, schema)
	return nil
}
