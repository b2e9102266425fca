// Package kafkasec holds the TLS and SASL settings of a Kafka connection in
// one validated [Config] and turns them into what kafka-go takes: a
// *kafka.Dialer (kafka.ReaderConfig.Dialer, and so the consumer group and
// partition readers of broker/kafkaadapter) and a kafka.RoundTripper (a
// *kafka.Transport, for kafka.Writer, kafka.Client, outbox/kafkapub's
// Config.Transport and the admin calls of broker/kafkaadapter).
//
// One Config serves every connection of a process, so the consumer, its
// redelivery horizon check, EnsureTopics and the relay all speak the same
// security protocol to the same listener:
//
//	sec := kafkasec.Config{
//		TLS:  kafkasec.TLS{CAFile: "/etc/kafka/ca.pem"},
//		SASL: kafkasec.SASL{Mechanism: kafkasec.ScramSHA512, Username: "orders", Password: os.Getenv("KAFKA_PASSWORD")},
//	}
//	dialer, err := sec.Dialer()       // kafka.ReaderConfig{Dialer: dialer, ...}
//	transport, err := sec.Transport() // kafkapub.Config{Transport: transport, ...}
//
// TLS is on when any TLS field is set (or TLS.Enabled, for a broker whose
// certificate the system roots verify); the minimum version is TLS 1.2.
// SASL mechanisms are PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 (kafka-go's
// sasl/plain and sasl/scram). Kafka's security protocols map as: SSL = TLS
// only, SASL_SSL = TLS and SASL, SASL_PLAINTEXT = SASL only (the password
// of PLAIN then crosses the network in clear: use SCRAM or TLS).
//
// Validation errors wrap [ErrInvalidConfig] and name the field; no error
// and no String output of this package contains the password.
//
// kafka-go reports a refused login or a security-protocol mismatch
// unhelpfully (a bare EOF, "Broker Not Available", a TLS record header
// error). [Explain] wraps such an error with its likely cause.
package kafkasec
