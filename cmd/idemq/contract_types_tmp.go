package main

// TODO(lead): delete when the dead-letters branch merges.
//
// Temporary copies of the dead-letter contract's types
// (/work/wt/CONTRACT-deadletters.md), which dedup and dedup/pgstore get on
// the dead-letters branch. The CLI uses them only through the names below.
// When that branch merges, replace this whole file with:
//
//	type DeadLetterFilter = dedup.DeadLetterFilter
//	type RedriveOptions = dedup.RedriveOptions
//	type RedriveSummary = dedup.RedriveSummary
//	type RepublishOptions = pgstore.RepublishOptions
//	type RepublishResult = pgstore.RepublishResult
//
//	var (
//		_ deadLetterStore       = (*pgstore.Store)(nil)
//		_ deadLetterStore       = (*redisstore.Store)(nil)
//		_ deadLetterRepublisher = (*pgstore.Store)(nil)
//		_ redisDeadLetterPurger = (*redisstore.Store)(nil)
//	)
//
// (or sed the five names to dedup.* / pgstore.*); nothing else changes.

import (
	"fmt"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/outbox"
)

// DeadLetterFilter is a copy of dedup.DeadLetterFilter (contract).
type DeadLetterFilter struct {
	Scope       string    // exact scope; "" = every scope
	ScopePrefix string    // scope prefix (Postgres only; the Redis store returns ErrInvalidConfig if set)
	Reason      string    // exact reason (Reason* constants); "" = any
	Since       time.Time // CreatedAt >= Since; zero = no lower bound
	Until       time.Time // CreatedAt < Until; zero = no upper bound
	AfterID     int64     // keyset cursor: ID > AfterID (ScanDeadLetters pages)
	Limit       int       // ScanDeadLetters page size; 0 = 100, at most 10000
	Redriven    *bool     // nil = both; true = only re-driven ones; false = only not yet re-driven
}

// Validate is a copy of dedup.DeadLetterFilter.Validate (contract): an
// error wrapping ErrInvalidConfig naming the field.
func (f DeadLetterFilter) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{dedup.ErrInvalidConfig}, args...)...)
	}
	switch {
	case f.AfterID < 0:
		return bad("DeadLetterFilter.AfterID %d must not be negative", f.AfterID)
	case f.Limit < 0 || f.Limit > 10000:
		return bad("DeadLetterFilter.Limit %d must be 0 to 10000", f.Limit)
	case !f.Since.IsZero() && !f.Until.IsZero() && f.Until.Before(f.Since):
		return bad("DeadLetterFilter.Until %s is before Since %s", f.Until, f.Since)
	case f.Scope != "" && f.ScopePrefix != "":
		return bad("DeadLetterFilter.Scope and ScopePrefix are exclusive")
	}
	return nil
}

// RedriveOptions is a copy of dedup.RedriveOptions (contract).
type RedriveOptions struct {
	DryRun   bool                      // count what would be re-driven, change nothing
	Batch    int                       // dead letters per transaction; 0 = 500, 1..10000
	Operator string                    // audit: who asked (<=255 bytes UTF-8, no NUL)
	Progress func(done, matched int64) // called after each batch (may be nil)
}

// RedriveSummary is a copy of dedup.RedriveSummary (contract).
type RedriveSummary struct {
	Matched  int64 // dead letters the filter selected
	Redriven int64 // records released FAILED_FINAL -> FAILED_RETRYABLE (0 on DryRun)
	Skipped  int64 // matched but not re-drivable: record gone, not FAILED_FINAL, payload conflict, already re-driven
}

// RepublishOptions is a copy of pgstore.RepublishOptions (contract).
type RepublishOptions struct {
	Topic        string         // destination; "" = the dead letter's own Topic
	NewMessageID bool           // false: keep the dead letter's message ID; true: a derived ID (dedup.RedriveAsNewID)
	Outbox       *outbox.Outbox // required: the outbox whose table receives the row (same database)
	Operator     string
}

// RepublishResult is a copy of pgstore.RepublishResult (contract).
type RepublishResult struct {
	OutboxID  string // the outbox row's ID
	MessageID string // the message ID the row carries
	Already   bool   // true: an earlier call already republished this dead letter (no second row)
}
