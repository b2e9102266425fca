package dedup

import (
	"context"
	"errors"
	"sync/atomic"
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

// fastPathStats counts fast-path use for FastPathStats.
type fastPathStats struct{ hits, misses, errors atomic.Int64 }

// FastPathStats reports the fast path's hits (duplicates answered without
// Postgres), misses (fell through) and errors (fell through after a fast-path
// error, Redis down, or because the fast path skipped the call:
// ErrFastPathSkipped), since the Store was made.
func (s *Store) FastPathStats() (hits, misses, errors int64) {
	return s.fast.hits.Load(), s.fast.misses.Load(), s.fast.errors.Load()
}

// fastLookup answers a duplicate from the fast path, or reports false.
func (s *Store) fastLookup(ctx context.Context, msg *Message) (Result, bool) {
	if s.cfg.FastPath == nil {
		return Result{}, false
	}
	e, ok, err := s.cfg.FastPath.Lookup(ctx, msg.Identity)
	if err != nil {
		s.fast.errors.Add(1)
		if !errors.Is(err, ErrFastPathSkipped) {
			s.cfg.Logger.Debug("idemq: fast path lookup failed; using Postgres", "identity", msg.Identity.String(), "err", err)
		}
		return Result{}, false
	}
	if ok {
		if same, ferr := s.fp.Matches(msg.Payload, e.Fingerprint, e.KeyID); ferr == nil && same {
			s.fast.hits.Add(1)
			return Result{Outcome: OutcomeDuplicate, MatchedBy: e.MatchedBy, Status: StatusSucceeded}, true
		}
	}
	s.fast.misses.Add(1)
	return Result{}, false
}

// fastRemember records a SUCCEEDED identity; failures are only counted.
func (s *Store) fastRemember(ctx context.Context, id Identity, sum []byte, keyID string) {
	if s.cfg.FastPath == nil {
		return
	}
	if err := s.cfg.FastPath.Remember(context.WithoutCancel(ctx), id, FastPathEntry{Fingerprint: sum, KeyID: keyID}); err != nil {
		s.fast.errors.Add(1)
		if !errors.Is(err, ErrFastPathSkipped) {
			s.cfg.Logger.Debug("idemq: fast path remember failed", "identity", id.String(), "err", err)
		}
	}
}
