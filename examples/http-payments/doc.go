// Command http-payments is idemq's HTTP demo on a real Postgres and Redis: a
// checkout form (HTML, with a one-time submit token) and a JSON API
// (POST /payments with an Idempotency-Key; POST /callbacks/provider, the
// payment provider's callback, applying PENDING → PAID as a guarded
// transition), run once with idemq's layers (httpidem, submittoken,
// transition) and once naively (the same handlers without them), against
// the same troubled traffic.
//
// Usage:
//
//	http-payments demo            start both servers as separate processes,
//	                              play the story against each (a
//	                              double-click, a gateway retry after a
//	                              timeout, the same key with another amount,
//	                              20 concurrent copies, a callback delivered
//	                              three times, a SIGKILL between the commit
//	                              and the response), print the summary
//	                              computed from the database; exit 1 if an
//	                              idemq invariant fails
//	http-payments serve [flags]   run one server (used by demo)
//
// Endpoints come from TEST_POSTGRES_DSN and TEST_REDIS_ADDR (defaults
// postgres://idemq:idemq@127.0.0.1:5432/idemq and 127.0.0.1:6379), as
// printed by `scripts/services.sh env`.
package main
