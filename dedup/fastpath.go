package dedup

import (
	"context"
	"errors"
)

// FastPath remembers succeeded identities outside Postgres (Redis, see
// package redisfast) so that duplicates skip the database. It is never the
// source of truth: a miss, or any error, falls through to
// Postgres; a hit is trusted only when the remembered fingerprint matches the
// delivery's, so a conflicting payload still reaches Postgres and its
// dead-letter path. Implementations must be safe for concurrent use.
type FastPath interface {
	// Lookup returns the remembered entry of id's message ID or, failing
	// that, of its non-empty business key. ok is false on a miss or when
	// what is stored is not a SUCCEEDED entry (a claim marker, garbage).
	Lookup(ctx context.Context, id Identity) (e FastPathEntry, ok bool, err error)
	// Remember records, after the commit, that id has a SUCCEEDED record
	// with the given fingerprint.
	Remember(ctx context.Context, id Identity, e FastPathEntry) error
}

// ErrFastPathSkipped is wrapped by the error a FastPath returns when it did
// not try at all, e.g. because its circuit breaker is open
// (redisfast.ErrBreakerOpen). The Store falls through to Postgres and counts
// the call as a fast-path error, as for any error, but logs nothing: an
// outage is logged once by the FastPath, not once per message.
var ErrFastPathSkipped = errors.New("idemq: fast path skipped")

// FastPathEntry is what a FastPath remembers of a SUCCEEDED record.
type FastPathEntry struct {
	// MatchedBy says which key the entry was found under (Lookup only).
	MatchedBy MatchedBy
	// Fingerprint is the record's payload fingerprint.
	Fingerprint []byte
	// KeyID names the fingerprint key Fingerprint was made with.
	KeyID string
}
