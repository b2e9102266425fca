package kafkaadapter

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/idemq/idemq/internal/kafkaadmin"
	"github.com/segmentio/kafka-go"
)

// EnsureTopics creates each topic with partitions partitions and replication
// factor 1 unless it exists, then waits up to 30s until every partition's
// leader serves it (answers ListOffsets without error): right after
// CreateTopics a broker can list itself as leader while it still answers
// produce requests with NOT_LEADER_OR_FOLLOWER. Topics must exist before a
// Reader joins or a Writer (AllowAutoTopicCreation false, kafka-go's
// default) writes. It needs kafka-go >= v0.4.48 against Kafka 4.x. It returns
// an error naming the last problem seen when a topic cannot be created or is
// not ready in time, or ctx's error. outbox/kafkapub (Config.CreateTopics)
// uses the same code.
func EnsureTopics(ctx context.Context, brokers []string, partitions int, topics ...string) error {
	return kafkaadmin.EnsureTopics(ctx, brokers, partitions, topics...)
}

// GroupLag returns how many messages of topic the consumer group has not
// committed yet: the sum over partitions of (last offset − committed offset),
// counting a partition with no commit from its first offset. It is what a
// caller polls to know a group has caught up (0).
func GroupLag(ctx context.Context, brokers []string, group, topic string) (int64, error) {
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return 0, fmt.Errorf("idemq/kafkaadapter: metadata: %w", err)
	}
	if len(md.Topics) != 1 || md.Topics[0].Error != nil {
		return 0, fmt.Errorf("idemq/kafkaadapter: topic %s not found", topic)
	}
	var parts []int
	var reqs []kafka.OffsetRequest
	for _, p := range md.Topics[0].Partitions {
		parts = append(parts, p.ID)
		reqs = append(reqs, kafka.FirstOffsetOf(p.ID), kafka.LastOffsetOf(p.ID))
	}
	lo, err := cl.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return 0, fmt.Errorf("idemq/kafkaadapter: list offsets: %w", err)
	}
	first, last := map[int]int64{}, map[int]int64{}
	for _, po := range lo.Topics[topic] {
		if po.Error != nil {
			return 0, fmt.Errorf("idemq/kafkaadapter: list offsets %s/%d: %w", topic, po.Partition, po.Error)
		}
		first[po.Partition], last[po.Partition] = po.FirstOffset, po.LastOffset
	}
	of, err := cl.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	if err != nil {
		return 0, fmt.Errorf("idemq/kafkaadapter: offset fetch: %w", err)
	}
	if of.Error != nil {
		return 0, fmt.Errorf("idemq/kafkaadapter: offset fetch: %w", of.Error)
	}
	var lag int64
	committed := map[int]int64{}
	for _, p := range of.Topics[topic] {
		committed[p.Partition] = p.CommittedOffset
	}
	for _, p := range parts {
		c, ok := committed[p]
		if !ok || c < 0 {
			c = first[p]
		}
		if last[p] > c {
			lag += last[p] - c
		}
	}
	return lag, nil
}

// TopicRetention returns the topic's retention.ms as a duration: how far
// back a consumer group can be made to replay, and so the redelivery horizon
// that dedup retention must cover. It returns (0, nil) for
// retention.ms = -1 (unbounded), which no record retention can cover.
func TopicRetention(ctx context.Context, brokers []string, topic string) (time.Duration, error) {
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	resp, err := cl.DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{Resources: []kafka.DescribeConfigRequestResource{{
		ResourceType: kafka.ResourceTypeTopic, ResourceName: topic, ConfigNames: []string{"retention.ms"}}}})
	if err != nil {
		return 0, fmt.Errorf("idemq/kafkaadapter: describe %s: %w", topic, err)
	}
	for _, r := range resp.Resources {
		if r.Error != nil {
			return 0, fmt.Errorf("idemq/kafkaadapter: describe %s: %w", topic, r.Error)
		}
		for _, c := range r.ConfigEntries {
			if c.ConfigName != "retention.ms" {
				continue
			}
			ms, err := strconv.ParseInt(c.ConfigValue, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("idemq/kafkaadapter: %s retention.ms %q: %w", topic, c.ConfigValue, err)
			}
			if ms < 0 {
				return 0, nil
			}
			return time.Duration(ms) * time.Millisecond, nil
		}
	}
	return 0, fmt.Errorf("idemq/kafkaadapter: %s has no retention.ms", topic)
}
