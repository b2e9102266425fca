// Command order-pipeline is idemq's outbox demo on a real Kafka broker and a
// real Postgres: a two-stage pipeline whose every hop is exactly-once in
// effect.
//
//	orders ──▶ confirmer (idemq) ──▶ orders row + outbox row ──▶ relay ──▶ order.confirmed ──▶ shipper (idemq) ──▶ shipments row
//
// The confirmer writes the order and its order.confirmed outbox row in the
// transaction that holds its consumption record; the relay publishes the row
// with its UUIDv7 as the message-id header; the shipper's dedup absorbs relay
// republishes with no code of its own.
//
// Usage:
//
//	order-pipeline demo [flags]     run the whole pipeline with two crashes,
//	                                each a real SIGKILL of a separate process:
//	                                the confirmer after its database commit
//	                                and before its offset commit, the relay
//	                                after publishing and before marking rows
//	                                published; print the summary; exit 1 if
//	                                an invariant fails
//	order-pipeline confirm [flags]  run the confirmer (orders → orders + outbox)
//	order-pipeline relay [flags]    run a relay (outbox → order.confirmed)
//	order-pipeline ship [flags]     run the shipper (order.confirmed → shipments)
//
// Endpoints come from TEST_KAFKA_BROKERS and TEST_POSTGRES_DSN (defaults
// 127.0.0.1:9092 and postgres://idemq:idemq@127.0.0.1:5432/idemq), as printed
// by `scripts/services.sh env`. Every demo run uses its own topics, consumer
// groups and schema.
package main
