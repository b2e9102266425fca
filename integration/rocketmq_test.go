package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/apache/rocketmq-client-go/v2/rlog"
	"github.com/idemq/idemq/broker/rocketmqadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/wire"
	"github.com/jackc/pgx/v5"
)

func init() {
	if os.Getenv("ROCKETMQ_GO_LOG_LEVEL") == "" {
		rlog.SetLogLevel("error")
	}
}

// ---------------------------------------------------------------------------
// Helpers.

// rmqEndpoints returns the name servers and the broker address.
func rmqEndpoints(t testing.TB) ([]string, string) {
	t.Helper()
	ns := strings.Split(rocketmqNamesrv(t), ",")
	broker := os.Getenv("TEST_ROCKETMQ_BROKER")
	if broker == "" {
		broker = "127.0.0.1:10911"
	}
	return ns, broker
}

// rmqTopic creates a fresh topic (4 queues) and the retry topics of groups.
func rmqTopic(t testing.TB, prefix string, groups ...string) string {
	t.Helper()
	ns, broker := rmqEndpoints(t)
	topic := randomName(prefix)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := rocketmqadapter.EnsureTopic(ctx, ns, broker, topic, 4); err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		if err := rocketmqadapter.EnsureRetryTopic(ctx, ns, broker, g); err != nil {
			t.Fatal(err)
		}
	}
	return topic
}

func rmqProducer(t testing.TB) rocketmq.Producer {
	t.Helper()
	ns, _ := rmqEndpoints(t)
	p, err := rocketmq.NewProducer(
		producer.WithNsResolver(primitive.NewPassthroughResolver(ns)),
		producer.WithInstanceName(rocketmqadapter.InstanceName("it-producer")),
		producer.WithGroupName(randomName("it-producer-")),
		producer.WithRetry(2),
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown() })
	return p
}

// rmqSend sends one message (a single SendSync, so it gets a UNIQ_KEY) and
// returns its UNIQ_KEY.
func rmqSend(t testing.TB, p rocketmq.Producer, topic string, body []byte, messageID string, keys ...string) string {
	t.Helper()
	id, err := rmqTrySend(p, topic, body, messageID, keys...)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func rmqTrySend(p rocketmq.Producer, topic string, body []byte, messageID string, keys ...string) (string, error) {
	m := primitive.NewMessage(topic, body)
	if len(keys) > 0 {
		m.WithKeys(keys)
	}
	if messageID != "" {
		m.WithProperty(wire.MessageIDHeader, messageID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := p.SendSync(ctx, m)
	if err != nil {
		return "", err
	}
	if res.Status != primitive.SendOK || res.MsgID == "" {
		return "", fmt.Errorf("send: %+v", res)
	}
	return res.MsgID, nil
}

// rmqObserved is one delivery seen by a Listener's Observe hook.
type rmqObserved struct {
	d   consumer.Delivery
	res dedup.Result
	err error
}

type rmqObserver struct {
	mu   sync.Mutex
	seen []rmqObserved
}

func (o *rmqObserver) observe(d consumer.Delivery, res dedup.Result, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen = append(o.seen, rmqObserved{d: d, res: res, err: err})
}

func (o *rmqObserver) all() []rmqObserved {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]rmqObserved(nil), o.seen...)
}

// rmqConsumer builds the runtime of a RocketMQ listener.
func rmqConsumer(t testing.TB, cc consumer.Config) *consumer.Consumer {
	t.Helper()
	c, err := consumer.New(cc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// rmqPushConsumer starts an in-process adapter consumer running cc (Scope
// defaults to cfg.Group) and reading topic from the first offset; it is shut
// down at the end of the test.
func rmqPushConsumer(t testing.TB, cc consumer.Config, cfg rocketmqadapter.Config) *rocketmqadapter.PushConsumer {
	t.Helper()
	ns, _ := rmqEndpoints(t)
	cfg.NameServers = ns
	cfg.ClientOptions = append(cfg.ClientOptions, rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset))
	if cc.Scope == "" {
		cc.Scope = cfg.Group
	}
	pc, err := rocketmqadapter.NewPushConsumer(rmqConsumer(t, cc), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pc.Shutdown(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return pc
}

// rmqExt builds a received message as the client hands it to a listener.
func rmqExt(topic, uniq, offsetMsgID, keys string, queue primitive.MessageQueue, offset int64, reconsume int32, body string) *primitive.MessageExt {
	m := &primitive.MessageExt{Message: primitive.Message{Topic: topic, Body: []byte(body)},
		OffsetMsgId: offsetMsgID, QueueOffset: offset, ReconsumeTimes: reconsume}
	if uniq != "" {
		m.WithProperty(primitive.PropertyUniqueClientMessageIdKeyIndex, uniq)
		m.MsgId = uniq
	} else {
		m.MsgId = offsetMsgID
	}
	if keys != "" {
		m.WithProperty(primitive.PropertyKeys, keys)
	}
	q := queue
	m.Queue = &q
	return m
}

// rmqRetryCopy turns m into the copy the broker stores in %RETRY%<group>.
func rmqRetryCopy(m *primitive.MessageExt, group, offsetMsgID string, offset int64, reconsume int32) *primitive.MessageExt {
	c := &primitive.MessageExt{Message: primitive.Message{Topic: "%RETRY%" + group, Body: m.Body},
		MsgId: m.MsgId, OffsetMsgId: offsetMsgID, QueueOffset: offset, ReconsumeTimes: reconsume}
	c.WithProperties(m.GetProperties())
	c.WithProperty(primitive.PropertyRetryTopic, m.Topic)
	c.Queue = &primitive.MessageQueue{Topic: "%RETRY%" + group, BrokerName: "broker-a", QueueId: 0}
	return c
}

func rmqListener(t testing.TB, e *env, scope string, h pgstore.Handler, obs *rmqObserver) *rocketmqadapter.Listener {
	t.Helper()
	l, err := rocketmqadapter.NewListener(rmqConsumer(t, consumer.Config{Scope: scope, Store: e.store, Handler: h, BusinessKey: rocketmqadapter.BusinessKeyFromKeys}), rocketmqadapter.Config{
		Observe: obs.observe,
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// ---------------------------------------------------------------------------
// The consumer process: examples/rocketmq-orders built once per test.

// rmqOrdersEvent is one JSON line printed by `rocketmq-orders consume`.
type rmqOrdersEvent struct {
	Ev        string `json:"ev"`
	Mode      string `json:"mode"`
	PID       int    `json:"pid"`
	Order     string `json:"order"`
	MessageID string `json:"mid"`
	Attempt   int    `json:"attempt"`
	Reconsume int32  `json:"reconsume"`
	Outcome   string `json:"outcome"`
	By        string `json:"by"`
	Status    string `json:"status"`
	Attempts  int    `json:"attempts"`
	Ack       bool   `json:"ack"`
	Source    string `json:"source"`
	Err       string `json:"err"`
}

// rmqBuildOrders builds examples/rocketmq-orders once per test run.
func rmqBuildOrders(t testing.TB) string {
	return buildExample(t, "github.com/idemq/idemq/examples/rocketmq-orders")
}

type rmqOrdersProc struct {
	t      testing.TB
	name   string
	cmd    *exec.Cmd
	eof    chan struct{}
	logf   *os.File
	mu     sync.Mutex
	events []rmqOrdersEvent
	done   bool
}

// rmqStartOrders runs `bin consume args...` as a separate OS process and waits
// until its consumer has started.
func rmqStartOrders(t testing.TB, bin, name string, args ...string) *rmqOrdersProc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"consume"}, args...)...)
	cmd.Env = append(os.Environ(), "TEST_POSTGRES_DSN="+postgresDSN(t), "TEST_ROCKETMQ_NAMESRV="+rocketmqNamesrv(t),
		"IDEMQ_FINGERPRINT_SECRET=integration-test-secret-0123456789")
	logf, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &rmqOrdersProc{t: t, name: name, cmd: cmd, eof: make(chan struct{}), logf: logf}
	go func() {
		defer close(p.eof)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var e rmqOrdersEvent
			if json.Unmarshal(sc.Bytes(), &e) == nil {
				p.mu.Lock()
				p.events = append(p.events, e)
				p.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		p.stop(syscall.SIGKILL)
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("%s (pid %d) stderr tail:\n%s", name, cmd.Process.Pid, b)
		}
	})
	p.waitFor(60*time.Second, "ready", func(e rmqOrdersEvent) bool { return e.Ev == "ready" }, 1)
	return p
}

func (p *rmqOrdersProc) snapshot() []rmqOrdersEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]rmqOrdersEvent(nil), p.events...)
}

func (p *rmqOrdersProc) count(match func(rmqOrdersEvent) bool) int {
	n := 0
	for _, e := range p.snapshot() {
		if match(e) {
			n++
		}
	}
	return n
}

func (p *rmqOrdersProc) waitFor(d time.Duration, what string, match func(rmqOrdersEvent) bool, n int) {
	p.t.Helper()
	eventually(p.t, d, p.name+": "+what, func() bool {
		select {
		case <-p.eof:
			p.t.Fatalf("%s exited while waiting for %s", p.name, what)
		default:
		}
		return p.count(match) >= n
	})
}

// stop signals the process and reaps it once its output is read.
func (p *rmqOrdersProc) stop(sig syscall.Signal) {
	p.mu.Lock()
	if p.done {
		p.mu.Unlock()
		return
	}
	p.done = true
	p.mu.Unlock()
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.eof:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.eof
	}
	_ = p.cmd.Wait()
	_ = p.logf.Close()
}

func rmqOrderBody(id string, amount int64) []byte {
	b, _ := json.Marshal(map[string]any{"order_id": id, "customer": "c-1", "amount_cents": amount})
	return b
}

// ---------------------------------------------------------------------------
// S06: a %RETRY% copy arrives while the first attempt runs.

func TestRocketMQS06ResendWhileFirstAttemptRuns(t *testing.T) {
	t.Parallel()
	// The copy reaches the same listener (serialized in process) or another
	// instance's listener (serialized only by Postgres' row lock).
	for _, where := range []string{"same instance", "other instance"} {
		t.Run(where, func(t *testing.T) {
			t.Parallel()
			testS06Resend(t, where == "other instance")
		})
	}
}

func testS06Resend(t *testing.T, otherInstance bool) {
	e := setup(t, nil)
	tbl := e.paymentsTable()
	var calls, running, maxRunning atomic.Int64
	started := make(chan struct{})
	h := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		if calls.Add(1) == 1 {
			close(started)
		}
		n := running.Add(1)
		defer running.Add(-1)
		for {
			cur := maxRunning.Load()
			if n <= cur || maxRunning.CompareAndSwap(cur, n) {
				break
			}
		}
		time.Sleep(5 * time.Second) // a long first attempt: the copy arrives meanwhile
		_, err := tx.Exec(ctx, `insert into `+tbl+` (payment_id, amount) values ($1, 9)`, m.Identity.BusinessKey)
		return err
	}
	obs := &rmqObserver{}
	l := rmqListener(t, e, "billing", h, obs)
	l2 := l
	if otherInstance {
		l2 = rmqListener(t, e, "billing", h, obs)
	}
	first := rmqExt("invoices", "U1", "O1", "invoice-9", primitive.MessageQueue{Topic: "invoices", BrokerName: "broker-a", QueueId: 2}, 40, 0, `{"invoice":"invoice-9"}`)
	copy1 := rmqRetryCopy(first, "billing", "O2", 0, 1)

	// What orders the two answers is durable state, not clocks: the copy's
	// goroutine reads the record right after its answer (an observer's
	// timestamp, taken after the first commit, can come later than the
	// copy's answer on a busy machine, though the record was already
	// SUCCEEDED).
	type ret struct {
		r rmqconsumer.ConsumeResult
	}
	firstDone, copyDone := make(chan ret, 1), make(chan ret, 1)
	go func() {
		r, _ := l.Consume(context.Background(), first)
		firstDone <- ret{r}
	}()
	<-started // the first attempt runs
	go func() {
		r, _ := l2.Consume(context.Background(), copy1)
		// The copy may only be acknowledged once the first outcome is
		// durable: the record must be SUCCEEDED right now.
		rec, err := e.store.Lookup(e.ctx, "billing", "U1")
		if r == rmqconsumer.ConsumeSuccess && (err != nil || rec.Status != dedup.StatusSucceeded) {
			t.Errorf("copy acknowledged while the record is %s (%v)", rec.Status, err)
		}
		copyDone <- ret{r}
	}()
	f, c := <-firstDone, <-copyDone
	if f.r != rmqconsumer.ConsumeSuccess || c.r != rmqconsumer.ConsumeSuccess {
		t.Fatalf("results: first %v, copy %v; want both ConsumeSuccess", f.r, c.r)
	}
	if maxRunning.Load() != 1 || calls.Load() != 1 {
		t.Fatalf("handler runs %d, at most %d at once; want 1 and 1", calls.Load(), maxRunning.Load())
	}
	seen := obs.all()
	if len(seen) != 2 {
		t.Fatalf("observed %d deliveries", len(seen))
	}
	for _, o := range seen {
		if o.d.Message.Identity.MessageID != "U1" {
			t.Fatalf("identity %s, want U1 for both copies", o.d.Message.Identity)
		}
		switch o.d.Message.ReconsumeTimes {
		case 0:
			if o.res.Outcome != dedup.OutcomeProcessed {
				t.Fatalf("first: %+v", o.res)
			}
		case 1:
			if o.res.Outcome != dedup.OutcomeDuplicate || o.res.MatchedBy != dedup.ByMessageID || o.res.HandlerCalled {
				t.Fatalf("copy: %+v", o.res)
			}
			if o.d.Position != "rocketmq:%RETRY%billing/broker-a/0/0" || o.d.Message.Topic != "invoices" {
				t.Fatalf("copy position %s topic %s", o.d.Position, o.d.Message.Topic)
			}
		}
	}
	if n := e.count(`select count(*) from ` + tbl); n != 1 {
		t.Fatalf("rows = %d, want 1", n)
	}
	if r := e.record("billing", "U1"); r.Status != dedup.StatusSucceeded || r.Attempts != 1 {
		t.Fatalf("record %s attempts %d, want SUCCEEDED 1", r.Status, r.Attempts)
	}
}

// S06 variant: the first attempt fails and rolls back; the waiting copy
// then runs the handler.
func TestRocketMQS06FirstAttemptFailsCopyProcesses(t *testing.T) {
	t.Parallel()
	for _, where := range []string{"same instance", "other instance"} {
		t.Run(where, func(t *testing.T) {
			t.Parallel()
			testS06FirstFails(t, where == "other instance")
		})
	}
}

func testS06FirstFails(t *testing.T, otherInstance bool) {
	e := setup(t, nil)
	tbl := e.paymentsTable()
	var calls, running, maxRunning atomic.Int64
	started := make(chan struct{})
	h := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		n := calls.Add(1)
		if n == 1 {
			close(started)
		}
		for r := running.Add(1); ; {
			m := maxRunning.Load()
			if r <= m || maxRunning.CompareAndSwap(m, r) {
				break
			}
		}
		defer running.Add(-1)
		if _, err := tx.Exec(ctx, `insert into `+tbl+` (payment_id, amount) values ($1, 9)`, m.Identity.BusinessKey); err != nil {
			return err
		}
		if n == 1 {
			time.Sleep(5 * time.Second) // a long first attempt: the copy arrives meanwhile
			return errors.New("billing provider timeout")
		}
		return nil
	}
	obs := &rmqObserver{}
	l := rmqListener(t, e, "billing", h, obs)
	l2 := l
	if otherInstance {
		l2 = rmqListener(t, e, "billing", h, obs)
	}
	first := rmqExt("invoices", "U1", "O1", "invoice-9", primitive.MessageQueue{Topic: "invoices", BrokerName: "broker-a", QueueId: 2}, 40, 0, `{"invoice":"invoice-9"}`)
	copy1 := rmqRetryCopy(first, "billing", "O2", 0, 1)
	firstDone, copyDone := make(chan rmqconsumer.ConsumeResult, 1), make(chan rmqconsumer.ConsumeResult, 1)
	go func() { r, _ := l.Consume(context.Background(), first); firstDone <- r }()
	<-started // the first attempt runs
	go func() { r, _ := l2.Consume(context.Background(), copy1); copyDone <- r }()
	if r := <-firstDone; r != rmqconsumer.ConsumeRetryLater {
		t.Fatalf("failed first attempt answered %v, want ConsumeRetryLater", r)
	}
	if r := <-copyDone; r != rmqconsumer.ConsumeSuccess {
		t.Fatalf("copy answered %v", r)
	}
	if calls.Load() != 2 || maxRunning.Load() != 1 {
		t.Fatalf("handler runs %d (max %d at once), want 2 one at a time", calls.Load(), maxRunning.Load())
	}
	if n := e.count(`select count(*) from ` + tbl); n != 1 {
		t.Fatalf("rows = %d, want 1", n)
	}
	r := e.record("billing", "U1")
	if r.Status != dedup.StatusSucceeded || r.Attempts != 2 || r.ReconsumeTimes != 1 {
		t.Fatalf("record %s attempts %d reconsume %d, want SUCCEEDED 2 1", r.Status, r.Attempts, r.ReconsumeTimes)
	}
}

// ---------------------------------------------------------------------------
// S07: per-copy storage IDs.

func TestRocketMQS07PerCopyStorageIDs(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	tbl := e.paymentsTable()
	var calls atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		calls.Add(1)
		_, err := tx.Exec(ctx, `insert into `+tbl+` (payment_id, amount) values ($1, 77)`, m.Identity.BusinessKey)
		return err
	}
	obs := &rmqObserver{}
	l := rmqListener(t, e, "refund-svc", h, obs)
	body := `{"refund":"refund-77","amount":77}`
	c1 := rmqExt("refunds", "U2", "O1", "refund-77", primitive.MessageQueue{Topic: "refunds", BrokerName: "broker-a", QueueId: 1}, 7, 0, body)
	c2 := rmqRetryCopy(c1, "refund-svc", "O2", 3, 1)
	c3 := rmqExt("refunds", "", "O3", "refund-77", primitive.MessageQueue{Topic: "refunds", BrokerName: "broker-a", QueueId: 3}, 11, 0, body)
	for i, m := range []*primitive.MessageExt{c1, c2, c3} {
		if r, err := l.Consume(context.Background(), m); err != nil || r != rmqconsumer.ConsumeSuccess {
			t.Fatalf("copy %d: %v %v", i+1, r, err)
		}
	}
	seen := obs.all()
	if seen[0].d.Message.Identity.MessageID != "U2" || seen[1].d.Message.Identity.MessageID != "U2" {
		t.Fatalf("copies 1 and 2: identities %s, %s; want U2", seen[0].d.Message.Identity, seen[1].d.Message.Identity)
	}
	if id := seen[2].d.Message.Identity.MessageID; id == "O3" || id != "rocketmq:refunds/broker-a/3/11" {
		t.Fatalf("copy 3 identity %q: want the position, never the OffsetMsgId", id)
	}
	if seen[0].res.Outcome != dedup.OutcomeProcessed ||
		seen[1].res.Outcome != dedup.OutcomeDuplicate || seen[1].res.MatchedBy != dedup.ByMessageID || seen[1].res.HandlerCalled ||
		seen[2].res.Outcome != dedup.OutcomeDuplicate || seen[2].res.MatchedBy != dedup.ByBusinessKey || seen[2].res.HandlerCalled {
		t.Fatalf("outcomes: %+v / %+v / %+v", seen[0].res, seen[1].res, seen[2].res)
	}
	if calls.Load() != 1 {
		t.Fatalf("handler calls = %d, want 1", calls.Load())
	}
	if n := e.count(`select count(*) from ` + tbl); n != 1 {
		t.Fatalf("rows = %d, want 1", n)
	}
	for _, o := range []string{"O1", "O2", "O3"} {
		if _, err := e.store.Lookup(e.ctx, "refund-svc", o); !errors.Is(err, dedup.ErrNotFound) {
			t.Fatalf("a record under OffsetMsgId %s: %v", o, err)
		}
	}
	if n := e.count(`select count(*) from ` + e.table("consumption_records")); n != 1 {
		t.Fatalf("records = %d, want 1", n)
	}
}

// ---------------------------------------------------------------------------
// S08: a poison message, driven copy by copy, then re-driven.

func TestRocketMQS08PoisonMessage(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *pgstore.Config) { c.MaxAttempts = 4 })
	tbl := e.paymentsTable()
	var calls atomic.Int64
	var fixed atomic.Bool
	h := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		calls.Add(1)
		if _, err := tx.Exec(ctx, `insert into `+tbl+` (payment_id, amount) values ($1, 4)`, m.Identity.MessageID); err != nil {
			return err
		}
		if !fixed.Load() {
			return errors.New("address invalid")
		}
		return nil
	}
	obs := &rmqObserver{}
	l := rmqListener(t, e, "shipping", h, obs)
	orig := rmqExt("shipments", "U4", "O40", "", primitive.MessageQueue{Topic: "shipments", BrokerName: "broker-a", QueueId: 0}, 4, 0, `{"ship":"to nowhere"}`)
	for i := int32(0); i < 5; i++ {
		m := orig
		if i > 0 {
			m = rmqRetryCopy(orig, "shipping", fmt.Sprintf("O4%d", i), int64(i), i)
		}
		r, err := l.Consume(context.Background(), m)
		if err != nil {
			t.Fatal(err)
		}
		want := rmqconsumer.ConsumeRetryLater
		if i >= 3 { // the 4th attempt is final (dead letter), the 5th a stray copy
			want = rmqconsumer.ConsumeSuccess
		}
		if r != want {
			t.Fatalf("delivery with ReconsumeTimes %d answered %v, want %v", i, r, want)
		}
	}
	if calls.Load() != 4 {
		t.Fatalf("handler calls = %d, want 4", calls.Load())
	}
	seen := obs.all()
	if last := seen[4].res; last.Outcome != dedup.OutcomeDuplicate || last.HandlerCalled || last.Status != dedup.StatusFailedFinal {
		t.Fatalf("stray copy: %+v", last)
	}
	if seen[3].res.Outcome != dedup.OutcomeDeadLetter {
		t.Fatalf("4th: %+v", seen[3].res)
	}
	r := e.record("shipping", "U4")
	if r.Status != dedup.StatusFailedFinal || r.Attempts != 4 || r.ReconsumeTimes != 3 || !strings.Contains(r.LastError, "address invalid") {
		t.Fatalf("record = %+v", r)
	}
	if n := e.count(`select count(*) from ` + tbl); n != 0 {
		t.Fatalf("rows = %d, want 0", n)
	}
	dl := e.deadLetters("shipping")
	if len(dl) != 1 || dl[0].Reason != dedup.ReasonAttemptsExhausted || dl[0].Attempts != 4 || !strings.Contains(dl[0].Error, "address invalid") {
		t.Fatalf("dead letters = %+v", dl)
	}
	// Operator re-drive after the address is fixed.
	if err := e.store.Redrive(e.ctx, "shipping", "U4"); err != nil {
		t.Fatal(err)
	}
	fixed.Store(true)
	if res, _ := l.Consume(context.Background(), rmqRetryCopy(orig, "shipping", "O45", 5, 5)); res != rmqconsumer.ConsumeSuccess {
		t.Fatalf("re-driven delivery: %v", res)
	}
	r = e.record("shipping", "U4")
	if r.Status != dedup.StatusSucceeded || r.Attempts != 5 || calls.Load() != 5 {
		t.Fatalf("after re-drive: record %s attempts %d, handler calls %d; want SUCCEEDED 5 5", r.Status, r.Attempts, calls.Load())
	}
	if n := e.count(`select count(*) from ` + tbl); n != 1 {
		t.Fatalf("rows after re-drive = %d, want 1", n)
	}
	if dl := e.deadLetters("shipping"); len(dl) != 1 || dl[0].RedrivenAt == nil {
		t.Fatalf("dead letter not stamped re-driven: %+v", dl)
	}
}

// A batch is acknowledged as a whole: one message needing a retry makes the
// whole batch come back, and the ones that succeeded are then duplicates.
func TestRocketMQBatchRetriesAsAWhole(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	tbl := e.paymentsTable()
	var calls atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		calls.Add(1)
		if m.Identity.MessageID == "B2" && m.Attempt == 1 {
			return errors.New("flaky")
		}
		_, err := tx.Exec(ctx, `insert into `+tbl+` (payment_id, amount) values ($1, 1)`, m.Identity.MessageID)
		return err
	}
	obs := &rmqObserver{}
	l := rmqListener(t, e, "batcher", h, obs)
	q := primitive.MessageQueue{Topic: "batch", BrokerName: "broker-a", QueueId: 0}
	batch := []*primitive.MessageExt{
		rmqExt("batch", "B1", "O1", "", q, 1, 0, "1"),
		rmqExt("batch", "B2", "O2", "", q, 2, 0, "2"),
		rmqExt("batch", "B3", "O3", "", q, 3, 0, "3"),
	}
	if r, _ := l.Consume(context.Background(), batch...); r != rmqconsumer.ConsumeRetryLater {
		t.Fatalf("batch with a failure: %v, want ConsumeRetryLater", r)
	}
	if calls.Load() != 3 {
		t.Fatalf("every message of the batch must be handled: %d calls", calls.Load())
	}
	var again []*primitive.MessageExt
	for i, m := range batch {
		again = append(again, rmqRetryCopy(m, "batcher", fmt.Sprintf("R%d", i), int64(i), 1))
	}
	if r, _ := l.Consume(context.Background(), again...); r != rmqconsumer.ConsumeSuccess {
		t.Fatalf("redelivered batch: %v", r)
	}
	seen := obs.all()[3:]
	if seen[0].res.Outcome != dedup.OutcomeDuplicate || seen[1].res.Outcome != dedup.OutcomeProcessed || seen[2].res.Outcome != dedup.OutcomeDuplicate {
		t.Fatalf("redelivered outcomes: %s %s %s", seen[0].res.Outcome, seen[1].res.Outcome, seen[2].res.Outcome)
	}
	if calls.Load() != 4 || e.count(`select count(*) from `+tbl) != 3 {
		t.Fatalf("calls %d rows %d, want 4 and 3", calls.Load(), e.count(`select count(*) from `+tbl))
	}
}

// ---------------------------------------------------------------------------
// Real broker.

// Fails twice, then succeeds, through the broker's real %RETRY% topic.
func TestRocketMQRetryThroughRetryTopic(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	tbl := e.paymentsTable()
	group := randomName("it-retry-")
	topic := rmqTopic(t, "it-retry-", group)
	var calls atomic.Int64
	var mu sync.Mutex
	var reconsumes []int32
	h := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		n := calls.Add(1)
		mu.Lock()
		reconsumes = append(reconsumes, m.ReconsumeTimes)
		mu.Unlock()
		if _, err := tx.Exec(ctx, `insert into `+tbl+` (payment_id, amount) values ($1, 1)`, m.Identity.MessageID); err != nil {
			return err
		}
		if n <= 2 {
			return fmt.Errorf("provider timeout %d", n)
		}
		return nil
	}
	obs := &rmqObserver{}
	rmqPushConsumer(t, consumer.Config{Store: e.store, Handler: h}, rocketmqadapter.Config{
		Group: group, Topic: topic, Observe: obs.observe,
	})
	uniq := rmqSend(t, rmqProducer(t), topic, []byte(`{"pay":1}`), "")
	eventually(t, 60*time.Second, "SUCCEEDED", func() bool {
		r, err := e.store.Lookup(e.ctx, group, uniq)
		return err == nil && r.Status == dedup.StatusSucceeded
	})
	time.Sleep(2 * time.Second) // no stray handler runs
	r := e.record(group, uniq)
	if r.Attempts != 3 || r.ReconsumeTimes != 2 || calls.Load() != 3 {
		t.Fatalf("record attempts %d reconsume %d, handler calls %d; want 3 2 3", r.Attempts, r.ReconsumeTimes, calls.Load())
	}
	mu.Lock()
	if fmt.Sprint(reconsumes) != "[0 1 2]" {
		t.Fatalf("ReconsumeTimes seen by the handler: %v, want [0 1 2]", reconsumes)
	}
	mu.Unlock()
	if n := e.count(`select count(*) from ` + tbl); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
	seen := obs.all()
	if len(seen) != 3 {
		t.Fatalf("deliveries = %d, want 3", len(seen))
	}
	for i, o := range seen {
		if o.d.Message.Identity.MessageID != uniq || o.d.Message.Topic != topic {
			t.Fatalf("delivery %d: identity %s topic %s", i, o.d.Message.Identity, o.d.Message.Topic)
		}
		retry := strings.HasPrefix(o.d.Position, "rocketmq:%RETRY%"+group+"/")
		if (i > 0) != retry {
			t.Fatalf("delivery %d from %s", i, o.d.Position)
		}
		want := []dedup.Outcome{dedup.OutcomeRetry, dedup.OutcomeRetry, dedup.OutcomeProcessed}[i]
		if o.res.Outcome != want || o.res.Attempts != i+1 {
			t.Fatalf("delivery %d: %s attempts %d", i, o.res.Outcome, o.res.Attempts)
		}
	}
	if len(e.deadLetters(group)) != 0 {
		t.Fatal("unexpected dead letter")
	}
}

// A poison message through the real broker stops at MaxAttempts: dead letter
// in Postgres, ConsumeSuccess, no further deliveries, nothing in %DLQ%.
func TestRocketMQPoisonThroughRetryTopic(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *pgstore.Config) { c.MaxAttempts = 3 })
	group := randomName("it-poison-")
	topic := rmqTopic(t, "it-poison-", group)
	var calls atomic.Int64
	h := func(context.Context, pgx.Tx, *dedup.Message) error {
		calls.Add(1)
		return errors.New("address invalid")
	}
	obs := &rmqObserver{}
	rmqPushConsumer(t, consumer.Config{Store: e.store, Handler: h}, rocketmqadapter.Config{Group: group, Topic: topic, Observe: obs.observe})
	uniq := rmqSend(t, rmqProducer(t), topic, []byte(`{"ship":"nowhere"}`), "")
	eventually(t, 60*time.Second, "FAILED_FINAL", func() bool {
		r, err := e.store.Lookup(e.ctx, group, uniq)
		return err == nil && r.Status == dedup.StatusFailedFinal
	})
	time.Sleep(4 * time.Second) // a retry would be back within ~2 s
	if calls.Load() != 3 || len(obs.all()) != 3 {
		t.Fatalf("handler calls %d, deliveries %d; want 3 and 3", calls.Load(), len(obs.all()))
	}
	if last := obs.all()[2].res; last.Outcome != dedup.OutcomeDeadLetter {
		t.Fatalf("last delivery: %+v", last)
	}
	if dl := e.deadLetters(group); len(dl) != 1 || dl[0].Reason != dedup.ReasonAttemptsExhausted {
		t.Fatalf("dead letters = %+v", dl)
	}
}

// An application re-send is a new message (new UNIQ_KEY): caught by the
// business key from Keys, or by a re-used message-id property.
func TestRocketMQProducerResendIsDuplicate(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	tbl := e.paymentsTable()
	group := randomName("it-resend-")
	topic := rmqTopic(t, "it-resend-", group)
	var calls atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		calls.Add(1)
		_, err := tx.Exec(ctx, `insert into `+tbl+` (payment_id, amount) values ($1, 1)`, m.Identity.BusinessKey)
		return err
	}
	obs := &rmqObserver{}
	rmqPushConsumer(t, consumer.Config{Store: e.store, Handler: h, BusinessKey: rocketmqadapter.BusinessKeyFromKeys}, rocketmqadapter.Config{
		Group: group, Topic: topic, Observe: obs.observe,
	})
	p := rmqProducer(t)
	u1 := rmqSend(t, p, topic, rmqOrderBody("order-1", 100), "", "order-1")
	eventually(t, 30*time.Second, "order-1", func() bool { return len(obs.all()) == 1 })
	u2 := rmqSend(t, p, topic, rmqOrderBody("order-1", 100), "", "order-1")
	eventually(t, 30*time.Second, "the re-send of order-1", func() bool { return len(obs.all()) == 2 })
	rmqSend(t, p, topic, rmqOrderBody("order-2", 200), "m-77", "order-2")
	eventually(t, 30*time.Second, "order-2", func() bool { return len(obs.all()) == 3 })
	rmqSend(t, p, topic, rmqOrderBody("order-2", 200), "m-77", "order-2")
	eventually(t, 30*time.Second, "the re-sends", func() bool { return len(obs.all()) == 4 })
	if u1 == u2 {
		t.Fatalf("a re-send got the same UNIQ_KEY %s", u1)
	}
	seen := obs.all()
	want := []struct {
		mid     string
		outcome dedup.Outcome
		by      dedup.MatchedBy
	}{{u1, dedup.OutcomeProcessed, ""}, {u2, dedup.OutcomeDuplicate, dedup.ByBusinessKey}, {"m-77", dedup.OutcomeProcessed, ""}, {"m-77", dedup.OutcomeDuplicate, dedup.ByMessageID}}
	for i, w := range want {
		o := seen[i]
		if o.d.Message.Identity.MessageID != w.mid || o.res.Outcome != w.outcome || o.res.MatchedBy != w.by {
			t.Fatalf("delivery %d: %s %s by %q; want %s %s by %q", i, o.d.Message.Identity, o.res.Outcome, o.res.MatchedBy, w.mid, w.outcome, w.by)
		}
	}
	if calls.Load() != 2 || e.count(`select count(*) from `+tbl) != 2 {
		t.Fatalf("handler calls %d, rows %d; want 2 and 2", calls.Load(), e.count(`select count(*) from `+tbl))
	}
}

// S09 (RocketMQ half): the consumer process is SIGKILLed after the
// transaction committed and before the broker ack; it restarts in the same
// group.
func TestRocketMQS09KillAfterCommitBeforeAck(t *testing.T) {
	t.Parallel()
	for _, variant := range []string{"postgres-only", "redis-kept", "redis-flushed"} {
		t.Run(variant, func(t *testing.T) {
			t.Parallel()
			testRocketMQS09(t, variant)
		})
	}
}

func testRocketMQS09(t *testing.T, variant string) {
	e := setup(t, nil)
	bin := rmqBuildOrders(t)
	group := randomName("it-s09-")
	topic := rmqTopic(t, "it-s09-", group)
	args := []string{"-topic", topic, "-group", group, "-schema", e.schema, "-max-attempts", "5"}
	prefix := randomName("rs09-")
	if variant != "postgres-only" {
		args = append(args, "-redis", redisAddress(t), "-redis-prefix", prefix)
	}
	p1 := rmqStartOrders(t, bin, "consumer-1", append(args, "-stall-order", "p-300")...)
	rmqSend(t, rmqProducer(t), topic, rmqOrderBody("p-300", 300), "m-300", "p-300")
	// The process answers nothing once the outcome of p-300 is durable.
	p1.waitFor(30*time.Second, "p-300 committed", func(ev rmqOrdersEvent) bool { return ev.Ev == "stalled" && ev.Order == "p-300" }, 1)
	if r := e.record(group, "m-300"); r.Status != dedup.StatusSucceeded || r.Attempts != 1 {
		t.Fatalf("before the kill: record %s attempts %d", r.Status, r.Attempts)
	}
	if n := e.count(`select count(*) from `+e.table("orders")+` where order_id = $1`, "p-300"); n != 1 {
		t.Fatalf("before the kill: rows = %d", n)
	}
	p1.stop(syscall.SIGKILL)
	if n := p1.count(func(ev rmqOrdersEvent) bool { return ev.Ev == "handler" }); n != 1 {
		t.Fatalf("handler runs before the kill = %d", n)
	}

	if variant == "redis-flushed" {
		flushFastPath(t, prefix)
	}
	p2 := rmqStartOrders(t, bin, "consumer-2", args...)
	p2.waitFor(60*time.Second, "the redelivery of m-300", func(ev rmqOrdersEvent) bool { return ev.Ev == "result" && ev.MessageID == "m-300" }, 1)
	time.Sleep(time.Second)
	results := []rmqOrdersEvent{}
	for _, ev := range p2.snapshot() {
		if ev.Ev == "result" {
			results = append(results, ev)
		}
	}
	if len(results) != 1 || results[0].Outcome != string(dedup.OutcomeDuplicate) || results[0].By != string(dedup.ByMessageID) || !results[0].Ack {
		t.Fatalf("after restart: results %+v, want one acked duplicate", results)
	}
	if n := p2.count(func(ev rmqOrdersEvent) bool { return ev.Ev == "handler" }); n != 0 {
		t.Fatalf("handler runs after restart = %d, want 0", n)
	}
	if n := e.count(`select count(*) from ` + e.table("orders")); n != 1 {
		t.Fatalf("rows = %d, want 1", n)
	}
	if r := e.record(group, "m-300"); r.Status != dedup.StatusSucceeded || r.Attempts != 1 {
		t.Fatalf("record %s attempts %d, want SUCCEEDED 1", r.Status, r.Attempts)
	}
}

// 200 messages, 30% duplicates (re-sends under the same message-id or only
// the same order ID), over two consumer processes of one group, one of them
// SIGKILLed mid-run: every intent applied exactly once, nothing lost. The
// process that receives the first order never acknowledges it (-stall-order),
// so its queue's committed offset stays behind everything it processes
// afterwards: the kill then leaves committed but unacknowledged work, which
// the survivor receives again.
func TestRocketMQTwoProcessesKillMidRun(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	bin := rmqBuildOrders(t)
	group := randomName("it-2p-")
	topic := rmqTopic(t, "it-2p-", group)

	const intents, dups = 140, 60
	type msg struct {
		order, mid string
	}
	var stream []msg
	for i := range intents {
		stream = append(stream, msg{order: fmt.Sprintf("o-%03d", i), mid: fmt.Sprintf("m-%03d", i)})
	}
	rng := rand.New(rand.NewPCG(7, 9))
	perOrder := map[string]int{}
	for i := range dups {
		j := rng.IntN(intents)
		m := msg{order: stream[j].order}
		if i%2 == 0 {
			m.mid = stream[j].mid // a relay republishing the same message
		}
		stream = append(stream, m)
	}
	rng.Shuffle(len(stream), func(i, j int) { stream[i], stream[j] = stream[j], stream[i] })
	for _, m := range stream {
		perOrder[m.order]++
	}
	stall := ""
	for _, m := range stream {
		if perOrder[m.order] == 1 {
			stall = m.order
			break
		}
	}

	args := []string{"-topic", topic, "-group", group, "-schema", e.schema, "-handler-delay", "60ms", "-goroutines", "4", "-stall-order", stall}
	procs := []*rmqOrdersProc{rmqStartOrders(t, bin, "consumer-a", args...), rmqStartOrders(t, bin, "consumer-b", args...)}
	time.Sleep(3 * time.Second) // both members own queues

	p := rmqProducer(t)
	go func() {
		for _, m := range stream {
			if _, err := rmqTrySend(p, topic, rmqOrderBody(m.order, 100), m.mid, m.order); err != nil {
				t.Errorf("send %s: %v", m.order, err)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	handled := func(pp *rmqOrdersProc) int {
		return pp.count(func(ev rmqOrdersEvent) bool { return ev.Ev == "handler" })
	}
	stalled := func(pp *rmqOrdersProc) bool {
		return pp.count(func(ev rmqOrdersEvent) bool { return ev.Ev == "stalled" }) > 0
	}
	eventually(t, 60*time.Second, "the first order and 50 handler runs", func() bool {
		return (stalled(procs[0]) || stalled(procs[1])) && handled(procs[0])+handled(procs[1]) >= 50
	})
	victim, survivor := procs[0], procs[1]
	if stalled(procs[1]) {
		victim, survivor = procs[1], procs[0]
	}
	victim.stop(syscall.SIGKILL)
	t.Logf("SIGKILLed %s (holding %s unacknowledged) after %d handler runs (%s: %d)", victim.name, stall, handled(victim), survivor.name, handled(survivor))
	if n := e.count(`select count(distinct order_id) from ` + e.table("orders")); n >= intents {
		t.Fatalf("the kill came too late: %d orders already applied", n)
	}

	eventually(t, 120*time.Second, "every intent applied", func() bool {
		return e.count(`select count(distinct order_id) from `+e.table("orders")) == intents
	})
	eventually(t, 60*time.Second, "the survivor to receive "+stall+" again", func() bool {
		return survivor.count(func(ev rmqOrdersEvent) bool { return ev.Ev == "result" && ev.Order == stall }) > 0
	})
	time.Sleep(3 * time.Second) // late copies
	if n := e.count(`select count(*) from ` + e.table("orders")); n != intents {
		t.Fatalf("order rows = %d for %d intents: some were applied twice", n, intents)
	}
	if n := e.count(`select count(*) from ` + e.table("consumption_records") + ` where status = 'SUCCEEDED'`); n != intents {
		t.Fatalf("SUCCEEDED records = %d, want %d", n, intents)
	}
	if n := e.count(`select count(*) from ` + e.table("consumption_records")); n != intents {
		t.Fatalf("records = %d, want %d", n, intents)
	}
	dupBy := map[string]int{}
	results := 0
	for _, pp := range procs {
		for _, ev := range pp.snapshot() {
			if ev.Ev != "result" {
				continue
			}
			results++
			switch ev.Outcome {
			case string(dedup.OutcomeDuplicate):
				dupBy[ev.By]++
			case string(dedup.OutcomeProcessed):
			default:
				t.Errorf("unexpected outcome %+v", ev)
			}
		}
	}
	if dupBy[string(dedup.ByMessageID)]+dupBy[string(dedup.ByBusinessKey)] < dups {
		t.Fatalf("duplicates skipped %v, want at least %d", dupBy, dups)
	}
	if results <= len(stream) {
		t.Fatalf("%d deliveries for %d messages: the kill replayed nothing", results, len(stream))
	}
	t.Logf("%d deliveries for %d messages; duplicates skipped %v; handler runs %s %d, %s %d",
		results, len(stream), dupBy, victim.name, handled(victim), survivor.name, handled(survivor))
}

// The broker's last copy (ReconsumeTimes = MaxReconsumeTimes) is never sent
// back to the broker, which would move it to %DLQ% out of Postgres' view: it
// is retried in place until its outcome is durable.
func TestRocketMQLastCopyRetriedInPlace(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *pgstore.Config) { c.MaxAttempts = 4 })
	tbl := e.paymentsTable()
	var calls atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		if calls.Add(1) <= 2 {
			return errors.New("downstream busy")
		}
		_, err := tx.Exec(ctx, `insert into `+tbl+` (payment_id, amount) values ($1, 1)`, m.Identity.MessageID)
		return err
	}
	l, err := rocketmqadapter.NewListener(rmqConsumer(t, consumer.Config{Scope: "ledger", Store: e.store, Handler: h, RetryInitial: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond}), rocketmqadapter.Config{
		MaxReconsumeTimes: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	last := rmqExt("ledger", "U9", "O9", "", primitive.MessageQueue{Topic: "%RETRY%ledger", BrokerName: "broker-a"}, 3, 3, "x")
	r, err := l.Consume(context.Background(), last)
	if err != nil || r != rmqconsumer.ConsumeSuccess {
		t.Fatalf("last copy answered %v (%v), want ConsumeSuccess after in-place retries", r, err)
	}
	if rec := e.record("ledger", "U9"); rec.Status != dedup.StatusSucceeded || rec.Attempts != 3 || calls.Load() != 3 {
		t.Fatalf("record %+v, calls %d; want SUCCEEDED after 3 attempts", rec, calls.Load())
	}
}

// shutdownRocketPush shuts a rocketmq-client-go push consumer down the way
// rocketmqadapter.PushConsumer.Shutdown does: suspended first, so that a
// rebalance the broker triggers (another group member leaving, often a
// parallel test's) skips it instead of racing the flag the client's Shutdown
// writes without a lock (a data race inside rocketmq-client-go, which fails
// every test running at the time under -race).
func shutdownRocketPush(pc rocketmq.PushConsumer) error {
	pc.Suspend()
	return pc.Shutdown()
}
