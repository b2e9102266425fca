package kafkaadapter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/broker/kafkasec"
	"github.com/idemq/idemq/wire"
	"github.com/segmentio/kafka-go"
)

func TestToDelivery(t *testing.T) {
	m := kafka.Message{Topic: "payments", Partition: 2, Offset: 1041, Key: []byte("acct-7"), Value: []byte(`{}`),
		Headers: []kafka.Header{{Key: wire.MessageIDHeader, Value: []byte("old")}, {Key: wire.MessageIDHeader, Value: []byte("m-1")}, {Key: "trace", Value: []byte("t")}}}
	d := ToDelivery(m, "")
	if d.MessageID != "m-1" || d.Position != "kafka:payments/2/1041" || d.Lane != "payments/2" || d.Offset != 1041 {
		t.Fatalf("delivery = %+v", d)
	}
	if d.Message.Headers["trace"] != "t" || string(d.Message.Key) != "acct-7" || d.Message.Source != d.Position {
		t.Fatalf("message = %+v", d.Message)
	}
	if _, ok := d.Ack.(kafka.Message); !ok {
		t.Fatal("Ack must carry the kafka.Message for CommitMessages")
	}
	if d := ToDelivery(kafka.Message{Topic: "t"}, "x-id"); d.MessageID != "" || d.Position != "kafka:t/0/0" {
		t.Fatalf("missing header: %+v", d)
	}
}

func TestNewSourceValidates(t *testing.T) {
	base := kafka.ReaderConfig{Brokers: []string{"127.0.0.1:9092"}, GroupID: "g", Topic: "t"}
	bad := []kafka.ReaderConfig{
		{GroupID: "g", Topic: "t"},
		{Brokers: base.Brokers, Topic: "t"},
		{Brokers: base.Brokers, GroupID: "g"},
		{Brokers: base.Brokers, GroupID: "g", Topic: "t", CommitInterval: time.Second},
		{Brokers: base.Brokers, GroupID: "g", Topic: "t", ReadBackoffMin: 2 * time.Second},           // above the 1s default max
		{Brokers: base.Brokers, GroupID: "g", Topic: "t", StartOffset: 42},                           // FirstOffset or LastOffset only
		{Brokers: base.Brokers, GroupID: "g", Topic: "t", SessionTimeout: -time.Second},              // the consumer group's own check
		{Brokers: base.Brokers, GroupID: "g", Topic: "t", HeartbeatInterval: -time.Second},           // idem
		{Brokers: base.Brokers, GroupID: "g", GroupTopics: []string{"a"}, MinBytes: 10, MaxBytes: 5}, // the reader's own check
	}
	for i, rc := range bad {
		if _, err := NewSource(Config{Reader: rc}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("config %d: err = %v", i, err)
		}
	}
	if _, err := NewSource(Config{Reader: base, FetchRetryMax: -time.Second}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("negative FetchRetryMax: err = %v", err)
	}
}

// A Source watches its topics for partitions added unless told not to
// (S30), every DefaultPartitionWatchInterval by default; kafka-go's own
// watch stays off (it ends every generation while a topic is missing).
func TestNewSourceWatchesPartitionChanges(t *testing.T) {
	base := kafka.ReaderConfig{Brokers: []string{"127.0.0.1:9092"}, GroupID: "g", Topic: "t"}
	for _, tc := range []struct {
		name     string
		cfg      Config
		watch    bool
		interval time.Duration
	}{
		{"README config", Config{Reader: base}, true, DefaultPartitionWatchInterval},
		{"interval set", Config{Reader: func() kafka.ReaderConfig { r := base; r.PartitionWatchInterval = time.Second; return r }()}, true, time.Second},
		{"WatchPartitionChanges set", Config{Reader: func() kafka.ReaderConfig { r := base; r.WatchPartitionChanges = true; return r }()}, true, DefaultPartitionWatchInterval},
		{"opted out", Config{Reader: base, IgnorePartitionChanges: true}, false, DefaultPartitionWatchInterval},
	} {
		s, err := NewSource(tc.cfg)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if s.watch != tc.watch || s.watchEvery != tc.interval || s.cgc.WatchPartitionChanges {
			t.Errorf("%s: watch %v every %s (kafka-go's watch %v), want %v every %s (kafka-go's off)", tc.name,
				s.watch, s.watchEvery, s.cgc.WatchPartitionChanges, tc.watch, tc.interval)
		}
		if s.cgc.StartOffset != 0 && s.cgc.StartOffset != kafka.FirstOffset {
			t.Errorf("%s: group StartOffset %d, want kafka.FirstOffset (the default) for partitions without a commit", tc.name, s.cgc.StartOffset)
		}
	}
	rc := base
	rc.WatchPartitionChanges = true
	if _, err := NewSource(Config{Reader: rc, IgnorePartitionChanges: true}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("IgnorePartitionChanges with Reader.WatchPartitionChanges: err = %v, want ErrInvalidConfig", err)
	}
}

// scriptedFetch returns the errors in order, then m; it counts its calls.
func scriptedFetch(m kafka.Message, errs ...error) (func(context.Context) (kafka.Message, *claim, error), *int) {
	calls := 0
	return func(context.Context) (kafka.Message, *claim, error) {
		calls++
		if calls <= len(errs) {
			return kafka.Message{}, nil, errs[calls-1]
		}
		return m, nil, nil
	}, &calls
}

// testSource is a Source that never joins a group: fetch stands in for the
// partition readers.
func testSource(fetch func(context.Context) (kafka.Message, *claim, error)) *Source {
	s, err := NewSource(Config{Reader: kafka.ReaderConfig{Brokers: []string{"127.0.0.1:1"}, GroupID: "g", Topic: "t"},
		FetchRetryMax: 5 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	s.started = true
	if fetch != nil {
		s.fetch = fetch
	}
	return s
}

// kafka-go reports errors through FetchMessage and keeps fetching, so a
// broker restart or a leader move must not end the consumer.
func TestFetchRetriesTransientErrors(t *testing.T) {
	want := kafka.Message{Topic: "t", Partition: 1, Offset: 7, Headers: []kafka.Header{{Key: wire.MessageIDHeader, Value: []byte("m-7")}}}
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	fetch, calls := scriptedFetch(want, dial, kafka.NotLeaderForPartition, kafka.RequestTimedOut, kafka.RebalanceInProgress)
	d, err := testSource(fetch).Fetch(context.Background())
	if err != nil || d.MessageID != "m-7" || d.Offset != 7 {
		t.Fatalf("Fetch = %+v, %v; want m-7 after the transient errors", d, err)
	}
	if *calls != 5 {
		t.Fatalf("FetchMessage calls = %d, want 5 (4 errors, then the message)", *calls)
	}
}

func TestFetchReturnsFinalErrors(t *testing.T) {
	for _, final := range []error{io.EOF, kafka.TopicAuthorizationFailed, fmt.Errorf("wrapped: %w", kafka.GroupAuthorizationFailed),
		kafka.InvalidSessionTimeout, errors.New("not a kafka or network error")} {
		fetch, calls := scriptedFetch(kafka.Message{}, final)
		if _, err := testSource(fetch).Fetch(context.Background()); !errors.Is(err, final) && err != final {
			t.Errorf("Fetch after %v = %v, want that error", final, err)
		}
		if *calls != 1 {
			t.Errorf("%v: FetchMessage calls = %d, want 1 (no retry)", final, *calls)
		}
	}
}

func TestFetchStopsRetryingWhenContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	errs := make([]error, 1000)
	for i := range errs {
		errs[i] = kafka.LeaderNotAvailable
	}
	fetch, calls := scriptedFetch(kafka.Message{}, errs...)
	time.AfterFunc(200*time.Millisecond, cancel)
	if _, err := testSource(fetch).Fetch(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Fetch = %v, want context.Canceled", err)
	}
	if *calls < 2 || *calls >= 1000 {
		t.Fatalf("FetchMessage calls = %d, want some retries, then a stop", *calls)
	}
}

// An explicit Config.RedeliveryHorizon is returned without asking the
// broker (there is none at this address); a negative one is refused.
func TestRedeliveryHorizonConfigured(t *testing.T) {
	rc := kafka.ReaderConfig{Brokers: []string{"127.0.0.1:1"}, GroupID: "g", Topic: "t"}
	s, err := NewSource(Config{Reader: rc, RedeliveryHorizon: 36 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if h, err := s.RedeliveryHorizon(ctx); h != 36*time.Hour || err != nil {
		t.Fatalf("RedeliveryHorizon = %s, %v; want 36h, nil", h, err)
	}
	_, err = NewSource(Config{Reader: rc, RedeliveryHorizon: -time.Minute})
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "RedeliveryHorizon") {
		t.Fatalf("negative RedeliveryHorizon: %v, want ErrInvalidConfig naming it", err)
	}
}

// The horizon check's requests go through the Reader's Dialer: its TLS
// config and SASL mechanism.
func TestHorizonCheckUsesReaderDialer(t *testing.T) {
	sec := kafkasec.Config{TLS: kafkasec.TLS{Enabled: true}, SASL: kafkasec.SASL{Mechanism: kafkasec.ScramSHA512, Username: "u", Password: "p"}}
	d, err := sec.Dialer()
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSource(Config{Reader: kafka.ReaderConfig{Brokers: []string{"127.0.0.1:1"}, GroupID: "g", Topic: "t", Dialer: d}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tr, ok := s.admin.(*kafka.Transport)
	if !ok || tr.TLS != d.TLS || tr.SASL != d.SASLMechanism {
		t.Fatalf("admin transport %#v does not carry the Dialer's TLS and SASL", s.admin)
	}
	if s, _ := NewSource(Config{Reader: kafka.ReaderConfig{Brokers: []string{"127.0.0.1:1"}, GroupID: "g", Topic: "t"}}); s.admin != nil {
		t.Fatalf("no Dialer: admin transport %#v, want nil (kafka.DefaultTransport)", s.admin)
	}
}
