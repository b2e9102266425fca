package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemq/idemq/wire"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
)

// kafkaBrokers are the brokers of scripts/services.sh (TEST_KAFKA_BROKERS).
func kafkaBrokers() []string {
	return strings.Split(env("TEST_KAFKA_BROKERS", "127.0.0.1:9092"), ",")
}

// produce writes n messages to topic: message ID "<prefix>-<i>" in the
// message-ID header, key "k-<i mod keys>", value "<i>", in order (acks=all).
func produce(ctx context.Context, brokers []string, topic, prefix string, n, keys int) error {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return produceIDs(ctx, brokers, topic, prefix, idx, keys)
}

// produceRange is produce for the messages lo to hi-1.
func produceRange(ctx context.Context, brokers []string, topic, prefix string, lo, hi, keys int) error {
	idx := make([]int, 0, max(0, hi-lo))
	for i := lo; i < hi; i++ {
		idx = append(idx, i)
	}
	return produceIDs(ctx, brokers, topic, prefix, idx, keys)
}

// produceIDs is produce for the messages numbered idx, in that order: a
// number given twice is two copies of one message (same ID, key and value).
func produceIDs(ctx context.Context, brokers []string, topic, prefix string, idx []int, keys int) error {
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: 5 * time.Millisecond, BatchSize: 500}
	defer func() { _ = w.Close() }()
	const chunk = 500
	for lo := 0; lo < len(idx); lo += chunk {
		var msgs []kafka.Message
		for _, i := range idx[lo:min(len(idx), lo+chunk)] {
			msgs = append(msgs, kafka.Message{Key: []byte(fmt.Sprintf("k-%d", i%keys)), Value: []byte(strconv.Itoa(i)),
				Headers: []kafka.Header{{Key: wire.MessageIDHeader, Value: []byte(fmt.Sprintf("%s-%d", prefix, i))}}})
		}
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			return fmt.Errorf("produce to %s: %w", topic, err)
		}
	}
	return nil
}

// topicContents is what a topic holds, read from its first offset to its
// end: copies per message ID, and per key the values in the order read.
type topicContents struct {
	messages int
	copies   map[string]int
	byKey    map[string][]int
}

// orderFaults counts the keys whose values, first copies only, do not
// ascend: a later message of the key published before an earlier one.
func (c topicContents) orderFaults() int {
	faults := 0
	for _, vs := range c.byKey {
		seen := map[int]bool{}
		last := -1
		for _, v := range vs {
			if seen[v] {
				continue // a republished copy: order is about first copies
			}
			seen[v] = true
			if v < last {
				faults++
				break
			}
			last = v
		}
	}
	return faults
}

// readTopic reads every partition of topic to its end offset, asking the
// brokers in turn for the partitions and their leaders.
func readTopic(ctx context.Context, brokers []string, topic string) (topicContents, error) {
	out := topicContents{copies: map[string]int{}, byKey: map[string][]int{}}
	var parts []kafka.Partition
	var err error
	for _, b := range brokers { // the first broker that answers
		var conn *kafka.Conn
		if conn, err = kafka.DialContext(ctx, "tcp", b); err == nil {
			parts, err = conn.ReadPartitions(topic)
			_ = conn.Close()
		}
		if err == nil {
			break
		}
	}
	if err != nil {
		return out, err
	}
	for _, p := range parts {
		var lo, hi int64
		for _, b := range brokers {
			var lc *kafka.Conn
			if lc, err = kafka.DialLeader(ctx, "tcp", b, topic, p.ID); err == nil {
				lo, hi, err = lc.ReadOffsets()
				_ = lc.Close()
			}
			if err == nil {
				break
			}
		}
		if err != nil {
			return out, err
		}
		if hi <= lo {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p.ID, MaxWait: 100 * time.Millisecond})
		if err := r.SetOffset(lo); err != nil {
			return out, err
		}
		for {
			rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			m, err := r.ReadMessage(rctx)
			cancel()
			if err != nil {
				_ = r.Close()
				return out, fmt.Errorf("read %s/%d: %w", topic, p.ID, err)
			}
			out.messages++
			for _, h := range m.Headers {
				if h.Key == wire.MessageIDHeader {
					out.copies[string(h.Value)]++
				}
			}
			if v, err := strconv.Atoi(string(m.Value)); err == nil {
				out.byKey[string(m.Key)] = append(out.byKey[string(m.Key)], v)
			}
			if m.Offset >= hi-1 {
				break
			}
		}
		_ = r.Close()
	}
	return out, nil
}

// groupLag is the sum over topic's partitions of end offset minus the
// group's committed offset (an uncommitted partition counts whole).
func groupLag(ctx context.Context, brokers []string, group, topic string) (int64, error) {
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	meta, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return 0, err
	}
	if len(meta.Topics) != 1 || meta.Topics[0].Error != nil {
		return 0, fmt.Errorf("metadata of %s: %v", topic, meta.Topics)
	}
	var ids []int
	var reqs []kafka.OffsetRequest
	for _, p := range meta.Topics[0].Partitions {
		ids = append(ids, p.ID)
		reqs = append(reqs, kafka.LastOffsetOf(p.ID))
	}
	ends, err := cl.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return 0, err
	}
	committed, err := cl.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
	if err != nil {
		return 0, err
	}
	if committed.Error != nil {
		return 0, committed.Error
	}
	at := map[int]int64{}
	for _, p := range committed.Topics[topic] {
		if p.Error != nil {
			return 0, p.Error
		}
		at[p.Partition] = p.CommittedOffset
	}
	var lag int64
	for _, p := range ends.Topics[topic] {
		if p.Error != nil {
			return 0, p.Error
		}
		lag += p.LastOffset - max(at[p.Partition], 0)
	}
	return lag, nil
}

// relayCheck is the relay's outcome: an outbox table against the topic its
// rows were relayed to, both read after the run.
type relayCheck struct {
	outboxRows  int // rows in the outbox table
	unpublished int // of which not marked published
	published   int // distinct message IDs on the topic
	copies      int // messages on the topic beyond the first copy of each ID
	phantoms    int // message IDs on the topic with no outbox row (a lost commit)
	missing     int // outbox rows whose message is not on the topic
	orderFaults int // keys whose first copies on the topic do not ascend
	topic       topicContents
}

// checkRelay reads outbox (a sanitized table name) and topic and compares
// them by message ID (the row's id, published in the message-ID header).
func checkRelay(ctx context.Context, pool *pgxpool.Pool, outbox string, brokers []string, topic string) (relayCheck, error) {
	var rc relayCheck
	ids := map[string]bool{}
	rows, err := pool.Query(ctx, `select id::text, published_at is null from `+outbox)
	if err != nil {
		return rc, err
	}
	for rows.Next() {
		var id string
		var unpublished bool
		if err := rows.Scan(&id, &unpublished); err != nil {
			return rc, err
		}
		ids[id] = true
		if unpublished {
			rc.unpublished++
		}
	}
	if err := rows.Err(); err != nil {
		return rc, err
	}
	rc.outboxRows = len(ids)
	if rc.topic, err = readTopic(ctx, brokers, topic); err != nil {
		return rc, err
	}
	rc.published = len(rc.topic.copies)
	rc.copies = rc.topic.messages - len(rc.topic.copies)
	for id := range rc.topic.copies {
		if !ids[id] {
			rc.phantoms++
		}
	}
	for id := range ids {
		if rc.topic.copies[id] == 0 {
			rc.missing++
		}
	}
	rc.orderFaults = rc.topic.orderFaults()
	return rc, nil
}
