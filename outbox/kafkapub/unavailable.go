package kafkapub

import (
	"errors"

	"github.com/idemq/idemq/broker/kafkasec"
	"github.com/idemq/idemq/outbox"
	"github.com/segmentio/kafka-go"
)

// unavailableCodes are the Kafka error codes that say the cluster cannot
// take the write now (no leader, too few in-sync replicas, a broker or its
// storage down, a timeout, throttling), not that the row is wrong. They are
// wrapped with outbox.Unavailable, so the relay pauses instead of counting
// an attempt. Every other code (MessageSizeTooLarge, InvalidTopic,
// TopicAuthorizationFailed, UnknownTopicOrPartition, InvalidRecord, …) is a
// row error.
var unavailableCodes = map[kafka.Error]bool{
	kafka.LeaderNotAvailable:           true,
	kafka.NotLeaderForPartition:        true,
	kafka.RequestTimedOut:              true,
	kafka.BrokerNotAvailable:           true,
	kafka.ReplicaNotAvailable:          true,
	kafka.NetworkException:             true,
	kafka.NotEnoughReplicas:            true,
	kafka.NotEnoughReplicasAfterAppend: true,
	kafka.KafkaStorageError:            true,
	kafka.NotController:                true,
	kafka.PreferredLeaderNotAvailable:  true,
	kafka.EligibleLeadersNotAvailable:  true,
	kafka.FencedLeaderEpoch:            true,
	kafka.UnknownLeaderEpoch:           true,
	kafka.ThrottlingQuotaExceeded:      true,
}

// classify wraps err with outbox.Unavailable when it is a Kafka error code
// of unavailableCodes, or a refused SASL login or security-protocol
// mismatch (kafkasec.ErrAuthentication, kafkasec.ErrSecurityMismatch, as
// kafkasec.Explain marks them: the Publisher's settings are wrong, not a
// row, so no row may be parked for it); transport errors (connection
// refused, I/O timeouts, the publish's deadline) need no wrapping:
// outbox.IsUnavailable knows them.
func classify(err error) error {
	var code kafka.Error
	if errors.As(err, &code) && unavailableCodes[code] ||
		errors.Is(err, kafkasec.ErrAuthentication) || errors.Is(err, kafkasec.ErrSecurityMismatch) {
		return outbox.Unavailable(err)
	}
	return err
}
