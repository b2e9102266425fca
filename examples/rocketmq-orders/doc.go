// Command rocketmq-orders is a RocketMQ listener that creates orders in
// Postgres, wrapped by idemq so that every order is applied exactly once
// although RocketMQ delivers at least once.
//
// Usage:
//
//	rocketmq-orders demo      run the whole redelivery story against the real
//	                          broker and Postgres, print a summary, exit 1 if
//	                          an invariant fails
//	rocketmq-orders consume   run one consumer process (used by demo and by
//	                          the integration tests; see -h)
//
// Settings come from the environment: TEST_POSTGRES_DSN (default
// postgres://idemq:idemq@127.0.0.1:5432/idemq?sslmode=disable),
// TEST_ROCKETMQ_NAMESRV (default 127.0.0.1:9876, comma-separated),
// TEST_ROCKETMQ_BROKER (default 127.0.0.1:10911) and
// IDEMQ_FINGERPRINT_SECRET (a demo default otherwise).
package main
