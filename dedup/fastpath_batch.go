package dedup

import "context"

// BatchFastPath is a FastPath that can look up a whole batch in one call
// (redisfast: one MGET). pgstore's ProcessBatch uses it when the configured
// FastPath implements it, before any transaction is opened: the hits are
// answered as duplicates (when the remembered fingerprint matches), and a
// batch whose every message is a hit opens no transaction at all. Other FastPaths are asked
// once per message, also before the transaction. After the commit, the
// batch's succeeded messages are remembered with one RememberBatch.
type BatchFastPath interface {
	FastPath
	// LookupBatch returns one FastPathLookup per id, in order, each as
	// Lookup would return it (ok false on a miss). On an error (including
	// one wrapping ErrFastPathSkipped) the result is nil and every id falls
	// through to Postgres.
	LookupBatch(ctx context.Context, ids []Identity) ([]FastPathLookup, error)
	// RememberBatch is Remember for every ids[i] with entries[i] (the two
	// have the same length) in one call, after the batch's commit. On an
	// error none, some or all may be remembered (a miss later only costs a
	// Postgres read).
	RememberBatch(ctx context.Context, ids []Identity, entries []FastPathEntry) error
}

// FastPathLookup is one identity's answer of BatchFastPath.LookupBatch:
// OK reports a hit, and Entry is then the remembered entry (MatchedBy set).
type FastPathLookup struct {
	Entry FastPathEntry
	OK    bool
}
