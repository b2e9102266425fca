// Package integration holds idemq's tests against real services: Postgres,
// Redis, Kafka and RocketMQ. It is its own Go module so that its test-only
// dependencies (testcontainers-go and the Docker client tree) never reach the
// module users import.
//
// # Services
//
// Services are found through environment variables (TEST_POSTGRES_DSN,
// TEST_REDIS_ADDR, TEST_KAFKA_BROKERS, TEST_ROCKETMQ_NAMESRV); `make
// services-up` starts them and `eval "$(scripts/services.sh env)"` exports
// them. When a variable is missing, a test fails under CI=true (or
// TEST_REQUIRE_BROKERS=1), otherwise starts the service with testcontainers-go
// if a Docker engine answers, otherwise skips naming the command to run.
// Each test gets its own schema, topics and consumer groups, so tests run in
// parallel.
//
// # Failures from the field
//
// Each of these failures, seen by teams running Kafka, RocketMQ, outboxes or
// idempotency keys, is reproduced with the values it was reported with. The
// scenarios that need Postgres only (S04, S10, S13, S14, and the Postgres
// parts of S17 and S18) are package tests of dedup/pgstore, marked
// "pgstore:" below; `go test ./dedup/pgstore/` runs them with
// TEST_POSTGRES_DSN set. The HTTP scenarios (S21, S22) are package tests of
// httpidem, marked "httpidem:" (`go test ./httpidem/`):
//
//	S01 stale copy after a rebalance: no handler call, no commit below the committed offset  TestS01StaleMessageAfterRebalance
//	S02 offset ahead of processing; commit call fails after the DB commit                     TestS02OffsetNeverAheadOfProcessing
//	S03 processed but not committed at handoff; commits flushed on close                      TestS03ProcessedButNotCommittedAtHandoff
//	S04 zombie consumer holding its transaction while a copy arrives                          pgstore: TestS04ZombieConsumer
//	S05 producer retry at a new offset: business-key duplicate, conflict, empty keys          TestS05ProducerRetryAtNewOffset
//	S06 RocketMQ resend while the first attempt runs (and after it failed)                    TestRocketMQS06ResendWhileFirstAttemptRuns, TestRocketMQS06FirstAttemptFailsCopyProcesses
//	S07 RocketMQ per-copy storage IDs: UNIQ_KEY, never OffsetMsgId                            TestRocketMQS07PerCopyStorageIDs
//	S08 RocketMQ poison message, stray copy, operator re-drive                               TestRocketMQS08PoisonMessage, TestRocketMQPoisonThroughRetryTopic
//	S09 crash after commit, before ack (real SIGKILL), with Redis kept or flushed              TestS09KafkaCrashAfterCommitBeforeAck, TestRocketMQS09KillAfterCommitBeforeAck
//	S10 unique violation inside the transaction (redelivery, own table, wrapped)              pgstore: TestS10UniqueViolations
//	S11 fast-path miss falls through to Postgres; Redis down                                 TestS11FastPathMissFallsThroughToPostgres
//	S12 stale claim marker in Redis is not trusted                                          TestS12StaleRedisMarkerNotTrusted
//	S13 lease lost while the owner still works: fencing                                      pgstore: TestS13LeaseLostWhileOwnerWorks
//	S14 clock skew: leases and retention in database time                                   pgstore: TestS14ClockSkewUsesDatabaseTime
//	S15 a duplicate input publishes nothing new                                             TestOutboxS15DuplicateInputPublishesNothingNew
//	S16 published, but marking failed; two relays                                           TestOutboxS16PublishedButMarkFailed
//	S17 a message that kills its consumer: lease owners that die; atomic and batched          TestS17LeaseOwnersThatDieAreBounded, TestS17CrashLoopKafka, TestS17CrashLoopRocketMQ
//	    modes with real SIGKILLs (Kafka, RocketMQ); the capping claim's answer lost (S18)    pgstore: TestS17LeaseCapClaimAnswerLost
//	S18 a reply lost and the call retried: every Redis script; Postgres lease claim and marks  TestS18RedisClaimReplyLost, TestRedisScriptRepliesLost, pgstore: TestLeaseCallAnswersLost
//	S19 one bad entry in a batch: a deferred constraint, a 40001 at COMMIT                   TestS19BadEntryNeverBlocksABatch
//	S20 blank message IDs and business keys fall back to the position / none                 TestS20BlankMessageIDs, TestRocketMQS20BlankMessageIDProperty
//	S21 same Idempotency-Key at the same time (20 copies): one execution, 409s, replay        httpidem: TestS21SameKeyAtTheSameTime, TestInFlightWaitAnswersFromTheFirstOutcome
//	S22 same key, different request: 422/409, keys per route, canonical JSON replays          httpidem: TestS22SameKeyDifferentRequest, TestRetryComparedUnderTheStoredCanonicalVersion
//	S23 one key, two targets (path values, query): 422, never the other target's replay      TestS23OneKeyTwoTargets, httpidem: TestCanonicalTarget*, TestVersion1RecordAfterTheTargetUpgrade
//	S24 no caller: blank principal/tenant refused before anything is written; Anonymous     TestS24NoCaller, TestS24AnonymousRouteScopesByOwner
//
// Beside them: the cost of start markers counted statement by statement
// (TestCrashLoopMarkersCostNothingOnFirstDeliveries) and their rules on
// Postgres (pgstore: TestStartMarkerCountsRunsThatDied); real process kills mid-stream
// (TestKafkaCrashMidStreamNoDoubleEffectNothingLost,
// TestRocketMQTwoProcessesKillMidRun), RocketMQ progress across rebalances:
// lag 0 after a graceful stop and redeliveries within the in-flight ones,
// 1.2 deliveries per message at most through a backlog and two rebalances,
// with the per-queue redelivery and duplicate metrics
// (TestRocketMQRebalanceKeepsProgress,
// TestRocketMQBacklogRebalanceDeliveries), generation-fenced Kafka commits: a
// rebalance while a consumer holds fetched deliveries never moves a group
// offset back, in every mode (TestKafkaGenerationFencedCommits), bad input
// (TestKafkaBadInput), retries through the real %RETRY% topic, batched mode,
// the outbox relay under load and broker outages, metrics, tracing and the
// CLI (`idemq relay --once` drains the outbox and exits:
// TestCLIRelayOnceDrains; HTTP requests served through httpidem named by
// their parts in inspect, dead-letters and redrive, their stored responses
// described without a sealed body, and purged with their records:
// TestCLIHTTPScopes). Migrations without DDL rights: after an admin
// migrated, a data-only role (USAGE on the schema, SELECT/INSERT/UPDATE/DELETE
// on its tables) passes CheckSchema, runs Migrate without DDL and processes
// messages in atomic, batched (also set-based) and lease mode, and gets ErrSchemaOutdated /
// ErrSchemaMissing otherwise (TestMigrateWithDataOnlyRole); the SQL of
// `idemq migrate --print` applied block by block gives Migrate's schema
// (TestMigrationSQLMatchesMigrate). The schema is checked by default: consumer.Run
// and Relay.Run refuse a missing or outdated schema before anything is handled or
// committed, a data-only role starts (TestSchemaCheckedByDefault). Conflicts carry the reason of their kind in every mode and store
// (TestConflictReasons); a re-driven bad_input record runs its next copy
// (TestRedrivenBadInputRuns); a message-ID collision's dead letter is
// re-driven as a new message with the CLI on Kafka and RocketMQ, once,
// audited, refused for payload conflicts without -force
// (TestRedriveAsNewCLI, TestRocketMQRedriveAsNewCLI,
// TestRedriveAsNewPublishFailsThenRepeats). In batched mode the Redis fast
// path is asked once per batch before any transaction: a batch of hits makes
// no Postgres round trip, a mixed one claims only its misses
// (TestRedisFastPathBatchSkipsPostgres); handler savepoints never nest
// (pgstore: TestProcessBatchSavepointsReleased). A set-based BatchHandler
// (consumer.Config.BatchHandler) writes each Kafka batch's new messages in
// one call, never sees a duplicate, and a failing call is rerun one message
// per transaction (TestKafkaBatchHandlerConsumer). A batch is claimed in one
// round trip and each new record written once (pgstore:
// TestBatchClaimIsOneRoundTrip, TestBatchNewRecordsWrittenOnce); copies,
// business-key collisions and conflicts inside one batch are answered in
// order (pgstore: TestBatchDuplicatesAndConflictsInsideABatch); 20
// concurrent batches over overlapping IDs apply each message once (pgstore:
// TestConcurrentBatchesOverlappingExactlyOnce); a failing BatchHandler falls
// back to finding its culprit (pgstore: TestBatchHandlerCulpritFallback,
// TestBatchHandlerLeavingTheTransactionAborted); a batch stopped by a
// retry takes back the records of the messages after it (pgstore:
// TestBatchStopsAtRetryAndUnclaimsTheRest); the claim never scans the
// table under generic plans (pgstore: TestNoTableScanOnBatchClaim).
//
// One runtime for both brokers: consumer.Config.MaxHandlerDuration cuts off
// a handler stuck in a Postgres statement, each cut a counted attempt, until
// the message is dead-lettered, and a user middleware sees every attempt,
// under Kafka (pull, consumer.Run: TestRuntimeKafkaHandlerTimeoutAndMiddleware)
// and RocketMQ (push, the listener calling consumer.Pusher on the broker's
// last copy: TestRuntimeRocketMQHandlerTimeoutAndMiddleware).
//
// Conformance suites on the real brokers: outbox/publishertest for both
// publishers (TestPublisherConformanceKafka, TestPublisherConformanceRocketMQ)
// and consumer/sourcetest for both pull-mode sources (TestSourceConformanceKafka,
// TestSourceConformanceRocketMQ).
//
// Optional dependencies fail fast: Redis stopped for 10 s in the middle of
// 5,000 messages leaves effects exactly once while the fast path's circuit
// breaker opens once and closes once (TestFastPathRedisOutageMidStream), and
// BenchmarkFastPathRedisDown holds throughput with Redis down to Postgres
// only. A lost LISTEN connection (its backend terminated) makes the relay
// poll at once (outbox's own TestRelayListenLostFallsBackToPolling, which
// needs TEST_POSTGRES_DSN only); a relay publishing to a Kafka address that
// refuses connections classifies the failure as the broker's, parks nothing
// and opens its breaker, while a missing topic on the real Kafka is a row
// error (TestOutboxBrokerOutageIsNotARowError; a two-hour outage on a fake
// clock: outbox's own TestRelayTwoHourOutageParksNothing and
// TestRelayRowErrorStillParks); a stuck span exporter
// holds up no delivery (TestTracingExportNeverBlocksDeliveries); a hung
// Redis under the Redis-only store ends a handler by its lease's clock
// (TestRedisStoreRenewalFailsByTheLeaseClock).
//
// Failure classes: a COMMIT terminated by the server (57P01) in every
// Postgres mode (pgstore: TestOutcomeUnknownAtCommit; through the Kafka
// runtime: TestKafkaOutcomeUnknownAtCommitRedelivered), a COMMIT that landed
// but whose reply a TCP proxy lost (pgstore: TestCommitReplyLost),
// serialization failures and deadlocks retried without using an attempt
// (pgstore: TestTransientFailureCountsNoAttempt), and the handler's
// isolation level with a real serializable write skew (pgstore:
// TestHandlerIsolationLevel).
//
// Retention: every update of a record is HOT in every Postgres mode
// (pgstore: TestRecordUpdatesAreHOT), migration 005 on a populated table
// drops only the store's own index (pgstore:
// TestMigration005OnPopulatedTable), a purge step is bounded and keeps
// unexpired and non-terminal records (pgstore: TestSQLPurge), and
// BenchmarkPurgeUnderIngest measures a purge of a million records under a
// steady ingest for each index layout (docs/operations.md, "Purge cost and
// indexes"); BenchmarkPurgeAtScale (`make bench-purge`) loads 10 million
// records and measures the maintenance loop's purge against batched ingest
// at full speed (docs/operations.md, "Sizing the purge"). Maintenance: two RunMaintenance loops elect one leader by
// advisory lock and the other takes over when the leader's connection is
// killed (pgstore: TestMaintenanceLeaderElectionAndTakeover); old dead
// letters are purged in bounded steps, keeping young ones and unpublished
// re-drives (pgstore: TestPurgeDeadLetters); `idemq purge --dead-letters`
// (TestCLIPurgeDeadLetters); `idemq purge` shows progress and, interrupted,
// reports what it deleted and exits 1 (TestCLIPurgeProgressAndInterrupt); a
// Kafka topic with retention.ms = -1 is refused unless
// AcceptUnboundedRedelivery is set (TestKafkaUnboundedRetentionRefused).
// RocketMQ: the shared broker's fileReservedTime and deleteWhen are read
// (72h + 24h) and a shorter SucceededRetention is refused by consumer.Run
// and PushConsumer.Start in atomic, batched and lease modes, unless
// AcceptOffsetResetReplays (TestRocketMQStoreRetentionRefused).
//
// Secured RocketMQ: an ACL 2.0 NameServer and broker that the test starts
// from the jars in TEST_ROCKETMQ_LIB (scripts/services.sh caches them; it
// fails under CI=true without them): the relay publishes and both consumers
// consume with the right credentials, a wrong secret stops a consumer at
// Start (ErrAccessDenied), and a refused publish pauses the relay and parks
// nothing (TestRocketMQACL).
//
// Round trips in per-message modes: BEGIN travels with the claim and the
// marks with the COMMIT, counted on the wire per outcome (pgstore:
// TestRoundTripsPerMessage); a success mark refused at COMMIT keeps the
// handler's writes out (pgstore: TestMarkAtCommitRefused); a backend killed
// during the pipelined BEGIN and claim, or before it (pgstore:
// TestBackendKilledDuringPipelinedBegin); no pooled connection leaked by
// 1,000 mixed outcomes (pgstore: TestNoPooledConnectionLeaks); the handler
// sees an ordinary pgx.Tx (pgstore: TestLazyTxIsAnOrdinaryTx).
//
// # Forms and state transitions
//
// One-time submit tokens on the real Redis: issued, consumed once, then
// ErrTokenUsed; unknown in another scope or forged
// (TestSubmitTokenIssueConsume); expired after TTL, remembered as used for
// UsedTTL (TestSubmitTokenExpiry); 50 submits of one token at once, one
// wins (TestSubmitTokenConcurrentConsumes); Consume's reply lost and
// go-redis resending it, still consumed by that call
// (TestSubmitTokenConsumeReplyLost). Guarded transitions on the real
// Postgres: legal, illegal, stale versions, a retry reported as already
// applied, on text and enum status columns (TestTransitionRules); 20
// identical callbacks at once change the order once
// (TestTransitionConcurrentCallbacks); a provider callback delivered three
// times, through an HTTP handler and through a Kafka consumer, changes the
// order once (TestTransitionProviderCallbackThreeTimes).
//
// # Postgres-only tests live in dedup/pgstore
//
// A test that needs Postgres and nothing else (no broker, no Redis, no child
// process, no consumer runtime) is a package test of dedup/pgstore, so that
// `go test ./...` with TEST_POSTGRES_DSN set runs it without this module:
// the scenarios marked "pgstore:" above, batched mode's savepoints and order
// (TestProcessBatchSavepointsAndOrder), commits refused at COMMIT
// (TestCommitRefusedIsAHandlerFailure) and no table scan on 200,000 records
// under generic plans (TestNoTableScanOnLargeRecordTable). `make
// test-postgres-oldest` runs them on PostgreSQL 13 too.
//
// # Store conformance
//
// Every store runs the conformance suite of dedup/storetest on the real
// services: the Postgres store in atomic, batched and lease modes
// (TestStoreConformancePostgresAtomic, TestStoreConformancePostgresBatched,
// TestStoreConformancePostgresLease) and the Redis-only store
// (TestStoreConformanceRedis); the in-memory store runs it in its own
// package. Its cases: claim and success, duplicates by message ID and by
// business key, conflicts, retries, final failures and dead letters,
// re-drive, lease takeover and fencing, renewals that find a takeover,
// heartbeats, the idempotency key across a re-send, bad input, interrupted
// handlers, crash loops, 20 copies at once (…/ConcurrentCopies) and
// retention purge.
//
// What stays here is particular to one store. Postgres: its own package
// tests (above). The Redis-only store: Redis unreachable (TestRedisStoreRedisDown), a
// completion whose Redis call fails (TestRedisStoreCompletionFailureIsNotAcked),
// fingerprint key rotation inside the scripts
// (TestRedisStoreFingerprintKeyRotation), a business-key index that outlived
// its record (TestRedisStoreStaleBusinessKeyIndex), a Kafka consumer with a
// full replay (TestRedisStoreKafkaConsumerAppliesOnce), RocketMQ's %RETRY%
// topic (TestRedisStoreRocketMQRetryTopicAndResend), and every script path
// on a Redis Cluster node started by the test, which refuses keys of
// different slots (TestRedisStoreOnRedisCluster). A TCP proxy written for
// the tests (internal/faultproxy, shared with dedup/pgstore's tests) loses
// one reply of the real Redis and closes the connection, for S18 and for
// the fast path's Remember (TestRedisFastPathRememberReplyLost).
//
// # Telemetry
//
// A delivery's span follows the OpenTelemetry messaging semantic
// conventions for Kafka and RocketMQ messages: "process <topic>",
// messaging.* attributes, no empty business key, a versioned
// instrumentation scope (TestTracingSpanFollowsMessagingConventions). The
// relay's producer spans are "send <topic>", children of the causation
// context stored with the row, and the record published to Kafka carries
// the send span's context (TestRelaySendSpansFollowCausation). Baggage in
// a delivery's headers reaches the handler and the outbox rows it writes
// (TestTracingBaggagePropagates). Two stores, outboxes and relays register
// their collectors in one registry with const labels, and the relay's
// counters report its publishes (TestCollectorsRegisterTwiceWithConstLabels).
// Log lines of a delivery (the consumer's, the Postgres store's) carry its
// ctx, so a handler reading the span finds its trace
// (TestLogsCarryTheDeliveryTrace). The Grafana dashboard and alert rules
// under deploy/ refer only to metrics the collectors export
// (TestDeployDashboardAndAlertsUseRealMetrics).
//
// # Benchmarks
//
// cmd/benchreport is `make bench`: idemq's workloads beside rooflines measured
// in the same run (pgbench on tables of idemq's row shapes, pg_test_fsync, raw
// kafka-go), with the targets as a checklist; it writes
// docs/benchmarks.md. The Benchmark functions of this package are `make
// bench-go`.
package integration
