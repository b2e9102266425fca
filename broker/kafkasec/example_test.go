package kafkasec_test

import (
	"fmt"
	"time"

	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/broker/kafkasec"
	"github.com/idemq/idemq/outbox/kafkapub"
	"github.com/segmentio/kafka-go"
)

// One Config gives the consumer's Reader its Dialer (its group, partition
// readers and redelivery horizon check then use TLS and SCRAM) and the
// relay's publisher its Transport.
func Example() {
	sec := kafkasec.Config{
		TLS: kafkasec.TLS{Enabled: true}, // the system roots verify the brokers; or CAFile
		SASL: kafkasec.SASL{Mechanism: kafkasec.ScramSHA512, Username: "orders-consumer",
			Password: "from-a-secret-store"},
	}
	dialer, err := sec.Dialer()
	if err != nil {
		fmt.Println(err)
		return
	}
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{Reader: kafka.ReaderConfig{
		Brokers: []string{"kafka-1:9094"}, GroupID: "orders", Topic: "orders", Dialer: dialer},
		// Without the DescribeConfigs ACL on the topic: state the horizon
		// (at least the topic's retention.ms).
		RedeliveryHorizon: 7 * 24 * time.Hour})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer src.Close()

	transport, err := sec.Transport()
	if err != nil {
		fmt.Println(err)
		return
	}
	pub, err := kafkapub.New(kafkapub.Config{Brokers: []string{"kafka-1:9094"}, Transport: transport})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pub.Close()
	fmt.Println(sec)

	// A mistake names the field, never the password.
	_, err = kafkasec.Config{SASL: kafkasec.SASL{Mechanism: "SCRAM-SHA-1", Username: "u", Password: "hunter2"}}.Transport()
	fmt.Println(err)
	// Output:
	// SASL_SSL: TLS on (system roots), SASL SCRAM-SHA-512 user "orders-consumer" (password set)
	// idemq/kafkasec: invalid config: SASL.Mechanism "SCRAM-SHA-1" is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
}
