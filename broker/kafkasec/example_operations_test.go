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

// The snippets of docs/operations.md, "Secured Kafka": a CA file and a
// SCRAM-SHA-512 login with the password from the environment; the
// consumer's Dialer and the relay's Transport from one Config; and a
// horizon stated by configuration for a consumer without the
// DescribeConfigs ACL.
func ExampleConfig_operations() {
	sec := kafkasec.Config{
		TLS: kafkasec.TLS{CAFile: "/etc/kafka/ca.pem"}, // + CertFile/KeyFile for mutual TLS
		SASL: kafkasec.SASL{Mechanism: kafkasec.ScramSHA512, Username: "orders-consumer",
			Password: os.Getenv("KAFKA_PASSWORD")},
	}
	dialer, err := sec.Dialer()       // consumer: kafka.ReaderConfig{Dialer: dialer}
	transport, err := sec.Transport() // relay: kafkapub.Config{Transport: transport}
	if err != nil {
		fmt.Println(err)
		return
	}
	rc := kafka.ReaderConfig{Brokers: []string{"127.0.0.1:9094"}, GroupID: "orders", Topic: "orders", Dialer: dialer}
	cfg := kafkaadapter.Config{Reader: rc, RedeliveryHorizon: 7 * 24 * time.Hour}
	_ = kafkapub.Config{Brokers: rc.Brokers, Transport: transport}
	fmt.Println(cfg.RedeliveryHorizon)
}
