package rocketmqadapter

import "github.com/apache/rocketmq-client-go/v2/primitive"

// systemProperties are the properties the RocketMQ client and a 5.x broker
// set on a message themselves (primitive.Property*, and the broker's own
// MessageConst names), which a re-published copy must not carry over: an old
// UNIQ_KEY, delay level, retry topic or queue offset would describe the
// stored copy, not the new message.
var systemProperties = map[string]bool{
	primitive.PropertyKeys: true, primitive.PropertyWaitStoreMsgOk: true, primitive.PropertyDelayTimeLevel: true,
	primitive.PropertyRetryTopic: true, primitive.PropertyTimerDeliverMS: true, primitive.PropertyRealTopic: true,
	primitive.PropertyRealQueueId: true, primitive.PropertyTransactionPrepared: true, primitive.PropertyProducerGroup: true,
	primitive.PropertyMinOffset: true, primitive.PropertyMaxOffset: true, primitive.PropertyBuyerId: true,
	primitive.PropertyOriginMessageId: true, primitive.PropertyTransferFlag: true, primitive.PropertyCorrectionFlag: true,
	primitive.PropertyMQ2Flag: true, primitive.PropertyReconsumeTime: true, primitive.PropertyMsgRegion: true,
	primitive.PropertyTraceSwitch: true, primitive.PropertyUniqueClientMessageIdKeyIndex: true,
	primitive.PropertyMaxReconsumeTimes: true, primitive.PropertyConsumeStartTime: true,
	primitive.PropertyTranscationPreparedQueueOffset: true, primitive.PropertyTranscationCheckTimes: true,
	primitive.PropertyCheckImmunityTimeInSeconds: true, primitive.PropertyShardingKey: true,
	primitive.PropertyTransactionID: true, primitive.PropertyCorrelationID: true,
	primitive.PropertyMessageReplyToClient: true, primitive.PropertyMessageTTL: true,
	primitive.PropertyReplyMessageArriveTime: true, primitive.PropertyMsgType: true, primitive.PropertyCluster: true,
	// Set by 5.x brokers (org.apache.rocketmq.common.message.MessageConst).
	"__STARTDELIVERTIME": true, "TIMER_DELAY_SEC": true, "TIMER_DELAY_MS": true, "TIMER_OUT_MS": true,
	"TIMER_ENQUEUE_MS": true, "TIMER_DEQUEUE_MS": true, "TIMER_ROLL_TIMES": true, "TIMER_DEL_UNIQKEY": true,
	"INNER_MULTI_DISPATCH": true, "INNER_MULTI_QUEUE_OFFSET": true, "INNER_NUM": true, "__BORNHOST": true,
	"bname": true, "__SHARDINGKEY": true, "POP_CK": true, "POP_CK_OFFSET": true, "1ST_POP_TIME": true,
	"DUP_INFO": true, "EXTEND_UNIQ_INFO": true, "TRACE_CONTEXT": true, "CLIENT_ID": true,
}

// UserProperties returns the properties of a received message (a
// dedup.Message's Headers, a dead letter's Headers) without the system
// properties the client and the broker set themselves (UNIQ_KEY, KEYS,
// DELAY, RETRY_TOPIC, REAL_TOPIC, MIN_OFFSET, …): what a producer may set
// again when it re-publishes the message. TAGS is kept (consumers may
// filter on it); Keys travel separately (dedup.Message.Key). It returns a
// new map; nil for nil.
func UserProperties(props map[string]string) map[string]string {
	if props == nil {
		return nil
	}
	out := make(map[string]string, len(props))
	for k, v := range props {
		if !systemProperties[k] {
			out[k] = v
		}
	}
	return out
}
