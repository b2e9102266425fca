package kafkaadapter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/idemq/idemq/broker/kafkasec"
	"github.com/idemq/idemq/internal/kafkaadmin"
	"github.com/segmentio/kafka-go"
)

// ErrHorizonCheckDenied is wrapped by the error of TopicRetentionWith (and
// so of Source.RedeliveryHorizon and consumer.Run) when the broker refuses
// the DescribeConfigs request for authorization (TopicAuthorizationFailed,
// ClusterAuthorizationFailed): the principal lacks the DescribeConfigs ACL
// on the topic. Grant it, or state the horizon in
// Config.RedeliveryHorizon.
var ErrHorizonCheckDenied = errors.New("idemq/kafkaadapter: redelivery horizon check denied")

// EnsureTopics is EnsureTopicsWith over PLAINTEXT (kafka.DefaultTransport).
func EnsureTopics(ctx context.Context, brokers []string, partitions int, topics ...string) error {
	return EnsureTopicsWith(ctx, nil, brokers, partitions, topics...)
}

// EnsureTopicsWith creates each topic with partitions partitions and
// replication factor 1 unless it exists, then waits up to 30s until every
// partition's leader serves it (answers ListOffsets without error): right
// after CreateTopics a broker can list itself as leader while it still
// answers produce requests with NOT_LEADER_OR_FOLLOWER. Topics must exist
// before a Reader joins or a Writer (AllowAutoTopicCreation false,
// kafka-go's default) writes. It needs kafka-go >= v0.4.48 against Kafka
// 4.x. rt carries the TLS/SASL settings (kafkasec.Config.Transport, or
// kafkasec.TransportFromDialer of a Reader's Dialer); nil means
// kafka.DefaultTransport (PLAINTEXT). The principal needs Create on the
// topics (or the cluster) and Describe on them. It returns an error naming
// the last problem seen when a topic cannot be created or is not ready in
// time (a refused login or security-protocol mismatch wraps
// kafkasec.ErrAuthentication or kafkasec.ErrSecurityMismatch), or ctx's
// error. outbox/kafkapub (Config.CreateTopics) uses the same code.
func EnsureTopicsWith(ctx context.Context, rt kafka.RoundTripper, brokers []string, partitions int, topics ...string) error {
	return kafkaadmin.EnsureTopics(ctx, rt, brokers, partitions, topics...)
}

// GroupLag is GroupLagWith over PLAINTEXT (kafka.DefaultTransport).
func GroupLag(ctx context.Context, brokers []string, group, topic string) (int64, error) {
	return GroupLagWith(ctx, nil, brokers, group, topic)
}

// GroupLagWith returns how many messages of topic the consumer group has
// not committed yet: the sum over partitions of (last offset − committed
// offset), counting a partition with no commit from its first offset. It
// is what a caller polls to know a group has caught up (0). rt carries the
// TLS/SASL settings as for EnsureTopicsWith (nil: PLAINTEXT); the principal
// needs Describe on the topic and the group.
func GroupLagWith(ctx context.Context, rt kafka.RoundTripper, brokers []string, group, topic string) (int64, error) {
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: rt}
	md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return 0, fmt.Errorf("idemq/kafkaadapter: metadata: %w", kafkasec.ExplainWith(ctx, rt, brokers, err))
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
		return 0, fmt.Errorf("idemq/kafkaadapter: list offsets: %w", kafkasec.ExplainWith(ctx, rt, brokers, err))
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
		return 0, fmt.Errorf("idemq/kafkaadapter: offset fetch: %w", kafkasec.ExplainWith(ctx, rt, brokers, err))
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

// TopicRetention is TopicRetentionWith over PLAINTEXT
// (kafka.DefaultTransport).
func TopicRetention(ctx context.Context, brokers []string, topic string) (time.Duration, error) {
	return TopicRetentionWith(ctx, nil, brokers, topic)
}

// TopicRetentionWith returns the topic's retention.ms as a duration: how
// far back a consumer group can be made to replay, and so the redelivery
// horizon that dedup retention must cover. It returns (0, nil) for
// retention.ms = -1 (unbounded), which no record retention can cover. It
// sends a DescribeConfigs request through rt (TLS/SASL as for
// EnsureTopicsWith; nil: PLAINTEXT), so the principal needs the
// DescribeConfigs ACL on the topic; when the broker refuses it for
// authorization the error wraps ErrHorizonCheckDenied and the Kafka error.
func TopicRetentionWith(ctx context.Context, rt kafka.RoundTripper, brokers []string, topic string) (time.Duration, error) {
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: rt}
	resp, err := cl.DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{Resources: []kafka.DescribeConfigRequestResource{{
		ResourceType: kafka.ResourceTypeTopic, ResourceName: topic, ConfigNames: []string{"retention.ms"}}}})
	if err == nil && resp != nil {
		for _, r := range resp.Resources {
			if r.Error != nil {
				err = r.Error
				break
			}
		}
	}
	if err != nil {
		if errors.Is(err, kafka.TopicAuthorizationFailed) || errors.Is(err, kafka.ClusterAuthorizationFailed) {
			return 0, fmt.Errorf("%w: topic %s: the principal lacks the DescribeConfigs ACL on topic %s; grant it, or state the horizon in kafkaadapter.Config.RedeliveryHorizon (at least the topic's retention.ms): %w",
				ErrHorizonCheckDenied, topic, topic, err)
		}
		return 0, fmt.Errorf("idemq/kafkaadapter: describe %s: %w", topic, kafkasec.ExplainWith(ctx, rt, brokers, err))
	}
	for _, r := range resp.Resources {
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
