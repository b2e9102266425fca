// Command idemq is idemq's operations tool:
//
//	idemq migrate [flags]           create or upgrade the consumption-record and dead-letter tables
//	                                (-print: write the versioned SQL for your own tool; -check: only verify the version)
//	idemq inspect [flags]           show the consumption record of a message ID or business key
//	idemq dead-letters [flags]      list the dead letters of a scope (or of a scope prefix)
//	idemq redrive [flags]           make a FAILED_FINAL record retryable again (-message-id),
//	                                or publish a conflict's dead letter as a new message (-as-new -id N)
//	idemq purge [flags]             delete expired consumption records (-dead-letters: old dead letters)
//	idemq relay [flags]             run an outbox relay until SIGINT/SIGTERM
//	idemq relay -once [flags]       drain the outbox once (cron-style) and exit
//	idemq outbox migrate [flags]    create or upgrade the outbox table (-print, -check as for migrate)
//	idemq outbox stats [flags]      count pending (failing now), parked and published (after a failure) rows
//	idemq outbox parked [flags]     list parked rows with their last error
//	idemq outbox unpark [flags] ID… make parked rows publishable again
//
// Each command lives in its own file and registers itself in commands. The
// database comes from -dsn, else IDEMQ_DATABASE_URL, else TEST_POSTGRES_DSN,
// else postgres://idemq:idemq@127.0.0.1:5432/idemq; -schema names the schema
// of idemq's tables (default "idemq"). inspect, dead-letters and redrive
// read a Redis-only store (dedup/redisstore) instead when given -redis URL
// (and -redis-prefix, default "idemq"). redrive -as-new writes an audit row
// and publishes the dead letter under the message ID
// "<message ID>#redrive-<id>" to -broker kafka (-kafka-brokers) or rocketmq
// (-rocketmq-namesrv); a payload conflict needs -force. inspect,
// dead-letters and redrive name an HTTP request's scope (package httpidem)
// with -http-tenant, -http-principal, -http-method and -http-route instead
// of -scope (composed with httpidem.Scope), its Idempotency-Key being the
// -message-id; inspect then adds the stored response's status, sealing,
// size and canonicalization version (its body only with -show-body, never
// a sealed one), and dead-letters -scope-prefix 'http|' lists the dead
// letters of every HTTP request. Run
// `idemq <command> -h` for the flags of a command.
package main
