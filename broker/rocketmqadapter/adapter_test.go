package rocketmqadapter

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/wire"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func ext(topic, uniq, offsetMsgID string, props map[string]string) *primitive.MessageExt {
	m := &primitive.MessageExt{Message: primitive.Message{Topic: topic, Body: []byte(`{"n":1}`)}, OffsetMsgId: offsetMsgID}
	for k, v := range props {
		m.WithProperty(k, v)
	}
	if uniq != "" {
		m.WithProperty(primitive.PropertyUniqueClientMessageIdKeyIndex, uniq)
		m.MsgId = uniq
	} else {
		m.MsgId = offsetMsgID // what the client does without UNIQ_KEY
	}
	return m
}

func TestMessageIDRules(t *testing.T) {
	cases := []struct {
		name string
		m    *primitive.MessageExt
		want string
	}{
		{"message-id property wins", ext("orders", "U1", "O1", map[string]string{wire.MessageIDHeader: "m-1"}), "m-1"},
		{"UNIQ_KEY", ext("orders", "U1", "O1", nil), "U1"},
		{"MsgId fallback to OffsetMsgId is not used", ext("orders", "", "O3", nil), ""},
		{"MsgId set without property", &primitive.MessageExt{MsgId: "U9", OffsetMsgId: "O9"}, "U9"},
		{"nil", nil, ""},
	}
	for _, c := range cases {
		if got := MessageID(c.m, ""); got != c.want {
			t.Errorf("%s: MessageID = %q, want %q", c.name, got, c.want)
		}
	}
	if got := MessageID(ext("orders", "U1", "O1", map[string]string{"x-id": "custom"}), "x-id"); got != "custom" {
		t.Errorf("custom property: %q", got)
	}
}

func TestToDeliveryRetryCopy(t *testing.T) {
	m := ext("%RETRY%refund-svc", "U2", "O2", map[string]string{primitive.PropertyRetryTopic: "refunds", primitive.PropertyKeys: "refund-77 other"})
	m.Queue = &primitive.MessageQueue{Topic: "%RETRY%refund-svc", BrokerName: "broker-a", QueueId: 0}
	m.QueueOffset = 17
	m.ReconsumeTimes = 1
	m.BornTimestamp = 1_700_000_000_000
	d := ToDelivery(m, "")
	if d.MessageID != "U2" {
		t.Fatalf("MessageID = %q", d.MessageID)
	}
	if want := "rocketmq:%RETRY%refund-svc/broker-a/0/17"; d.Position != want || d.Message.Source != want {
		t.Fatalf("Position = %q, Source %q, want %q", d.Position, d.Message.Source, want)
	}
	if d.Message.Topic != "refunds" {
		t.Fatalf("Topic = %q, want the original topic", d.Message.Topic)
	}
	if d.Message.ReconsumeTimes != 1 || d.Message.Offset != 17 || d.Message.Partition != 0 || d.Offset != 17 {
		t.Fatalf("message = %+v", d.Message)
	}
	if string(d.Message.Key) != "refund-77 other" || d.Message.Header(primitive.PropertyKeys) != "refund-77 other" {
		t.Fatalf("Key = %q", d.Message.Key)
	}
	if !d.Message.Time.Equal(time.UnixMilli(1_700_000_000_000)) {
		t.Fatalf("Time = %v", d.Message.Time)
	}
	if d.Ack != m || d.Lane != "%RETRY%refund-svc/broker-a/0" {
		t.Fatalf("Ack/Lane = %v %q", d.Ack, d.Lane)
	}
	bk, err := BusinessKeyFromKeys(d.Message)
	if err != nil || bk != "refund-77" {
		t.Fatalf("BusinessKeyFromKeys = %q, %v", bk, err)
	}
}

func TestToDeliveryWithoutUniqKeyUsesPosition(t *testing.T) {
	m := ext("refunds", "", "O3", nil)
	m.Queue = &primitive.MessageQueue{Topic: "refunds", BrokerName: "broker-a", QueueId: 3}
	m.QueueOffset = 5
	d := ToDelivery(m, "")
	if d.MessageID != "" || d.Position != "rocketmq:refunds/broker-a/3/5" {
		t.Fatalf("MessageID %q Position %q", d.MessageID, d.Position)
	}
	id, err := dedup.NewIdentity("refund-svc", d.MessageID, d.Position, "")
	if err != nil || id.MessageID != "rocketmq:refunds/broker-a/3/5" || strings.Contains(id.MessageID, "O3") {
		t.Fatalf("identity %+v, %v", id, err)
	}
}

func TestBusinessKeyFromProperty(t *testing.T) {
	msg := &dedup.Message{Headers: map[string]string{"order-id": "o-1"}}
	if k, err := BusinessKeyFromProperty("order-id", true)(msg); k != "o-1" || err != nil {
		t.Fatalf("%q %v", k, err)
	}
	if _, err := BusinessKeyFromProperty("missing", true)(msg); !errors.Is(err, ErrNoBusinessKey) {
		t.Fatalf("err = %v", err)
	}
	if k, err := BusinessKeyFromProperty("missing", false)(msg); k != "" || err != nil {
		t.Fatalf("%q %v", k, err)
	}
	if k, _ := BusinessKeyFromKeys(&dedup.Message{}); k != "" {
		t.Fatalf("no keys: %q", k)
	}
}

func TestInstanceNameUnique(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		n := InstanceName("orders")
		if seen[n] || !strings.HasPrefix(n, "orders-") || strings.ContainsAny(n, " @:") {
			t.Fatalf("instance name %q (repeated %v)", n, seen[n])
		}
		seen[n] = true
	}
}

func TestDelayLevelsAndHorizon(t *testing.T) {
	levels, err := ParseDelayLevels("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h")
	if err != nil {
		t.Fatal(err)
	}
	def := DefaultDelayLevels()
	if len(levels) != len(def) {
		t.Fatalf("%d levels", len(levels))
	}
	for i := range def {
		if levels[i] != def[i] {
			t.Fatalf("level %d: %s != %s", i+1, levels[i], def[i])
		}
	}
	if h := RedeliveryHorizon(def, 16); h != 4*time.Hour+45*time.Minute+40*time.Second {
		t.Fatalf("default horizon = %s", h)
	}
	if h := RedeliveryHorizon(def, -1); h != RedeliveryHorizon(def, 16) {
		t.Fatalf("-1 horizon = %s", h)
	}
	// Levels 3, 4, 5: 10s + 30s + 1m.
	if h := RedeliveryHorizon(def, 3); h != 100*time.Second {
		t.Fatalf("3 reconsumes = %s", h)
	}
	// Past the last level the broker keeps using the last one.
	ones, _ := ParseDelayLevels("1s 1s 1s 1d")
	if h := RedeliveryHorizon(ones, 5); h != 1*time.Second+4*24*time.Hour {
		t.Fatalf("capped = %s", h)
	}
	for _, bad := range []string{"", "5", "1x", "-1s", "abc"} {
		if _, err := ParseDelayLevels(bad); err == nil {
			t.Errorf("ParseDelayLevels(%q) accepted", bad)
		}
	}
}

// offlineStore is a Store whose database is unreachable (nothing listens on
// port 1): NewStore does not connect, and every Process fails fast.
func offlineStore(t *testing.T, tweak func(*pgstore.Config)) *pgstore.Store {
	t.Helper()
	cfg, err := pgxpool.ParseConfig("postgres://idemq:idemq@127.0.0.1:1/idemq?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	fp, err := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "k1", Secret: []byte("unit-test-secret-0123456789")})
	if err != nil {
		t.Fatal(err)
	}
	dc := pgstore.Config{Fingerprinter: fp}
	if tweak != nil {
		tweak(&dc)
	}
	st, err := pgstore.New(pool, dc)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func noop(context.Context, pgx.Tx, *dedup.Message) error { return nil }

// newConsumer builds the runtime a Listener runs (Scope "g" unless set).
func newConsumer(t *testing.T, cc consumer.Config) *consumer.Consumer {
	t.Helper()
	if cc.Scope == "" {
		cc.Scope = "g"
	}
	c, err := consumer.New(cc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestConfigValidation(t *testing.T) {
	st := offlineStore(t, func(c *pgstore.Config) { c.MaxAttempts = 5 })
	cases := []struct {
		name   string
		tweak  func(*Config)
		bound  time.Duration // consumer.Config.MaxHandlerDuration
		want   []string      // substrings of the error; nil: valid
		wantIs error         // the sentinel the error wraps
	}{
		{name: "defaults", tweak: func(*Config) {}},
		{name: "handler bound fits", tweak: func(*Config) {}, bound: 14 * time.Minute},
		{name: "handler bound too long", tweak: func(*Config) {}, bound: 15 * time.Minute,
			want: []string{"MaxHandlerDuration 15m0s", "CallTimeout 15m0s", "ConsumeTimeout 15m0s"}, wantIs: consumer.ErrInvalidConfig},
		{name: "batch makes it too long", tweak: func(c *Config) { c.BatchMaxSize, c.ConsumeTimeout = 4, time.Minute }, bound: 20 * time.Second,
			want: []string{"MaxHandlerDuration 20s", "BatchMaxSize 4", "1m20s", "ConsumeTimeout 1m0s"}, wantIs: consumer.ErrInvalidConfig},
		{name: "reconsume below attempts", tweak: func(c *Config) { c.MaxReconsumeTimes = 3 },
			want: []string{"MaxReconsumeTimes 3", "4 deliveries", "MaxAttempts 5"}, wantIs: consumer.ErrInvalidConfig},
		{name: "reconsume just enough", tweak: func(c *Config) { c.MaxReconsumeTimes = 4 }},
		{name: "batch too big", tweak: func(c *Config) { c.BatchMaxSize = 2000 }, want: []string{"BatchMaxSize 2000"}, wantIs: ErrInvalidConfig},
		{name: "timeout too small", tweak: func(c *Config) { c.ConsumeTimeout = time.Millisecond }, want: []string{"ConsumeTimeout 1ms"}, wantIs: ErrInvalidConfig},
		{name: "goroutines", tweak: func(c *Config) { c.ConsumeGoroutines = -1 }, want: []string{"ConsumeGoroutines -1"}, wantIs: ErrInvalidConfig},
		{name: "message ID property", tweak: func(c *Config) { c.MessageIDProperty = " id" }, want: []string{"MessageIDProperty"}, wantIs: ErrInvalidConfig},
	}
	for _, c := range cases {
		cfg := Config{Group: "g1"}
		c.tweak(&cfg)
		_, err := NewListener(newConsumer(t, consumer.Config{Store: st, Handler: noop, MaxHandlerDuration: c.bound}), cfg)
		if c.want == nil {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		if !errors.Is(err, c.wantIs) {
			t.Errorf("%s: error %q does not wrap %v", c.name, err, c.wantIs)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not name %q", c.name, err, w)
			}
		}
	}
	if _, err := NewListener(nil, Config{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("NewListener without a consumer: %v", err)
	}
	c := newConsumer(t, consumer.Config{Store: st, Handler: noop})
	if _, err := NewPushConsumer(c, Config{Group: "g1", Topic: "t"}); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "NameServers") {
		t.Errorf("NewPushConsumer without name servers: %v", err)
	}
	if _, err := NewPushConsumer(c, Config{NameServers: []string{"x:1"}, Topic: "t"}); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "Group") {
		t.Errorf("NewPushConsumer without group: %v", err)
	}
	if _, err := NewPushConsumer(c, Config{NameServers: []string{"x:1"}, Group: "g"}); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "Topic") {
		t.Errorf("NewPushConsumer without topic: %v", err)
	}
}

func TestRetentionMustExceedHorizon(t *testing.T) {
	st := offlineStore(t, func(c *pgstore.Config) { c.SucceededRetention = 2 * time.Hour })
	c := newConsumer(t, consumer.Config{Store: st, Handler: noop})
	_, err := NewListener(c, Config{})
	if !errors.Is(err, dedup.ErrRetentionTooShort) {
		t.Fatalf("err = %v, want ErrRetentionTooShort", err)
	}
	if !strings.Contains(err.Error(), "2h0m0s") {
		t.Fatalf("error does not name the retention: %v", err)
	}
	// With 1 s delay levels, 3 reconsumes and a 1 m consume timeout the
	// horizon is 3s + 4m: 2h is plenty.
	ones, _ := ParseDelayLevels("1s 1s 1s 1s 1s 1s")
	if _, err := NewListener(c, Config{DelayLevels: ones, MaxReconsumeTimes: 4, ConsumeTimeout: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if h := (Config{DelayLevels: ones, MaxReconsumeTimes: 3, ConsumeTimeout: time.Minute}).Horizon(); h != 3*time.Second+4*time.Minute {
		t.Fatalf("Horizon = %s", h)
	}
}

// A database outage is never acknowledged: Handle fails, the listener
// answers ConsumeRetryLater, and Observe sees the error.
func TestDatabaseDownRetriesLater(t *testing.T) {
	st := offlineStore(t, nil)
	var observed []error
	l, err := NewListener(newConsumer(t, consumer.Config{Store: st, Handler: noop}),
		Config{Observe: func(_ consumer.Delivery, _ dedup.Result, err error) { observed = append(observed, err) }})
	if err != nil {
		t.Fatal(err)
	}
	res, err := l.Consume(context.Background(), ext("orders", "U1", "O1", nil), ext("orders", "U2", "O2", nil))
	if err != nil || res != rmqconsumer.ConsumeRetryLater {
		t.Fatalf("Consume = %v, %v; want ConsumeRetryLater", res, err)
	}
	if len(observed) != 2 || observed[0] == nil || observed[1] == nil {
		t.Fatalf("observed = %v, want two errors (every message of the batch is tried)", observed)
	}
}

func TestStopHoldsNewCallsUntilAbort(t *testing.T) {
	st := offlineStore(t, nil)
	l, err := NewListener(newConsumer(t, consumer.Config{Store: st, Handler: noop}), Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	done := make(chan rmqconsumer.ConsumeResult, 1)
	go func() {
		r, _ := l.Consume(context.Background(), ext("orders", "U1", "O1", nil))
		done <- r
	}()
	select {
	case r := <-done:
		t.Fatalf("a call after Stop returned %v before Abort", r)
	case <-time.After(100 * time.Millisecond):
	}
	l.Abort()
	l.Abort()
	if r := <-done; r != rmqconsumer.ConsumeRetryLater {
		t.Fatalf("after Abort: %v", r)
	}
}

func TestLeaseTTLMustFitUnderConsumeTimeout(t *testing.T) {
	st := offlineStore(t, nil)
	lh := func(context.Context, *dedup.Message) error { return nil }
	_, err := NewListener(newConsumer(t, consumer.Config{Store: st, LeaseHandler: lh, Lease: dedup.LeaseOptions{TTL: 2 * time.Minute}}),
		Config{ConsumeTimeout: time.Minute})
	if !errors.Is(err, consumer.ErrInvalidConfig) || !strings.Contains(err.Error(), "2m0s") || !strings.Contains(err.Error(), "1m0s") {
		t.Fatalf("err = %v, want both numbers", err)
	}
	l, err := NewListener(newConsumer(t, consumer.Config{Store: st, LeaseHandler: lh, Lease: dedup.LeaseOptions{TTL: 30 * time.Second},
		MaxHandlerDuration: 10 * time.Second}), Config{ConsumeTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if l.Consumer().Config().LeaseHandler == nil {
		t.Fatal("lease handler dropped")
	}
}
