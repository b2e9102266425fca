package pgstore

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/idemq/idemq/dedup"
)

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
func (s *Store) fastLookup(ctx context.Context, msg *dedup.Message) (dedup.Result, bool) {
	if s.cfg.FastPath == nil {
		return dedup.Result{}, false
	}
	e, ok, err := s.cfg.FastPath.Lookup(ctx, msg.Identity)
	if err != nil {
		s.fast.errors.Add(1)
		if !errors.Is(err, dedup.ErrFastPathSkipped) {
			s.cfg.Logger.DebugContext(ctx, "idemq: fast path lookup failed; using Postgres", "identity", msg.Identity.String(), "err", err)
		}
		return dedup.Result{}, false
	}
	if ok {
		if same, ferr := s.fp.Matches(msg.Payload, e.Fingerprint, e.KeyID); ferr == nil && same {
			s.fast.hits.Add(1)
			return dedup.Result{Outcome: dedup.OutcomeDuplicate, MatchedBy: e.MatchedBy, Status: dedup.StatusSucceeded}, true
		}
	}
	s.fast.misses.Add(1)
	return dedup.Result{}, false
}

// fastRemember records a SUCCEEDED identity; failures are only counted.
func (s *Store) fastRemember(ctx context.Context, id dedup.Identity, sum []byte, keyID string) {
	if s.cfg.FastPath == nil {
		return
	}
	if err := s.cfg.FastPath.Remember(context.WithoutCancel(ctx), id, dedup.FastPathEntry{Fingerprint: sum, KeyID: keyID}); err != nil {
		s.fast.errors.Add(1)
		if !errors.Is(err, dedup.ErrFastPathSkipped) {
			s.cfg.Logger.DebugContext(ctx, "idemq: fast path remember failed", "identity", id.String(), "err", err)
		}
	}
}
