package dedup

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Working with dead letters in bulk: both stores (pgstore.Store and
// redisstore.Store) take a DeadLetterFilter in ScanDeadLetters,
// CountDeadLetters and RedriveDeadLetters, and RedriveDeadLetters reports a
// RedriveSummary. The CLI's `idemq dead-letters list|export|redrive` verbs
// are built on them.

// Limits of DeadLetterFilter.Limit and RedriveOptions.Batch.
const (
	// DefaultDeadLetterLimit is the page size of ScanDeadLetters when
	// DeadLetterFilter.Limit is 0.
	DefaultDeadLetterLimit = 100
	// MaxDeadLetterLimit is the largest DeadLetterFilter.Limit.
	MaxDeadLetterLimit = 10000
	// DefaultRedriveBatch is the dead letters per transaction of
	// RedriveDeadLetters when RedriveOptions.Batch is 0.
	DefaultRedriveBatch = 500
	// MaxRedriveBatch is the largest RedriveOptions.Batch.
	MaxRedriveBatch = 10000
)

// DeadLetterFilter selects dead letters for ScanDeadLetters, CountDeadLetters and
// RedriveDeadLetters. Zero fields select everything. Conditions combine with
// AND.
type DeadLetterFilter struct {
	// Scope is the exact scope (the consumer group's or HTTP route's
	// scope); "" = every scope. At most MaxKeyBytes bytes.
	Scope string
	// ScopePrefix selects every scope starting with it (e.g. "http|"), on
	// Postgres only: the Redis store returns an error wrapping
	// ErrInvalidConfig when it is set (its streams are keyed by a digest of
	// the scope). Not together with Scope.
	ScopePrefix string
	// Reason is the exact reason (one of the Reason* constants); "" = any.
	Reason string
	// Since selects dead letters with CreatedAt >= Since; zero = no lower
	// bound.
	Since time.Time
	// Until selects dead letters with CreatedAt < Until; zero = no upper
	// bound.
	Until time.Time
	// AfterID is the keyset cursor of ScanDeadLetters: only IDs > AfterID.
	// Pass the last ID of a page to get the next one. 0 = from the start.
	AfterID int64
	// Limit is the ScanDeadLetters page size: 0 = DefaultDeadLetterLimit
	// (100), at most MaxDeadLetterLimit (10000). CountDeadLetters and
	// RedriveDeadLetters ignore it (and AfterID).
	Limit int
	// Redriven selects by re-drive state: nil = both; true = only dead
	// letters already re-driven (RedrivenAt set); false = only those not yet
	// re-driven.
	Redriven *bool
}

// Validate returns an error wrapping ErrInvalidConfig naming the field: a
// negative AfterID, a Limit out of 0..MaxDeadLetterLimit, Until not after
// Since (both set), Scope and ScopePrefix both set, a Scope, ScopePrefix or
// Reason longer than MaxKeyBytes or not valid UTF-8 without NUL.
func (f DeadLetterFilter) Validate() error {
	for _, s := range []struct{ name, v string }{{"Scope", f.Scope}, {"ScopePrefix", f.ScopePrefix}, {"Reason", f.Reason}} {
		if len(s.v) > MaxKeyBytes || !utf8.ValidString(s.v) || strings.IndexByte(s.v, 0) >= 0 {
			return fmt.Errorf("%w: DeadLetterFilter.%s must be at most %d bytes of UTF-8 without NUL", ErrInvalidConfig, s.name, MaxKeyBytes)
		}
	}
	switch {
	case f.Scope != "" && f.ScopePrefix != "":
		return fmt.Errorf("%w: DeadLetterFilter.Scope and DeadLetterFilter.ScopePrefix are both set (use one)", ErrInvalidConfig)
	case f.AfterID < 0:
		return fmt.Errorf("%w: DeadLetterFilter.AfterID %d is negative", ErrInvalidConfig, f.AfterID)
	case f.Limit < 0 || f.Limit > MaxDeadLetterLimit:
		return fmt.Errorf("%w: DeadLetterFilter.Limit %d must be 0 (default %d) to %d", ErrInvalidConfig, f.Limit, DefaultDeadLetterLimit, MaxDeadLetterLimit)
	case !f.Since.IsZero() && !f.Until.IsZero() && !f.Until.After(f.Since):
		return fmt.Errorf("%w: DeadLetterFilter.Until %s is not after Since %s", ErrInvalidConfig, f.Until.Format(time.RFC3339Nano), f.Since.Format(time.RFC3339Nano))
	}
	return nil
}

// PageSize is f.Limit with its default applied (DefaultDeadLetterLimit for
// 0).
func (f DeadLetterFilter) PageSize() int {
	if f.Limit == 0 {
		return DefaultDeadLetterLimit
	}
	return f.Limit
}

// Match reports whether d satisfies every condition of f except AfterID
// and Limit (the stores filter in their queries; Match states the same
// rule, for stores that filter in Go and for tests).
func (f DeadLetterFilter) Match(d DeadLetter) bool {
	switch {
	case f.Scope != "" && d.Scope != f.Scope,
		f.ScopePrefix != "" && !strings.HasPrefix(d.Scope, f.ScopePrefix),
		f.Reason != "" && d.Reason != f.Reason,
		!f.Since.IsZero() && d.CreatedAt.Before(f.Since),
		!f.Until.IsZero() && !d.CreatedAt.Before(f.Until),
		f.Redriven != nil && *f.Redriven != (d.RedrivenAt != nil):
		return false
	}
	return true
}

// RedrivableInPlace reports whether a dead letter of reason has a
// FAILED_FINAL record of its own that Redrive and RedriveDeadLetters may
// release: true for ReasonAttemptsExhausted, ReasonPermanentError and
// ReasonBadInput; false for the conflicts (ReasonMessageIDCollision,
// ReasonPayloadConflict, ReasonFingerprintConflict), whose record belongs to
// another message (re-drive those with RedriveAsNew), and for any other
// reason.
func RedrivableInPlace(reason string) bool {
	switch reason {
	case ReasonAttemptsExhausted, ReasonPermanentError, ReasonBadInput:
		return true
	}
	return false
}

// RedriveOptions tunes RedriveDeadLetters.
type RedriveOptions struct {
	// DryRun counts what would be re-driven and changes nothing:
	// RedriveSummary.Redriven stays 0 and Skipped counts the dead letters
	// that would be skipped, so Matched − Skipped would be re-driven (as
	// of the moment each page was read).
	DryRun bool
	// Batch is the dead letters read per step, each step one transaction
	// (Postgres) or one round of scripts (Redis): 0 = DefaultRedriveBatch
	// (500), 1 to MaxRedriveBatch (10000).
	Batch int
	// Operator names who asked, for the logs and audit (e.g. a login): at
	// most MaxKeyBytes (255) bytes of UTF-8 without NUL. Default "" (unknown).
	Operator string
	// Progress, when set, is called after each step with the dead letters
	// walked so far and the number the filter matched when the re-drive
	// started (a count taken first, so done may end above matched when dead
	// letters arrived meanwhile). It runs on the re-driving goroutine: keep
	// it fast.
	Progress func(done, matched int64)
}

// Validate returns an error wrapping ErrInvalidConfig naming the field: a
// Batch out of 0..MaxRedriveBatch, an Operator longer than MaxKeyBytes, not
// UTF-8, or holding NUL.
func (o RedriveOptions) Validate() error {
	switch {
	case o.Batch < 0 || o.Batch > MaxRedriveBatch:
		return fmt.Errorf("%w: RedriveOptions.Batch %d must be 0 (default %d) to %d", ErrInvalidConfig, o.Batch, DefaultRedriveBatch, MaxRedriveBatch)
	case len(o.Operator) > MaxKeyBytes || !utf8.ValidString(o.Operator) || strings.IndexByte(o.Operator, 0) >= 0:
		return fmt.Errorf("%w: RedriveOptions.Operator must be at most %d bytes of UTF-8 without NUL", ErrInvalidConfig, MaxKeyBytes)
	}
	return nil
}

// BatchSize is o.Batch with its default applied (DefaultRedriveBatch for 0).
func (o RedriveOptions) BatchSize() int {
	if o.Batch == 0 {
		return DefaultRedriveBatch
	}
	return o.Batch
}

// RedriveSummary is what RedriveDeadLetters did. Outside a dry run,
// Matched = Redriven + Skipped: each dead letter walked either released its
// record or was skipped.
type RedriveSummary struct {
	// Matched is how many dead letters the filter selected during the walk.
	Matched int64
	// Redriven is how many records were released FAILED_FINAL ->
	// FAILED_RETRYABLE (0 on DryRun). A record with two matching dead
	// letters counts once (the other dead letter is Skipped).
	Redriven int64
	// Skipped is how many matched dead letters were not re-drivable: the
	// record is gone (purged or expired) or not FAILED_FINAL (re-driven
	// already, or handled since), the dead letter is a conflict
	// (RedrivableInPlace is false: re-drive it with RedriveAsNew), it was
	// re-driven already, or another re-drive running at the same time
	// holds its record.
	Skipped int64
}
