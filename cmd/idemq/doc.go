// Command idemq is idemq's operations tool (built on spf13/cobra; every
// command has --help):
//
//	idemq migrate [--print | --check]          create or upgrade the consumption-record and dead-letter tables
//	                                           (--print: the versioned SQL for your own tool; --check: verify the version, read-only)
//	idemq inspect --scope S (--message-id M | --business-key K) [--show-body]
//	                                           the consumption record, as JSON
//	idemq redrive --scope S --message-id M     make one FAILED_FINAL record retryable again
//	idemq redrive --as-new --scope S --id N    publish a conflict's dead letter as a new message (--force for a payload conflict)
//	idemq purge [--batch N] [--progress D]     delete expired consumption records (--dead-letters --older-than D: old dead letters)
//	idemq dead-letters list [filters] [--after-id N] [--limit N]
//	                                           list dead letters (filters: --scope S | --scope-prefix P, --reason R,
//	                                           --since T, --until T, --redriven true|false; T is RFC 3339 or a duration ago)
//	idemq dead-letters show ID [--decode auto|text|json|base64|hex | --decode-cmd CMD]
//	                                           one dead letter: payload, headers, error, attempts, timestamps
//	idemq dead-letters export [filters] [--file F|-] [--page N]
//	                                           JSON Lines, one dead letter per line (key and payload base64), page by page
//	idemq dead-letters redrive (filters | --all) [--dry-run] [--batch N] [--operator NAME]
//	                                           re-drive many, progress on stderr, summary on stdout
//	idemq dead-letters republish ID [--topic T] [--new-message-id] [--outbox-table T] [--operator NAME]
//	                                           send it again through the outbox, exactly once (Postgres only)
//	idemq dead-letters purge --older-than D [--batch N]
//	                                           delete dead letters by age
//	idemq relay [flags]                        run an outbox relay until SIGINT/SIGTERM
//	                                           (--metrics-addr ADDR: /metrics, /healthz, /readyz; --log-format text|json)
//	idemq relay --once [flags]                 drain the outbox once (cron-style); exit 1 when the broker failed
//	idemq outbox migrate [--print | --check]   create or upgrade the outbox table
//	idemq outbox stats                         count pending (failing now), parked and published (after a failure) rows
//	idemq outbox parked [--limit N]            list parked rows with their last error
//	idemq outbox unpark (--all | --topic T | --key K | ID...) [--dry-run]
//	                                           make parked rows publishable again
//	idemq outbox purge [--older-than D] [--batch N]
//	                                           delete published rows older than a retention
//
// Exit codes: 0 done; 1 the work failed (database, broker, interrupted: the
// purges and exports then report what they did); 2 usage error (unknown
// flag, bad value, missing or conflicting flags, wrong argument count),
// found before any work or connection; 3 not found (inspect, dead-letters
// show, outbox row lookups: what was asked for does not exist).
// -h/--help exits 0.
// Flags are GNU style (--dsn); a long flag written with one dash (-dsn) is
// refused with a hint.
//
// Output: every list and summary takes -o table|json (default table); json
// writes one JSON value on stdout (export writes JSON Lines), while
// progress and logs go to stderr. inspect takes -o json|table too, with
// json as its default (a record is nested data).
//
// Configuration comes from flags, else from environment variables: --dsn
// from IDEMQ_DATABASE_URL, --schema from IDEMQ_SCHEMA (default "idemq"),
// --redis from IDEMQ_REDIS_URL, --redis-prefix from IDEMQ_REDIS_PREFIX,
// --table from IDEMQ_OUTBOX_TABLE, --broker from IDEMQ_BROKER,
// --kafka-brokers from IDEMQ_KAFKA_BROKERS, --rocketmq-namesrv from
// IDEMQ_ROCKETMQ_NAMESRV, --metrics-addr from IDEMQ_METRICS_ADDR and
// --log-format from IDEMQ_LOG_FORMAT. There is no built-in database or
// broker address: without --dsn or IDEMQ_DATABASE_URL a command that needs
// the database exits 2 saying so. The Redis-only store (dedup/redisstore)
// is used by inspect, redrive and the dead-letters verbs when --redis (or
// only IDEMQ_REDIS_URL) is set; --dsn and --redis together are refused.
// Secrets are never echoed: help shows no DSN, errors have the DSN's and
// Redis URL's passwords replaced by xxxxx, and the relay logs the database
// as postgres://user:xxxxx@host:port/db.
//
// inspect, redrive and the dead-letters filters name an HTTP request's
// scope (package httpidem) with --http-tenant, --http-principal,
// --http-method and --http-route instead of --scope (composed with
// httpidem.Scope), its Idempotency-Key being the --message-id.
//
// The relay takes a flag for every outbox.RelayConfig field (--name,
// --batch-size, --max-keys, --workers, --poll-interval,
// --fallback-poll-interval, --no-listen, --publish-timeout,
// --retry-initial, --retry-max, --max-attempts, --outage-backoff-initial,
// --outage-backoff-max, --max-error-bytes, --retention, --no-purge,
// --purge-interval, --purge-batch, --shutdown-grace); the broker flags
// (--broker, --kafka-brokers, --create-topics, --partitions,
// --rocketmq-namesrv) live in brokerFlags, shared with redrive --as-new,
// with the broker security flags (brokerSecFlags): Kafka TLS
// (--kafka-tls, --kafka-tls-ca, --kafka-tls-cert, --kafka-tls-key,
// --kafka-tls-server-name, --kafka-tls-insecure-skip-verify for tests only)
// and SASL (--kafka-sasl-mechanism plain|scram-sha-256|scram-sha-512,
// --kafka-sasl-user, the password from IDEMQ_KAFKA_SASL_PASSWORD or
// --kafka-sasl-password-file), which make a kafkasec.Config whose
// Transport carries every Kafka request (--create-topics included); and
// RocketMQ ACL credentials (--rocketmq-access-key or
// IDEMQ_ROCKETMQ_ACCESS_KEY, the secret key from IDEMQ_ROCKETMQ_SECRET_KEY
// or --rocketmq-secret-key-file) for rocketmqpub.Config.Credentials.
// Secrets are never flag values and never printed; an inconsistent
// setting (a mechanism without user or password, a certificate without
// its key, a Kafka flag with --broker rocketmq, ...) exits 2 before any
// connection. relay --once's error ends with the publisher's last error
// (e.g. kafkasec.ErrAuthentication's "SASL authentication refused").
// --metrics-addr serves /metrics (the relay's and the outbox's collectors,
// with the Go and process collectors, on a registry of its own), /healthz
// (200 while the process is up) and /readyz (200 while the relay runs and
// its outbox table answers: outbox.(*Relay).Ready; 503 otherwise).
package main
