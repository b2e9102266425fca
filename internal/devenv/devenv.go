package devenv

import (
	"os"
	"strings"
)

// Defaults of the local services started by scripts/services.sh.
const (
	DefaultPostgresDSN     = "postgres://idemq:idemq@127.0.0.1:5432/idemq?sslmode=disable"
	DefaultKafkaBrokers    = "127.0.0.1:9092"
	DefaultRocketMQNamesrv = "127.0.0.1:9876"
	DefaultRocketMQBroker  = "127.0.0.1:10911"
)

// Get returns the environment variable name, or def when it is unset or empty.
func Get(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// PostgresDSN is TEST_POSTGRES_DSN or DefaultPostgresDSN.
func PostgresDSN() string { return Get("TEST_POSTGRES_DSN", DefaultPostgresDSN) }

// KafkaBrokers is TEST_KAFKA_BROKERS or DefaultKafkaBrokers (comma separated).
func KafkaBrokers() string { return Get("TEST_KAFKA_BROKERS", DefaultKafkaBrokers) }

// RocketMQNamesrv is TEST_ROCKETMQ_NAMESRV or DefaultRocketMQNamesrv (comma
// separated).
func RocketMQNamesrv() string { return Get("TEST_ROCKETMQ_NAMESRV", DefaultRocketMQNamesrv) }

// RocketMQBroker is TEST_ROCKETMQ_BROKER or DefaultRocketMQBroker.
func RocketMQBroker() string { return Get("TEST_ROCKETMQ_BROKER", DefaultRocketMQBroker) }

// Split splits a comma-separated address list, dropping empty parts.
func Split(list string) []string {
	var out []string
	for _, a := range strings.Split(list, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}
