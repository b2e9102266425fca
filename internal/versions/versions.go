// Package versions names the versions of the services idemq is developed and
// tested against, in one place.
//
// Three setups start these services and must agree with the constants here:
//
//   - docker-compose.yml at the repository root (the image of each service),
//   - scripts/services.sh (KAFKA_VERSION and ROCKETMQ_VERSION, the Maven
//     Central artifacts it runs without Docker),
//   - the testcontainers-go fallback of the integration tests
//     (integration/setup_test.go), which starts the images named here.
//
// The README's tables name the Kafka and RocketMQ versions too. A unit test in
// the integration module (integration/versions_test.go) reads all of them and
// fails when one disagrees, so a version bump starts here and the test lists
// every other place to change.
package versions

const (
	// Kafka is the Apache Kafka version (KRaft, one node acting as broker and
	// controller).
	Kafka = "4.1.1"
	// KafkaImage is the official Apache Kafka image of version Kafka.
	KafkaImage = "apache/kafka:" + Kafka

	// RocketMQ is the Apache RocketMQ version (one NameServer and one broker).
	RocketMQ = "5.3.3"
	// RocketMQImage is the official Apache RocketMQ image of version RocketMQ;
	// the same image runs the NameServer (mqnamesrv) and the broker
	// (mqbroker).
	RocketMQImage = "apache/rocketmq:" + RocketMQ
	// RocketMQHome is RocketMQ's install folder in RocketMQImage (the image's
	// ROCKETMQ_HOME); its bin folder holds mqnamesrv, mqbroker and mqadmin.
	RocketMQHome = "/home/rocketmq/rocketmq-" + RocketMQ
	// RocketMQVersionDesc is how a RocketMQ broker of version RocketMQ names
	// itself in its runtime info (brokerVersionDesc), e.g. in the #Version
	// column of `mqadmin clusterList`: "V" and the version with "_" for ".".
	RocketMQVersionDesc = "V5_3_3"

	// PostgresMajor is the PostgreSQL major version of the Docker setups. It
	// matches what CI runs: scripts/services.sh installs the distribution's
	// PostgreSQL, 15 on Debian 12. The oldest supported major, 13, runs in
	// `make test-postgres-oldest` (scripts/postgres-oldest.sh).
	PostgresMajor = "15"
	// PostgresImage is the official PostgreSQL image of major PostgresMajor.
	PostgresImage = "postgres:" + PostgresMajor

	// RedisMajor is the Redis major version of the Docker setups
	// (scripts/services.sh runs the distribution's Redis instead).
	RedisMajor = "7"
	// RedisImage is the official Redis image of major RedisMajor.
	RedisImage = "redis:" + RedisMajor
)
