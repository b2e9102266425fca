package kafkasec_test

import (
	"fmt"
	"os"
	"time"

	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/broker/kafkasec"
	"github.com/idemq/idemq/outbox/kafkapub"
	"github.com/segmentio/kafka-go"
)

// securedConfigs holds the snippets of docs/operations.md, "Secured Kafka":
// a CA file and a SCRAM-SHA-512 login with the password from the
// environment; the consumer's Dialer and the relay's Transport from one
// Config; and a horizon stated by configuration for a consumer without the
// DescribeConfigs ACL.
func securedConfigs() (kafkaadapter.Config, kafkapub.Config, error) {
	sec := kafkasec.Config{
		TLS: kafkasec.TLS{CAFile: "/etc/kafka/ca.pem"}, // + CertFile/KeyFile for mutual TLS
		SASL: kafkasec.SASL{Mechanism: kafkasec.ScramSHA512, Username: "orders-consumer",
			Password: os.Getenv("KAFKA_PASSWORD")},
	}
	dialer, err := sec.Dialer() // consumer: kafka.ReaderConfig{Dialer: dialer}
	if err != nil {
		return kafkaadapter.Config{}, kafkapub.Config{}, err // names the field, never the password
	}
	transport, err := sec.Transport() // relay: kafkapub.Config{Transport: transport}
	if err != nil {
		return kafkaadapter.Config{}, kafkapub.Config{}, err
	}
	rc := kafka.ReaderConfig{Brokers: []string{"127.0.0.1:9094"}, GroupID: "orders", Topic: "orders", Dialer: dialer}
	src := kafkaadapter.Config{Reader: rc, RedeliveryHorizon: 7 * 24 * time.Hour}
	return src, kafkapub.Config{Brokers: rc.Brokers, Transport: transport}, nil
}

// A consumer and a relay on a secured cluster (the CA file here does not
// exist, so building the settings fails with an error naming the field).
func ExampleConfig_operations() {
	if _, _, err := securedConfigs(); err != nil {
		fmt.Println("secured Kafka settings refused")
	}
}
