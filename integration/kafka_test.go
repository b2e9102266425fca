package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	composecli "github.com/compose-spec/compose-go/v2/cli"
	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

// S01: a stale copy of offset 10 after offset 12 was committed runs no
// handler, changes nothing, and no commit below 12 is sent.
func TestS01StaleMessageAfterRebalance(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	acct := e.table("accounts")
	e.exec(`create table ` + acct + ` (account text primary key, balance int not null, version int not null)`)
	e.exec(`insert into ` + acct + ` values ('acct-7', 0, 0)`)
	topic, group := newTopic(t, 1), randomName("g-")
	produce(t, topic, fillers(10)...)
	produce(t, topic,
		kmsg{id: "acct-7-v1", payload: `{"account":"acct-7","balance":50,"version":1}`},
		kmsg{id: "acct-7-v2", payload: `{"account":"acct-7","balance":80,"version":2}`})

	calls := map[string]int{}
	var callsMu = make(chan struct{}, 1)
	handler := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		callsMu <- struct{}{}
		calls[m.Identity.MessageID]++
		<-callsMu
		if isFiller(m) {
			return nil
		}
		var v struct {
			Account          string
			Balance, Version int
		}
		if err := json.Unmarshal(m.Payload, &v); err != nil {
			return dedup.Permanent(err)
		}
		_, err := tx.Exec(ctx, `update `+acct+` set balance = $2, version = $3 where account = $1`, v.Account, v.Balance, v.Version)
		return err
	}
	var counters consumer.Counters
	src := newSpySource(t, group, topic)
	r := startConsumer(t, consumer.Config{Scope: group, Store: e.store, Handler: handler, Metrics: &counters}, src)
	eventually(t, 60*time.Second, "offset 12 committed", func() bool { return groupOffset(t, group, topic) == 12 })

	before := counters.Get("duplicate")
	snapshot := e.record(group, "acct-7-v1")
	src.redeliver(t, 10)
	eventually(t, 30*time.Second, "the replay to be acked as a duplicate", func() bool { return counters.Get("duplicate") == before+1 })
	r.stop(t)

	if calls["acct-7-v1"] != 1 || calls["acct-7-v2"] != 1 {
		t.Fatalf("handler calls = %v, want 1 each (0 for the replay)", calls)
	}
	var bal, ver int
	if err := e.pool.QueryRow(e.ctx, `select balance, version from `+acct).Scan(&bal, &ver); err != nil || bal != 80 || ver != 2 {
		t.Fatalf("account = balance %d version %d (%v), want 80 / 2", bal, ver, err)
	}
	if r := e.record(group, "acct-7-v1"); !reflect.DeepEqual(r, snapshot) || r.Attempts != 1 || r.Status != dedup.StatusSucceeded || !strings.HasSuffix(r.Source, "/0/10") {
		t.Fatalf("record of offset 10 = %+v, want unchanged from %+v (attempts 1)", r, snapshot)
	}
	var last int64 = -1
	for _, c := range src.successfulCommits() {
		if c.offset < last {
			t.Fatalf("commit went backwards: offset %d after %d", c.offset, last)
		}
		last = c.offset
	}
	if got := groupOffset(t, group, topic); got != 12 {
		t.Fatalf("group offset = %d, want 12", got)
	}
}

// S02: nothing above a failing offset is committed until it is final; a
// failed commit call is retried; a redelivered 20 runs no handler.
func TestS02OffsetNeverAheadOfProcessing(t *testing.T) {
	t.Parallel()
	for _, permanent := range []bool{false, true} {
		t.Run(fmt.Sprintf("permanent=%v", permanent), func(t *testing.T) {
			t.Parallel()
			e := setup(t, func(c *pgstore.Config) { c.MaxAttempts = 3 })
			a := newApplier(e.appliesTable())
			a.fail = func(m *dedup.Message) error {
				if m.Identity.MessageID != "m-21" {
					return nil
				}
				if permanent {
					return dedup.Permanent(errors.New("address invalid"))
				}
				if m.Attempt <= 2 {
					return fmt.Errorf("transient failure %d", m.Attempt)
				}
				return nil
			}
			topic, group := newTopic(t, 1), randomName("g-")
			produce(t, topic, fillers(20)...)
			produce(t, topic, kmsg{id: "m-20", payload: "20"}, kmsg{id: "m-21", payload: "21"}, kmsg{id: "m-22", payload: "22"})

			src := newSpySource(t, group, topic)
			failedOnce := false
			// The first commit covering 20 reaches Kafka, but its call
			// returns a deadline error (the database had committed).
			src.failAfter = func(done []consumer.Delivery) error {
				for _, d := range done {
					if d.Offset >= 20 && !failedOnce {
						failedOnce = true
						return fmt.Errorf("commit after 20: %w", context.DeadlineExceeded)
					}
				}
				return nil
			}
			var violations []string
			src.beforeOK = func(done []consumer.Delivery) {
				for _, d := range done {
					if d.Offset < 21 {
						continue
					}
					r, err := e.store.Lookup(context.Background(), group, "m-21")
					if err != nil || (r.Status != dedup.StatusSucceeded && r.Status != dedup.StatusFailedFinal) {
						violations = append(violations, fmt.Sprintf("commit of offset %d while m-21 is %s", d.Offset, r.Status))
					}
					if dl, err := e.store.DeadLetters(context.Background(), group, 0, 10); permanent && (err != nil || len(dl) != 1) {
						violations = append(violations, fmt.Sprintf("offset moved past 21 before its dead letter (%d, %v)", len(dl), err))
					}
				}
			}
			var counters consumer.Counters
			r := startConsumer(t, consumer.Config{Scope: group, Store: e.store, Handler: a.handler(), Metrics: &counters}, src)
			eventually(t, 60*time.Second, "offset 23 committed", func() bool { return groupOffset(t, group, topic) == 23 })
			calls := a.total()
			src.redeliver(t, 20)
			eventually(t, 30*time.Second, "replayed 20 acked", func() bool { return counters.Get("duplicate:message_id") == 1 })
			r.stop(t)

			if !failedOnce {
				t.Fatal("the injected commit failure never happened")
			}
			if len(violations) > 0 {
				t.Fatalf("offset ahead of processing: %v", violations)
			}
			if a.total() != calls {
				t.Fatal("the redelivered 20 ran the handler")
			}
			rec := e.record(group, "m-21")
			rows := e.count(`select count(*) from ` + a.table + ` where message_id in ('m-20','m-21','m-22')`)
			if permanent {
				dl := e.deadLetters(group)
				if rec.Status != dedup.StatusFailedFinal || rec.Attempts != 1 || !strings.Contains(rec.LastError, "address invalid") ||
					len(dl) != 1 || dl[0].MessageID != "m-21" || rows != 2 || a.callsFor("m-21") != 1 {
					t.Fatalf("record %+v, dead letters %d, rows %d, calls %d", rec, len(dl), rows, a.callsFor("m-21"))
				}
				return
			}
			if rec.Status != dedup.StatusSucceeded || rec.Attempts != 3 || rows != 3 || a.callsFor("m-21") != 3 || counters.Get("retry") != 2 {
				t.Fatalf("record %+v, rows %d, calls %d, retries %d; want SUCCEEDED after 3 attempts, 3 rows", rec, rows, a.callsFor("m-21"), counters.Get("retry"))
			}
		})
	}
}

// S03: a consumer that processed 100–149 hands over: on a graceful close its
// commits are flushed (group offset 150); when its commits fail ("rebalance
// in progress") the next consumer replays 100–149 with 0 handler calls.
func TestS03ProcessedButNotCommittedAtHandoff(t *testing.T) {
	t.Parallel()
	for _, commitFails := range []bool{false, true} {
		t.Run(fmt.Sprintf("commitFails=%v", commitFails), func(t *testing.T) {
			t.Parallel()
			e := setup(t, nil)
			a := newApplier(e.appliesTable())
			topic, group := newTopic(t, 1), randomName("g-")
			produce(t, topic, fillers(100)...)
			var batch []kmsg
			for i := 100; i < 150; i++ {
				batch = append(batch, kmsg{id: fmt.Sprintf("m-%d", i), payload: fmt.Sprint(i)})
			}
			produce(t, topic, batch...)
			commitOffset(t, group, topic, 99) // the group starts at offset 100

			srcA := newSpySource(t, group, topic)
			if commitFails {
				srcA.failCommit = func([]consumer.Delivery) error { return kafka.RebalanceInProgress }
			}
			// Large batches: nothing is committed before the close.
			rA := startConsumer(t, consumer.Config{Scope: group, Store: e.store, Handler: a.handler(), CommitEvery: 1000, CommitInterval: time.Hour}, srcA)
			eventually(t, 60*time.Second, "A to process 100–149", func() bool { return a.total() == 50 })
			rA.stop(t)
			if !commitFails {
				if got := groupOffset(t, group, topic); got != 150 {
					t.Fatalf("group offset right after A's graceful close = %d, want 150", got)
				}
				return
			}
			if got := groupOffset(t, group, topic); got != 100 {
				t.Fatalf("group offset after A's failed commits = %d, want 100", got)
			}
			var counters consumer.Counters
			rB := startConsumer(t, consumer.Config{Scope: group, Store: e.store, Handler: a.handler(), Metrics: &counters}, newSpySource(t, group, topic))
			eventually(t, 60*time.Second, "B to commit 150", func() bool { return groupOffset(t, group, topic) == 150 })
			rB.stop(t)
			if a.total() != 50 || counters.Get("duplicate") != 50 || counters.Get("processed") != 0 {
				t.Fatalf("B: handler calls %d (want 50 total, 0 by B), counters %v", a.total(), counters.Snapshot())
			}
			if n := e.count(`select count(*) from ` + a.table); n != 50 {
				t.Fatalf("rows = %d, want 50", n)
			}
			if n := e.count(`select count(*) from ` + e.table("consumption_records") + ` where status = 'SUCCEEDED' and attempts = 1 and message_id like 'm-%'`); n != 50 {
				t.Fatalf("SUCCEEDED records with attempts 1 = %d, want 50", n)
			}
		})
	}
}

// commitOffset commits group's offset off+1 on partition 0 of topic by
// reading up to off with a plain consumer-group reader.
func commitOffset(t testing.TB, group, topic string, off int64) {
	t.Helper()
	r := kafka.NewReader(readerConfig(t, group, topic))
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m.Offset == off {
			if err := r.CommitMessages(ctx, m); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
}

// S05: without message-id headers, a producer retry at a new offset is a
// duplicate by business key; a changed payload is a conflict; empty business
// keys never match.
func TestS05ProducerRetryAtNewOffset(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	a := newApplier(e.appliesTable())
	topic, group := newTopic(t, 1), randomName("g-")
	produce(t, topic, fillers(7)...)
	capture := func(amount string) string {
		return `{"order_id":"order-1001","action":"capture","amount":"` + amount + `"}`
	}
	produce(t, topic,
		kmsg{payload: capture("40.00")},           // 7
		kmsg{payload: capture("40.00")},           // 8: producer retry
		kmsg{payload: capture("45.00")},           // 9: same key, other amount
		kmsg{payload: `{"note":"no key","n":10}`}, // 10: empty business key
		kmsg{payload: `{"note":"no key","n":11}`}) // 11: empty business key
	bk := func(m *dedup.Message) (string, error) {
		if isFiller(m) {
			return "", nil
		}
		var v struct {
			OrderID string `json:"order_id"`
			Action  string `json:"action"`
		}
		if err := json.Unmarshal(m.Payload, &v); err != nil {
			return "", err
		}
		if v.OrderID == "" {
			return "", nil
		}
		return v.OrderID + ":" + v.Action, nil
	}
	var counters consumer.Counters
	r := startConsumer(t, consumer.Config{Scope: group, Store: e.store, Handler: a.handler(), BusinessKey: bk, Metrics: &counters}, newSpySource(t, group, topic))
	waitCaughtUp(t, group, topic)
	r.stop(t)

	pos := func(off int) string { return fmt.Sprintf("kafka:%s/0/%d", topic, off) }
	if a.callsFor(pos(7)) != 1 || a.callsFor(pos(8)) != 0 || a.callsFor(pos(9)) != 0 {
		t.Fatalf("(a)/(b) handler calls: 7=%d 8=%d 9=%d", a.callsFor(pos(7)), a.callsFor(pos(8)), a.callsFor(pos(9)))
	}
	if n := e.count(`select count(*) from `+a.table+` where business_key = $1`, "order-1001:capture"); n != 1 {
		t.Fatalf("(a) rows for order-1001 = %d, want 1", n)
	}
	if counters.Get("duplicate:business_key") != 1 {
		t.Fatalf("(a) duplicates by business key = %d, want 1", counters.Get("duplicate:business_key"))
	}
	dl := e.deadLetters(group)
	if len(dl) != 1 || dl[0].Reason != dedup.ReasonPayloadConflict || dl[0].MessageID != pos(9) || !strings.Contains(string(dl[0].Payload), "45.00") ||
		counters.Get("conflict") != 1 || counters.Get("conflict:"+dedup.ReasonPayloadConflict) != 1 {
		t.Fatalf("(b) dead letters = %+v, conflicts %d", dl, counters.Get("conflict"))
	}
	if a.callsFor(pos(10)) != 1 || a.callsFor(pos(11)) != 1 {
		t.Fatalf("(c) empty business keys: calls 10=%d 11=%d, want 1 each", a.callsFor(pos(10)), a.callsFor(pos(11)))
	}
	if r := e.record(group, pos(11)); r.BusinessKey != "" || r.Status != dedup.StatusSucceeded {
		t.Fatalf("(c) record 11 = %+v", r)
	}
}

// Bad input reaches a defined outcome and never stops the consumer.
func TestKafkaBadInput(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	a := newApplier(e.appliesTable())
	a.fail = func(m *dedup.Message) error {
		if len(m.Payload) == 0 {
			return dedup.Permanent(errors.New("empty payload"))
		}
		return nil
	}
	topic, group := newTopic(t, 1), randomName("g-")
	huge := strings.Repeat("k", 10*1024)
	produce(t, topic,
		kmsg{payload: `{"order_id":"no-header"}`},                                                // 0: no message-id header
		kmsg{id: "m-huge", payload: `{}`, headers: map[string]string{"business-key": huge}},      // 1: 10 KB business key
		kmsg{id: "m-utf8", payload: `{}`, headers: map[string]string{"business-key": "a\xffb"}},  // 2: invalid UTF-8 key
		kmsg{id: "m-empty", payload: "", headers: map[string]string{"business-key": "bk-empty"}}, // 3: empty payload
		kmsg{id: "m-garbage", payload: "\x00\x01 not json"},                                      // 4: extractor fails
		kmsg{id: "m-after", payload: `{"order_id":"after"}`})                                     // 5: still consuming
	bk := func(m *dedup.Message) (string, error) {
		if v, ok := m.Headers["business-key"]; ok {
			return v, nil
		}
		var v struct {
			OrderID string `json:"order_id"`
		}
		if err := json.Unmarshal(m.Payload, &v); err != nil {
			return "", err
		}
		return v.OrderID, nil
	}
	var counters consumer.Counters
	r := startConsumer(t, consumer.Config{Scope: group, Store: e.store, Handler: a.handler(), BusinessKey: bk, Metrics: &counters}, newSpySource(t, group, topic))
	waitCaughtUp(t, group, topic)
	r.stop(t)

	if rec := e.record(group, fmt.Sprintf("kafka:%s/0/0", topic)); rec.Status != dedup.StatusSucceeded {
		t.Fatalf("no header: %+v", rec)
	}
	if rec := e.record(group, "m-huge"); rec.BusinessKey != dedup.NormalizeKey(huge) || !strings.HasPrefix(rec.BusinessKey, "sha256:") || rec.Status != dedup.StatusSucceeded {
		t.Fatalf("10 KB key: %+v", rec)
	}
	if rec := e.record(group, "m-utf8"); !strings.HasPrefix(rec.BusinessKey, "sha256:") || rec.Status != dedup.StatusSucceeded {
		t.Fatalf("invalid UTF-8 key: %+v", rec)
	}
	byID := map[string]dedup.DeadLetter{}
	for _, d := range e.deadLetters(group) {
		byID[d.MessageID] = d
	}
	if d, ok := byID["m-empty"]; !ok || d.Reason != dedup.ReasonPermanentError || len(d.Payload) != 0 {
		t.Fatalf("empty payload dead letter: %+v", d)
	}
	if d, ok := byID["m-garbage"]; !ok || d.Reason != dedup.ReasonBadInput || string(d.Payload) != "\x00\x01 not json" || e.record(group, "m-garbage").Status != dedup.StatusFailedFinal {
		t.Fatalf("malformed payload dead letter: %+v", d)
	}
	if a.callsFor("m-garbage") != 0 || a.callsFor("m-after") != 1 || counters.Get("processed") != 4 || counters.Get("dead_letter") != 2 {
		t.Fatalf("calls garbage=%d after=%d, counters %v", a.callsFor("m-garbage"), a.callsFor("m-after"), counters.Snapshot())
	}
}

// The Kafka adapter never uses ReadMessage (it commits before processing).
func TestKafkaAdapterNeverUsesReadMessage(t *testing.T) {
	files, err := filepath.Glob("../broker/kafkaadapter/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("adapter sources not found: %v", err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), ".ReadMessage(") {
			t.Fatalf("%s calls ReadMessage", f)
		}
	}
}

// A record retention shorter than the topic's retention.ms is
// refused at start, naming both numbers.
func TestKafkaRetentionShorterThanTopicRefused(t *testing.T) {
	t.Parallel()
	e := setup(t, nil) // SucceededRetention: 7 days
	topic := randomName("idemq-test-")
	cl := &kafka.Client{Addr: kafka.TCP(kafkaBrokers(t)...), Timeout: 10 * time.Second}
	resp, err := cl.CreateTopics(e.ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: []kafka.ConfigEntry{{ConfigName: "retention.ms", ConfigValue: fmt.Sprint((30 * 24 * time.Hour).Milliseconds())}}}}})
	if err != nil || resp.Errors[topic] != nil {
		t.Fatalf("create topic: %v %v", err, resp)
	}
	c, err := consumer.New(consumer.Config{Scope: "g", Store: e.store, Handler: newApplier(e.appliesTable()).handler()})
	if err != nil {
		t.Fatal(err)
	}
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{Reader: readerConfig(t, randomName("g-"), topic)})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Run(e.ctx, src)
	if !errors.Is(err, dedup.ErrRetentionTooShort) || !strings.Contains(err.Error(), "168h0m0s") || !strings.Contains(err.Error(), "720h0m0s") {
		t.Fatalf("Run = %v, want ErrRetentionTooShort naming 168h and 720h", err)
	}
}

// docker-compose.yml runs the same services for Docker users: it must load
// under the Compose specification (compose-go, the loader docker compose
// uses) with the same services and loopback ports as scripts/services.sh, and,
// when the docker compose client is installed, `docker compose config` must
// accept it too.
func TestDockerComposeFileIsValid(t *testing.T) {
	opts, err := composecli.NewProjectOptions([]string{"../docker-compose.yml"}, composecli.WithName("idemq"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	published := map[string]bool{}
	for _, s := range p.Services {
		for _, port := range s.Ports {
			published[port.Published] = true
			if port.HostIP != "127.0.0.1" {
				t.Errorf("service %s publishes %s on %q, want 127.0.0.1", s.Name, port.Published, port.HostIP)
			}
		}
	}
	for _, port := range []string{"5432", "6379", "9092", "9876", "10911"} {
		if !published[port] {
			t.Errorf("docker-compose.yml publishes no service on %s (services.sh does)", port)
		}
	}
	if err := exec.Command("docker", "compose", "version").Run(); err != nil {
		t.Logf("docker compose client not installed (%v): validated with compose-go only", err)
		return
	}
	out, err := exec.Command("docker", "compose", "-f", "../docker-compose.yml", "config", "--quiet").CombinedOutput()
	if err != nil {
		t.Fatalf("docker compose config: %v\n%s", err, out)
	}
}

// EnsureTopics returns only once every partition's leader serves it: a
// produce request sent right after, without any retry, succeeds on every
// partition of every new topic. (Checking the metadata alone was not enough:
// a fresh broker answered NOT_LEADER_OR_FOLLOWER to the first produce.)
func TestKafkaEnsureTopicsReadyToProduce(t *testing.T) {
	t.Parallel()
	const partitions = 3
	topics := []string{randomName("idemq-ready-"), randomName("idemq-ready-"), randomName("idemq-ready-")}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := kafkaadapter.EnsureTopics(ctx, kafkaBrokers(t), partitions, topics...); err != nil {
		t.Fatal(err)
	}
	cl := &kafka.Client{Addr: kafka.TCP(kafkaBrokers(t)...), Timeout: 10 * time.Second}
	for _, topic := range topics {
		for p := range partitions {
			res, err := cl.Produce(ctx, &kafka.ProduceRequest{Topic: topic, Partition: p, RequiredAcks: kafka.RequireAll,
				Records: kafka.NewRecordReader(kafka.Record{Value: kafka.NewBytes([]byte("probe"))})})
			if err == nil && res.Error != nil {
				err = res.Error
			}
			if err != nil {
				t.Fatalf("produce to %s/%d right after EnsureTopics: %v", topic, p, err)
			}
		}
	}
	// Idempotent: existing topics are accepted as they are.
	if err := kafkaadapter.EnsureTopics(ctx, kafkaBrokers(t), partitions, topics[0]); err != nil {
		t.Fatalf("EnsureTopics on an existing topic: %v", err)
	}
}
