package rocketmqadapter

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
)

func TestCleanupGap(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
	}{
		{"", 24 * time.Hour}, // the broker's default "04"
		{"04", 24 * time.Hour},
		{"4;04", 24 * time.Hour},
		{"04;16", 12 * time.Hour},
		{"01;02;23", 21 * time.Hour}, // 02 → 23
		{"22; 23 ;0", 22 * time.Hour},
		{"0;6;12;18", 6 * time.Hour},
	} {
		got, err := CleanupGap(c.in)
		if err != nil || got != c.want {
			t.Errorf("CleanupGap(%q) = %s, %v; want %s", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"24", "x", "04;-1", ";", "4h"} {
		if _, err := CleanupGap(bad); err == nil || !strings.Contains(err.Error(), "deleteWhen") {
			t.Errorf("CleanupGap(%q) = %v; want an error naming deleteWhen", bad, err)
		}
	}
	r := StoreRetention{FileReservedTime: 72 * time.Hour, CleanupGap: 24 * time.Hour}
	if r.Horizon() != 96*time.Hour {
		t.Errorf("Horizon = %s, want 96h (72h + 24h)", r.Horizon())
	}
}

func TestParseProperties(t *testing.T) {
	p := parseProperties([]byte("fileReservedTime=48\n# comment\ndeleteWhen=04;16\nmessageDelayLevel=1s 5s\n\nempty=\n"))
	if p["fileReservedTime"] != "48" || p["deleteWhen"] != "04;16" || p["messageDelayLevel"] != "1s 5s" || p["empty"] != "" || len(p) != 4 {
		t.Fatalf("parseProperties = %v", p)
	}
}

// The retention fields and the credentials are validated by NewListener
// and NewSource, each error naming its field and never the secret.
func TestRetentionAndCredentialsValidation(t *testing.T) {
	st := offlineStore(t, nil)
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{FileReservedTime: 72}, "FileReservedTime 72ns must be at least 1h"},
		{Config{FileReservedTime: -time.Hour}, "FileReservedTime -1h0m0s"},
		{Config{DLQReplayWindow: -time.Hour}, "DLQReplayWindow -1h0m0s"},
		{Config{FileReservedTime: 72 * time.Hour, DLQReplayWindow: 73 * time.Hour}, "DLQReplayWindow 73h0m0s is longer than FileReservedTime 72h0m0s"},
		{Config{Credentials: primitive.Credentials{SecretKey: "s3cret"}}, "Credentials.AccessKey is empty"},
		{Config{Credentials: primitive.Credentials{AccessKey: "ak"}}, "Credentials.SecretKey is empty"},
		{Config{Credentials: primitive.Credentials{AccessKey: " ak", SecretKey: "s3cret"}}, "Credentials.AccessKey"},
	} {
		c.cfg.Group = "g"
		_, err := NewListener(newConsumer(t, consumer.Config{Store: st, Handler: noop}), c.cfg)
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("NewListener(%+v) = %v; want ErrInvalidConfig naming %q, without the secret", c.cfg, err, c.want)
		}
		sc := SourceConfig{NameServers: []string{"127.0.0.1:1"}, Group: "g", Topic: "t",
			FileReservedTime: c.cfg.FileReservedTime, Credentials: c.cfg.Credentials}
		if c.cfg.DLQReplayWindow != 0 {
			continue // push only
		}
		if _, err := NewSource(sc); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewSource(%+v) = %v; want ErrInvalidConfig naming %q", sc, err, c.want)
		}
	}
	if _, err := NewListener(newConsumer(t, consumer.Config{Store: st, Handler: noop}),
		Config{Group: "g", FileReservedTime: 72 * time.Hour, DLQReplayWindow: 72 * time.Hour,
			Credentials: primitive.Credentials{AccessKey: "ak", SecretKey: "sk", SecurityToken: "tok"}}); err != nil {
		t.Errorf("a window equal to FileReservedTime and full credentials: %v", err)
	}
}

// FullHorizon's arithmetic with a configured FileReservedTime (nothing is
// read from a broker): the larger of the retry horizon plus the DLQ replay
// window and the store retention plus the 24h cleanup gap.
func TestFullHorizonArithmetic(t *testing.T) {
	ctx := context.Background()
	base := Config{NameServers: []string{"127.0.0.1:1"}, Topic: "t"}
	retries := base.Horizon() // 4h45m40s of delay levels + 17 × 15m consume timeouts
	if retries != 4*time.Hour+45*time.Minute+40*time.Second+17*15*time.Minute {
		t.Fatalf("default Horizon = %s", retries)
	}
	for _, c := range []struct {
		name  string
		tweak func(*Config)
		want  time.Duration
	}{
		{"store retention wins", func(c *Config) { c.FileReservedTime = 72 * time.Hour }, 96 * time.Hour},
		{"many redeliveries: retries win", func(c *Config) { c.FileReservedTime, c.MaxReconsumeTimes = time.Hour, 100 }, 0},
		{"DLQ window within the store", func(c *Config) { c.FileReservedTime, c.DLQReplayWindow = 72*time.Hour, 48*time.Hour }, 96 * time.Hour},
		{"DLQ window equal to the store", func(c *Config) { c.FileReservedTime, c.DLQReplayWindow = 72*time.Hour, 72*time.Hour }, 96 * time.Hour},
		{"many redeliveries: retries + window win", func(c *Config) {
			c.FileReservedTime, c.DLQReplayWindow, c.MaxReconsumeTimes = 24*time.Hour, 24*time.Hour, 100
		}, 0},
		{"resets accepted: retries + window", func(c *Config) {
			c.FileReservedTime, c.DLQReplayWindow, c.AcceptOffsetResetReplays = 72*time.Hour, 72*time.Hour, true
		}, retries + 72*time.Hour},
		{"resets accepted, no window: no broker read", func(c *Config) { c.AcceptOffsetResetReplays = true }, retries},
	} {
		cfg := base
		c.tweak(&cfg)
		if c.want == 0 { // the retries (and window) exceed the store retention
			c.want = cfg.Horizon() + cfg.DLQReplayWindow
			if c.want <= cfg.FileReservedTime+DefaultCleanupGap {
				t.Fatalf("%s: bad case: retries %s", c.name, c.want)
			}
		}
		got, err := cfg.FullHorizon(ctx)
		if err != nil || got != c.want {
			t.Errorf("%s: FullHorizon = %s, %v; want %s", c.name, got, err, c.want)
		}
	}
	// Not configured: the brokers are asked (here: nothing listens).
	if _, err := base.FullHorizon(ctx); err == nil || !strings.Contains(err.Error(), "route of topic t") {
		t.Errorf("FullHorizon without FileReservedTime and no name server: %v; want a route error", err)
	}
}

// PushConsumer.Start checks the store's schema first, by default: with no
// database to answer, it fails at the schema check, before the horizon or
// the client.
func TestPushStartChecksSchemaFirst(t *testing.T) {
	st := offlineStore(t, nil)
	pc, err := NewPushConsumer(newConsumer(t, consumer.Config{Store: st, Handler: noop}),
		Config{NameServers: []string{"127.0.0.1:1"}, Group: "g_schema", Topic: "t", InstanceName: InstanceName("unit-schema"), FileReservedTime: 72 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pc.Shutdown() }()
	if err := pc.Start(); err == nil || !strings.Contains(err.Error(), "check schema") || errors.Is(err, dedup.ErrRetentionTooShort) {
		t.Fatalf("Start = %v; want the schema check's error first", err)
	}
}

// PushConsumer.Start refuses a SucceededRetention shorter than the full
// horizon before it starts the client, naming both numbers; the
// consumer can be shut down afterwards.
func TestPushStartRefusesShortRetention(t *testing.T) {
	st := offlineStore(t, func(c *pgstore.Config) { c.SucceededRetention = 48 * time.Hour })
	pc, err := NewPushConsumer(newConsumer(t, consumer.Config{Store: st, Handler: noop, SkipSchemaCheck: true}),
		Config{NameServers: []string{"127.0.0.1:1"}, Group: "g_short", Topic: "t", InstanceName: InstanceName("unit-short"), FileReservedTime: 72 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	err = pc.Start()
	if !errors.Is(err, dedup.ErrRetentionTooShort) || !strings.Contains(err.Error(), "48h0m0s") || !strings.Contains(err.Error(), "96h0m0s") {
		t.Fatalf("Start = %v; want ErrRetentionTooShort naming 48h0m0s and 96h0m0s", err)
	}
	if err2 := pc.Start(); !errors.Is(err2, dedup.ErrRetentionTooShort) {
		t.Fatalf("second Start = %v; want the same refusal", err2)
	}
	if err := pc.Shutdown(); err != nil {
		t.Fatalf("Shutdown after a refused Start: %v", err)
	}
}

// Shutdown before Start does not touch the client (whose Shutdown needs a
// started client).
func TestPushShutdownBeforeStart(t *testing.T) {
	pc, err := NewPushConsumer(newConsumer(t, consumer.Config{Store: offlineStore(t, nil), Handler: noop}),
		Config{NameServers: []string{"127.0.0.1:1"}, Group: "g_nostart", Topic: "t", InstanceName: InstanceName("unit-nostart")})
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(); !errors.Is(err, ErrShutdown) {
		t.Fatalf("Start after Shutdown = %v, want ErrShutdown", err)
	}
}

func TestSourceRedeliveryHorizonOverrides(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		cfg  SourceConfig
		want time.Duration
	}{
		{SourceConfig{FileReservedTime: 72 * time.Hour}, 96 * time.Hour},
		{SourceConfig{FileReservedTime: 12 * time.Hour}, 36 * time.Hour},
		{SourceConfig{AcceptOffsetResetReplays: true}, time.Minute},
		{SourceConfig{AcceptOffsetResetReplays: true, FileReservedTime: 72 * time.Hour}, time.Minute},
	} {
		c.cfg.NameServers, c.cfg.Group, c.cfg.Topic = []string{"127.0.0.1:1"}, "g", "t"
		src, err := NewSource(c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		got, err := src.RedeliveryHorizon(ctx)
		if err != nil || got != c.want {
			t.Errorf("RedeliveryHorizon(%+v) = %s, %v; want %s", c.cfg, got, err, c.want)
		}
		_ = src.Close()
	}
}

func TestBrokerErrorIsAccessDenied(t *testing.T) {
	err := error(&BrokerError{Addr: "a:1", Request: "GET_BROKER_CONFIG", Code: resNoPermission, Remark: "check signature failed."})
	if !errors.Is(err, ErrAccessDenied) || !strings.Contains(err.Error(), "code 16: check signature failed.") {
		t.Fatalf("NO_PERMISSION: %v (Is ErrAccessDenied %v)", err, errors.Is(err, ErrAccessDenied))
	}
	if errors.Is(&BrokerError{Code: resTopicNotExist}, ErrAccessDenied) {
		t.Fatal("TOPIC_NOT_EXIST is not access denied")
	}
}
