// Package integration holds idemq's tests against real services: Postgres,
// Redis, Kafka and RocketMQ. It is its own Go module so that its test-only
// dependencies (testcontainers-go and the Docker client tree) never reach the
// module users import.
//
// Services are found through environment variables (TEST_POSTGRES_DSN,
// TEST_REDIS_ADDR, TEST_KAFKA_BROKERS, TEST_ROCKETMQ_NAMESRV); `make
// services-up` starts them and `eval "$(scripts/services.sh env)"` exports
// them. When a variable is missing, a test fails under CI=true (or
// TEST_REQUIRE_BROKERS=1), otherwise starts the service with testcontainers-go
// if a Docker engine answers, otherwise skips naming the command to run.
package integration
