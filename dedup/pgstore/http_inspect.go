package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// HTTPInspection is what HTTPStore.Inspect finds for an HTTP request: its
// consumption record and, when it has one, the record's stored part (the
// row of the `<records>_http` table, migration 006).
type HTTPInspection struct {
	// Record is the consumption record, found by the key exactly as stored.
	Record dedup.Record
	// Stored is the record's stored part; nil when it has none (a record
	// not written by an HTTP request).
	Stored *HTTPStoredRow
}

// HTTPStoredRow is the stored part of an HTTP request's record, as the
// `<records>_http` table holds it.
type HTTPStoredRow struct {
	// Principal is the key of the unfinished-keys cap: tenant and principal
	// as httpidem escapes them (hashed when long).
	Principal string
	// CanonVersion is the body canonicalization version the record's
	// fingerprint was made with (httpidem.CanonicalVersion at the time).
	CanonVersion int
	// Unfinished is true while the record may run the handler again
	// (FAILED_RETRYABLE): what the unfinished-keys cap counts.
	Unfinished bool
	// Response is the stored final response: its HTTP status (0 when none
	// is stored yet), the encoded, possibly sealed, response (httpidem's
	// format: read it with httpidem.DescribeStoredResponse) and the
	// sealing key's ID ("" = not sealed).
	Response HTTPResponse
	// UpdatedAt is the row's last write, database time.
	UpdatedAt time.Time
}

// Inspect returns the record of id and its stored part, without a lock,
// for operators (`idemq inspect`), read in one statement: a record being
// purged is shown whole (with its stored part) or not found, never
// without the stored part it had. The message ID is the Idempotency-Key
// exactly as the middleware stored it (not passed through
// dedup.NormalizeKey, so a key such as "sha256:…" is found as sent). It
// returns an error wrapping dedup.ErrNotFound when no record matches.
func (h *HTTPStore) Inspect(ctx context.Context, id dedup.Identity) (HTTPInspection, error) {
	// One statement, one snapshot: a purge deleting the record and its
	// stored part is seen whole or not at all.
	var r dedup.Record
	var status string
	var lastErr, lastClass *string
	var hasStored bool
	var principal, keyID *string
	var version, code *int32
	var unfinished *bool
	var updated *time.Time
	var stored []byte
	err := h.s.pool.QueryRow(ctx, h.inspectSQL, id.Scope, id.MessageID).
		Scan(&r.Scope, &r.MessageID, &r.BusinessKey, &r.Fingerprint, &r.FingerprintKeyID, &status, &r.Attempts,
			&lastErr, &lastClass, &r.Fence, &r.Source, &r.ReconsumeTimes, &r.CreatedAt, &r.UpdatedAt, &r.ExpiresAt,
			&hasStored, &principal, &version, &unfinished, &code, &stored, &keyID, &updated)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return HTTPInspection{}, dedup.ErrNotFound
	case err != nil:
		return HTTPInspection{}, fmt.Errorf("idemq: http inspect %s: %w", id, err)
	}
	raceHook("http inspect", id)
	r.Status = dedup.Status(status)
	r.LastError, r.LastErrorClass = deref(lastErr), deref(lastClass)
	out := HTTPInspection{Record: r}
	if !hasStored {
		return out, nil
	}
	st := HTTPStoredRow{Principal: deref(principal), Unfinished: unfinished != nil && *unfinished,
		Response: HTTPResponse{Stored: stored, SealedBy: deref(keyID)}}
	if version != nil {
		st.CanonVersion = int(*version)
	}
	if code != nil {
		st.Response.Status = int(*code)
	}
	if updated != nil {
		st.UpdatedAt = *updated
	}
	out.Stored = &st
	return out, nil
}

// deref is *p, or "" for nil.
func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// DeadLettersByScopePrefix lists the dead letters of every scope that
// starts with prefix (non-empty; e.g. "http|", the scopes of HTTP requests,
// httpidem.ScopePrefix), oldest first, as DeadLetters does: at most limit
// rows (1 to 10000; 0 means 100), after id afterID, each with its Scope.
// It walks the dead letters' primary key from afterID, skipping the other
// scopes' rows: an operator's listing, not a hot path.
func (s *Store) DeadLettersByScopePrefix(ctx context.Context, prefix string, afterID int64, limit int) ([]dedup.DeadLetter, error) {
	if prefix == "" {
		return nil, errors.New("idemq: dead letters by scope prefix: the prefix is empty")
	}
	return s.listDeadLetters(ctx, s.q.deadLettersPrefixSQL, prefix, afterID, limit)
}
