// Command payments is idemq's redelivery demo on a real Kafka broker and a
// real Postgres: a payments consumer that debits accounts, run once wrapped
// by idemq and once naively, against the same troubled stream.
//
// Usage:
//
//	payments demo                 produce the stream, run both consumers as
//	                              separate processes with a SIGKILL between
//	                              the database commit and the offset commit,
//	                              restart them, print the summary; exit 1 if
//	                              an idemq invariant fails
//	payments consume [flags]      run one consumer (used by demo and tests)
//
// Endpoints come from TEST_KAFKA_BROKERS and TEST_POSTGRES_DSN (defaults
// 127.0.0.1:9092 and postgres://idemq:idemq@127.0.0.1:5432/idemq), as
// printed by `scripts/services.sh env`.
package main
