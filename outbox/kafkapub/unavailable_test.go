package kafkapub

import (
	"crypto/tls"
	"fmt"
	"testing"

	"github.com/idemq/idemq/broker/kafkasec"
	"github.com/idemq/idemq/outbox"
	"github.com/segmentio/kafka-go"
)

// Kafka codes of a cluster that cannot take the write are the broker's;
// codes about the row or its topic are the row's.
func TestClassify(t *testing.T) {
	for code, want := range map[kafka.Error]bool{
		kafka.LeaderNotAvailable:       true,
		kafka.NotLeaderForPartition:    true,
		kafka.NotEnoughReplicas:        true,
		kafka.BrokerNotAvailable:       true,
		kafka.RequestTimedOut:          true,
		kafka.MessageSizeTooLarge:      false,
		kafka.InvalidTopic:             false,
		kafka.TopicAuthorizationFailed: false,
		kafka.UnknownTopicOrPartition:  false,
		kafka.InvalidRecord:            false,
	} {
		err := classify(fmt.Errorf("produce t/0: %w", code))
		if got := outbox.IsUnavailable(err); got != want {
			t.Errorf("%v: IsUnavailable %v, want %v", code, got, want)
		}
	}
	if outbox.IsUnavailable(classify(fmt.Errorf("%w: 2000000 bytes", ErrTooLarge))) {
		t.Error("ErrTooLarge classified as unavailable")
	}
}

// A refused SASL login or a TLS/SASL mismatch is the Publisher's settings'
// fault, not a row's: the relay must pause, not park rows.
func TestClassifySecurityErrors(t *testing.T) {
	for _, err := range []error{
		kafkasec.Explain(fmt.Errorf("metadata: %w", kafka.SASLAuthenticationFailed)),
		kafkasec.Explain(kafka.UnsupportedSASLMechanism),
		kafkasec.Explain(tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}),
	} {
		if !outbox.IsUnavailable(classify(err)) {
			t.Errorf("%v: classified as a row error (rows would be parked)", err)
		}
	}
}
