package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemq/idemq/broker/kafkaadapter"
)

var (
	buildOnce sync.Map // import path -> *builtBinary
)

type builtBinary struct {
	once sync.Once
	path string
	err  error
}

// buildExample builds a main package of this repository once per test run.
func buildExample(t testing.TB, pkg string) string {
	t.Helper()
	v, _ := buildOnce.LoadOrStore(pkg, &builtBinary{})
	b := v.(*builtBinary)
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "idemq-bin-")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, filepath.Base(pkg))
		started.addFunc(func(context.Context) error { return os.RemoveAll(dir) }) // TestMain removes it at the end
		out, err := exec.Command("go", "build", "-o", b.path, pkg).CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// paymentsProc runs examples/payments consume as a separate OS process.
type paymentsProc struct {
	cmd    *exec.Cmd
	events string
}

func startPayments(t testing.TB, bin, topic, group, schema string, crashAfter int, extra ...string) *paymentsProc {
	t.Helper()
	events := filepath.Join(t.TempDir(), "events.jsonl")
	args := append([]string{"consume", "-topic", topic, "-group", group, "-schema", schema,
		"-brokers", strings.Join(kafkaBrokers(t), ","), "-dsn", postgresDSN(t),
		"-events", events, "-crash-after", fmt.Sprint(crashAfter), "-commit-every", "3"}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &paymentsProc{cmd: cmd, events: events}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return p
}

// waitKilled waits until the process died of the injected SIGKILL.
func (p *paymentsProc) waitKilled(t testing.TB) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("process ended without SIGKILL: %v", err)
		}
		if ws := ee.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("process ended with %v, want SIGKILL", err)
		}
	case <-time.After(90 * time.Second):
		t.Fatal("process did not reach the crash point in 90s")
	}
}

// stop sends SIGTERM and expects a clean exit.
func (p *paymentsProc) stop(t testing.TB) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("consumer did not exit cleanly on SIGTERM: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("consumer did not exit 60s after SIGTERM")
	}
}

// events counts the process's event lines: "handler", "outcome:<o>",
// "<o>:<matched by>".
func (p *paymentsProc) eventCounts(t testing.TB) map[string]int {
	t.Helper()
	f, err := os.Open(p.events)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]int{}
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var ev struct{ Ev, Outcome, By string }
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("event line %q: %v", sc.Text(), err)
		}
		if ev.Ev == "outcome" {
			out["outcome:"+ev.Outcome]++
			if ev.By != "" {
				out[ev.Outcome+":"+ev.By]++
			}
			continue
		}
		out[ev.Ev]++
	}
	return out
}

type payment struct {
	PaymentID string `json:"payment_id"`
	Account   string `json:"account"`
	Amount    int64  `json:"amount"`
}

func producePayments(t testing.TB, topic string, ps []payment, ids []string) {
	t.Helper()
	var msgs []kmsg
	for i, p := range ps {
		b, _ := json.Marshal(p)
		msgs = append(msgs, kmsg{id: ids[i], payload: string(b)})
	}
	produce(t, topic, msgs...)
}

func lagOf(t testing.TB, group, topic string) int64 {
	t.Helper()
	lag, err := kafkaadapter.GroupLag(context.Background(), kafkaBrokers(t), group, topic)
	if err != nil {
		t.Fatal(err)
	}
	return lag
}

// S09 (Kafka): the consumer process is SIGKILLed after the transaction of
// m-300 commits and before the offset commit; after a restart in the same
// group m-300 is redelivered and acked with 0 handler calls. Variants run
// with the Redis fast path, kept or flushed before the restart.
func TestS09KafkaCrashAfterCommitBeforeAck(t *testing.T) {
	t.Parallel()
	for _, variant := range []string{"postgres-only", "redis-kept", "redis-flushed"} {
		t.Run(variant, func(t *testing.T) {
			t.Parallel()
			bin := buildExample(t, "github.com/idemq/idemq/examples/payments")
			e := setup(t, nil)
			topic, group := newTopic(t, 1), randomName("g-")
			var extra []string
			prefix := randomName("s09-")
			if variant != "postgres-only" {
				extra = []string{"-redis", redisAddress(t), "-redis-prefix", prefix}
			}
			producePayments(t, topic, []payment{{PaymentID: "p-300", Account: "acct-1", Amount: 300}}, []string{"m-300"})

			first := startPayments(t, bin, topic, group, e.schema, 1, extra...)
			first.waitKilled(t)
			if n := e.count(`select count(*) from ` + e.table("payments") + ` where payment_id = 'p-300'`); n != 1 {
				t.Fatalf("payment rows after the crash = %d, want 1 (committed before the kill)", n)
			}
			if lag := lagOf(t, group, topic); lag != 1 {
				t.Fatalf("group lag after the crash = %d, want 1 (offset not committed)", lag)
			}
			if variant == "redis-flushed" {
				flushFastPath(t, prefix)
			}

			second := startPayments(t, bin, topic, group, e.schema, 0, extra...)
			waitCaughtUp(t, group, topic)
			second.stop(t)
			ev := second.eventCounts(t)
			if ev["handler"] != 0 || ev["duplicate:message_id"] != 1 {
				t.Fatalf("after restart: events %v, want 0 handler calls and 1 duplicate by message ID", ev)
			}
			if n := e.count(`select count(*) from ` + e.table("payments")); n != 1 {
				t.Fatalf("payment rows = %d, want 1", n)
			}
			if r := e.record(group, "m-300"); r.Attempts != 1 || r.Status != "SUCCEEDED" {
				t.Fatalf("record = %+v, want SUCCEEDED attempts 1", r)
			}
		})
	}
}

// A real process killed with SIGKILL mid-stream (after a commit, before the
// offset commit) and restarted: every payment applied exactly once, none lost.
func TestKafkaCrashMidStreamNoDoubleEffectNothingLost(t *testing.T) {
	t.Parallel()
	bin := buildExample(t, "github.com/idemq/idemq/examples/payments")
	e := setup(t, nil)
	topic, group := newTopic(t, 3), randomName("g-")
	var ps []payment
	var ids []string
	want := map[string]int64{}
	for i := range 60 {
		p := payment{PaymentID: fmt.Sprintf("p-%03d", i), Account: fmt.Sprintf("acct-%d", i%5), Amount: int64(10 + i)}
		ps, ids = append(ps, p), append(ids, fmt.Sprintf("m-%03d", i))
		want[p.PaymentID] = p.Amount
		if i%4 == 0 { // producer retries: same message again
			ps, ids = append(ps, p), append(ids, fmt.Sprintf("m-%03d", i))
		}
	}
	producePayments(t, topic, ps, ids)

	first := startPayments(t, bin, topic, group, e.schema, 25)
	first.waitKilled(t)
	// The kill hit the window: some SUCCEEDED record lies at or above its
	// partition's committed offset (committed in Postgres, not acked).
	committed := committedOffsets(t, group, topic, 3)
	rows, err := e.pool.Query(e.ctx, `select source from `+e.table("consumption_records")+` where status = 'SUCCEEDED'`)
	if err != nil {
		t.Fatal(err)
	}
	unacked, done := 0, 0
	for rows.Next() {
		var src string
		var p int
		var off int64
		if err := rows.Scan(&src); err != nil {
			t.Fatal(err)
		}
		if _, err := fmt.Sscanf(src[strings.LastIndexByte(src[:strings.LastIndexByte(src, '/')], '/')+1:], "%d/%d", &p, &off); err != nil {
			t.Fatalf("source %q: %v", src, err)
		}
		done++
		if off >= committed[p] {
			unacked++
		}
	}
	if done < 20 || unacked == 0 {
		t.Fatalf("after the kill: %d SUCCEEDED records, %d of them above the committed offsets %v; want work committed but not acked", done, unacked, committed)
	}
	second := startPayments(t, bin, topic, group, e.schema, 0)
	waitCaughtUp(t, group, topic)
	second.stop(t)

	checkAppliedOnce(t, e, want)
	if c := e.count(`select count(*) from ` + e.table("consumption_records") + ` where status = 'SUCCEEDED' and attempts = 1`); c != len(want) {
		t.Fatalf("SUCCEEDED records with attempts 1 = %d, want %d", c, len(want))
	}
}

// Two consumer processes share a group over 3 partitions; one is SIGKILLed
// mid-stream, so the group rebalances and the survivor takes over its
// partitions from their last committed offsets (replaying what the dead one
// had committed in Postgres but not acked). Every payment is applied once,
// none is lost.
func TestKafkaRebalanceAfterKillExactlyOnce(t *testing.T) {
	t.Parallel()
	bin := buildExample(t, "github.com/idemq/idemq/examples/payments")
	e := setup(t, nil)
	topic, group := newTopic(t, 3), randomName("g-")
	var ps []payment
	var ids []string
	want := map[string]int64{}
	for i := range 300 {
		p := payment{PaymentID: fmt.Sprintf("p-%03d", i), Account: fmt.Sprintf("acct-%d", i%7), Amount: int64(100 + i)}
		want[p.PaymentID] = p.Amount
		ps, ids = append(ps, p), append(ids, fmt.Sprintf("m-%03d", i))
		if i%5 == 0 { // an application re-send: new message ID, same payment
			ps, ids = append(ps, p), append(ids, fmt.Sprintf("m-%03d-resend", i))
		}
	}
	producePayments(t, topic, ps, ids)

	// The victim starts alone (it owns every partition), the survivor joins
	// once the victim is consuming (a rebalance splits the partitions), then
	// the victim is killed after 40 commits (a second rebalance hands its
	// partitions to the survivor after its session times out).
	victim := startPayments(t, bin, topic, group, e.schema, 40)
	eventually(t, 60*time.Second, "the victim to consume", func() bool { return victim.eventCounts(t)["handler"] > 0 })
	survivor := startPayments(t, bin, topic, group, e.schema, 0)
	victim.waitKilled(t)
	waitCaughtUp(t, group, topic)
	survivor.stop(t)

	checkAppliedOnce(t, e, want)
	ev := survivor.eventCounts(t)
	if ev["duplicate:business_key"] == 0 && victim.eventCounts(t)["duplicate:business_key"] == 0 {
		t.Fatal("no re-send was caught by business key")
	}
	t.Logf("victim: %v; survivor: %v", victim.eventCounts(t), ev)
}

// checkAppliedOnce asserts that the payments table holds each wanted payment
// exactly once, with its amount, and nothing else.
func checkAppliedOnce(t testing.TB, e *env, want map[string]int64) {
	t.Helper()
	rows, err := e.pool.Query(e.ctx, `select payment_id, amount from `+e.table("payments"))
	if err != nil {
		t.Fatal(err)
	}
	got, n := map[string]int64{}, 0
	for rows.Next() {
		var id string
		var amt int64
		if err := rows.Scan(&id, &amt); err != nil {
			t.Fatal(err)
		}
		got[id] = amt
		n++
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if n != len(want) || len(got) != len(want) {
		t.Fatalf("payment rows = %d (distinct %d), want %d, each exactly once", n, len(got), len(want))
	}
	for id, amt := range want {
		if got[id] != amt {
			t.Fatalf("payment %s = %d, want %d", id, got[id], amt)
		}
	}
}
