package consumer

import "github.com/idemq/idemq/dedup"

// MessageObserver is an optional interface of a Metrics: when implemented,
// the consumer also passes each delivery's message and result, right after
// Delivery (and ObserveReason), so that a broker adapter can count per
// broker queue. msg carries the broker fields (Topic, Partition, Offset,
// Source: the position of the stored copy, ReconsumeTimes) and the
// identity; it must not be modified or kept. Like Delivery it is called once
// per attempt of a delivery retried in place, then once for the final
// outcome.
type MessageObserver interface {
	ObserveMessage(scope string, msg *dedup.Message, res dedup.Result)
}
