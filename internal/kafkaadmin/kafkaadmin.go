package kafkaadmin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/broker/kafkasec"
	"github.com/segmentio/kafka-go"
)

// EnsureTopics creates each topic with partitions partitions and replication
// factor 1 unless it exists. Topics must exist before a Reader joins or a
// Writer (AllowAutoTopicCreation false, kafka-go's default) writes. It uses
// the CreateTopics API through kafka.Client, which kafka-go >= v0.4.48 speaks
// in a version Kafka 4.x accepts, then waits up to 30s until every partition
// of every topic is served by its leader: the metadata names a leader and
// that leader answers a ListOffsets request without error. (Right after
// CreateTopics a broker can already list itself as leader in its metadata
// while it still answers produce requests with NOT_LEADER_OR_FOLLOWER.)
// It returns an error naming the last problem seen when a topic cannot be
// created or is not ready in time, or ctx's error. rt carries the TLS/SASL
// settings (nil: kafka.DefaultTransport, PLAINTEXT); a refused login or a
// security-protocol mismatch is explained by kafkasec.ExplainWith.
func EnsureTopics(ctx context.Context, rt kafka.RoundTripper, brokers []string, partitions int, topics ...string) error {
	if len(brokers) == 0 || partitions < 1 {
		return errors.New("idemq/kafka: EnsureTopics needs brokers and partitions >= 1")
	}
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: rt}
	req := &kafka.CreateTopicsRequest{}
	for _, t := range topics {
		req.Topics = append(req.Topics, kafka.TopicConfig{Topic: t, NumPartitions: partitions, ReplicationFactor: 1})
	}
	resp, err := cl.CreateTopics(ctx, req)
	if err != nil {
		return fmt.Errorf("idemq/kafka: create topics: %w", kafkasec.ExplainWith(ctx, rt, brokers, err))
	}
	for t, terr := range resp.Errors {
		if terr != nil && !errors.Is(terr, kafka.TopicAlreadyExists) {
			return fmt.Errorf("idemq/kafka: create topic %s: %w", t, kafkasec.Explain(terr))
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := topicsServed(ctx, cl, topics)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("idemq/kafka: topics %v not ready after 30s: %w", topics, kafkasec.ExplainWith(ctx, rt, brokers, err))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// topicsServed returns nil when every partition of topics has a leader in
// the metadata and that leader lists the partition's offsets, else the first
// problem found.
func topicsServed(ctx context.Context, cl *kafka.Client, topics []string) error {
	md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
	if err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	if len(md.Topics) != len(topics) {
		return fmt.Errorf("metadata lists %d of %d topics", len(md.Topics), len(topics))
	}
	probe := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for _, t := range md.Topics {
		if t.Error != nil {
			return fmt.Errorf("topic %s: %w", t.Name, t.Error)
		}
		if len(t.Partitions) == 0 {
			return fmt.Errorf("topic %s: no partitions yet", t.Name)
		}
		for _, p := range t.Partitions {
			if p.Error != nil || p.Leader.Host == "" {
				return fmt.Errorf("topic %s partition %d: no leader yet (%v)", t.Name, p.ID, p.Error)
			}
			probe.Topics[t.Name] = append(probe.Topics[t.Name], kafka.FirstOffsetOf(p.ID))
		}
	}
	offs, err := cl.ListOffsets(ctx, probe)
	if err != nil {
		return fmt.Errorf("list offsets: %w", err)
	}
	for t, parts := range probe.Topics {
		if len(offs.Topics[t]) != len(parts) {
			return fmt.Errorf("topic %s: offsets of %d of %d partitions listed", t, len(offs.Topics[t]), len(parts))
		}
		for _, p := range offs.Topics[t] {
			if p.Error != nil {
				return fmt.Errorf("topic %s partition %d: %w", t, p.Partition, p.Error)
			}
		}
	}
	return nil
}
