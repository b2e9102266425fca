package rocketmqadapter

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/wire"
)

// RetryTopicPrefix starts the name of a consumer group's retry topic,
// "%RETRY%<group>", which holds the copies the broker redelivers.
const RetryTopicPrefix = "%RETRY%"

// Position is the position identity of one stored copy of a message:
// "rocketmq:<topic>/<brokerName>/<queueId>/<queueOffset>", where topic is the
// queue's topic (%RETRY%<group> for a retry copy). It is stable across
// redelivery of that stored copy only.
func Position(topic, brokerName string, queueID int, queueOffset int64) string {
	return "rocketmq:" + topic + "/" + brokerName + "/" + strconv.Itoa(queueID) + "/" + strconv.FormatInt(queueOffset, 10)
}

// MessageID returns the message ID of m under the rules of the package
// documentation: the property prop ("" means wire.MessageIDHeader) when
// set, else the UNIQ_KEY property, else MsgId unless it is only the
// OffsetMsgId fallback; "" when none applies (the position is then used).
// A blank value (wire.IsBlank: "", " ", "\t" …) counts as not set at every
// step, so a blank message-id property falls back to the UNIQ_KEY.
func MessageID(m *primitive.MessageExt, prop string) string {
	if m == nil {
		return ""
	}
	if prop == "" {
		prop = wire.MessageIDHeader
	}
	if v := m.GetProperty(prop); !wire.IsBlank(v) {
		return v
	}
	if v := m.GetProperty(primitive.PropertyUniqueClientMessageIdKeyIndex); !wire.IsBlank(v) {
		return v
	}
	if !wire.IsBlank(m.MsgId) && m.MsgId != m.OffsetMsgId {
		return m.MsgId
	}
	return ""
}

// ToDelivery converts a message received by a push listener into a
// consumer.Delivery. prop names the message-ID property ("" means
// wire.MessageIDHeader). The queue is m.Queue (set by the client); a
// message without one is placed on queue 0 of its own topic with an empty
// broker name. Message.Topic is the original topic (for a retry copy whose
// topic is still %RETRY%<group>, the RETRY_TOPIC property); Key is the Keys
// property; Headers hold every property; Partition is the queue ID; Offset
// the queue offset; Time the born timestamp; ReconsumeTimes the copy's
// counter. Ack holds m.
func ToDelivery(m *primitive.MessageExt, prop string) consumer.Delivery {
	return toDelivery(m, nil, prop)
}

func toDelivery(m *primitive.MessageExt, ctxQueue *primitive.MessageQueue, prop string) consumer.Delivery {
	var q primitive.MessageQueue
	switch {
	case m.Queue != nil:
		q = *m.Queue
	case ctxQueue != nil:
		q = *ctxQueue
	default:
		q = primitive.MessageQueue{Topic: m.Topic}
	}
	topic := m.Topic
	if rt := m.GetProperty(primitive.PropertyRetryTopic); rt != "" && strings.HasPrefix(topic, RetryTopicPrefix) {
		topic = rt
	}
	if q.Topic == "" {
		q.Topic = m.Topic
	}
	pos := Position(q.Topic, q.BrokerName, q.QueueId, m.QueueOffset)
	var t time.Time
	switch {
	case m.BornTimestamp > 0:
		t = time.UnixMilli(m.BornTimestamp)
	case m.StoreTimestamp > 0:
		t = time.UnixMilli(m.StoreTimestamp)
	}
	var key []byte
	if k := m.GetKeys(); k != "" {
		key = []byte(k)
	}
	return consumer.Delivery{
		Message: &dedup.Message{
			Topic:          topic,
			Key:            key,
			Payload:        m.Body,
			Headers:        m.GetProperties(),
			Source:         pos,
			Partition:      q.QueueId,
			Offset:         m.QueueOffset,
			ReconsumeTimes: m.ReconsumeTimes,
			Time:           t,
		},
		MessageID: MessageID(m, prop),
		Position:  pos,
		Lane:      q.Topic + "/" + q.BrokerName + "/" + strconv.Itoa(q.QueueId),
		Offset:    m.QueueOffset,
		Ack:       m,
	}
}

// ErrNoBusinessKey is returned by BusinessKeyFromProperty's extractor when
// the property is required and absent.
var ErrNoBusinessKey = errors.New("idemq/rocketmqadapter: business key property missing")

// BusinessKeyFromKeys is a consumer.BusinessKeyFunc that uses the first of
// the message Keys (the KEYS property, space-separated, set by the producer
// with primitive.Message.WithKeys) as the business key, "" when the message
// has none. Use it only when producers put one business intent per key
// (e.g. an order ID), never a partitioning key shared by many intents.
func BusinessKeyFromKeys(msg *dedup.Message) (string, error) {
	if msg == nil || len(msg.Key) == 0 {
		return "", nil
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(msg.Key)), primitive.PropertyKeySeparator)
	return first, nil
}

// BusinessKeyFromProperty returns a consumer.BusinessKeyFunc reading the
// business key from user property name. A blank value (dedup.IsBlank) is
// absent. When required is true a message without it is bad input
// (dead-lettered with reason bad_input, error wrapping ErrNoBusinessKey);
// otherwise it has no business key ("").
func BusinessKeyFromProperty(name string, required bool) consumer.BusinessKeyFunc {
	return func(msg *dedup.Message) (string, error) {
		v := msg.Header(name)
		if dedup.IsBlank(v) {
			if required {
				return "", errors.Join(ErrNoBusinessKey, errors.New("property "+strconv.Quote(name)))
			}
			return "", nil
		}
		return v, nil
	}
}

var instanceSeq atomic.Int64

// InstanceName returns a client instance name unique to this process and
// call: "<prefix>-<pid>-<n>-<random hex>", using only characters RocketMQ
// accepts in names. Give one to every producer, consumer and admin client:
// clients sharing an instance name share one internal client, and shutting
// one down breaks the others.
func InstanceName(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	if prefix == "" {
		prefix = "idemq"
	}
	return prefix + "-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(instanceSeq.Add(1), 10) + "-" + hex.EncodeToString(b)
}
