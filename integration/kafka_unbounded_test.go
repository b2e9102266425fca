package integration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/segmentio/kafka-go"
)

// A topic with unbounded retention (retention.ms = -1) is refused at start
// unless consumer.Config.AcceptUnboundedRedelivery states the risk.
func TestKafkaUnboundedRetentionRefused(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	topic := randomName("idemq-test-")
	cl := &kafka.Client{Addr: kafka.TCP(kafkaBrokers(t)...), Timeout: 10 * time.Second}
	resp, err := cl.CreateTopics(e.ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: []kafka.ConfigEntry{{ConfigName: "retention.ms", ConfigValue: "-1"}}}}})
	if err != nil || resp.Errors[topic] != nil {
		t.Fatalf("create topic: %v %v", err, resp)
	}
	cfg := consumer.Config{Scope: "g", Store: e.store, Handler: newApplier(e.appliesTable()).handler()}
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{Reader: readerConfig(t, randomName("g-"), topic)})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Run(e.ctx, src)
	if !errors.Is(err, consumer.ErrUnboundedRedelivery) || !strings.Contains(err.Error(), "AcceptUnboundedRedelivery") {
		t.Fatalf("Run = %v, want ErrUnboundedRedelivery naming AcceptUnboundedRedelivery", err)
	}

	// Accepted: Run starts, and returns nil when its context ends (a
	// refusal or a failed horizon check would return an error).
	cfg.AcceptUnboundedRedelivery = true
	c, err = consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	src, err = kafkaadapter.NewSource(kafkaadapter.Config{Reader: readerConfig(t, randomName("g-"), topic)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	if err := c.Run(ctx, src); err != nil {
		t.Fatalf("Run with AcceptUnboundedRedelivery = %v, want a start and a clean stop", err)
	}
}
