package pgstore

import (
	"context"
	"embed"
	"fmt"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/namedsql"
	"github.com/jackc/pgx/v5"
)

// maintSQLFS holds the statements of dead-letter retention and the
// maintenance loop.
//
//go:embed maintsql/*.sql
var maintSQLFS embed.FS

var maintStatements = namedsql.MustParseFS(maintSQLFS, "maintsql/*.sql")

// maintQueries are maintsql/*.sql with a Store's table names.
type maintQueries struct {
	deadLettersPurgeBoundSQL, deadLettersPurgeSQL string
}

func (s *Store) maintQueries() (maintQueries, error) {
	var m maintQueries
	err := maintStatements.Bind(s.q.tables, map[string]*string{
		"dead_letters_purge_bound": &m.deadLettersPurgeBoundSQL,
		"dead_letters_purge":       &m.deadLettersPurgeSQL,
	})
	if err != nil {
		return m, fmt.Errorf("idemq: maintenance statements: %w", err)
	}
	return m, nil
}

// DefaultPurgeBatch is the rows a purge step reads when PurgeOptions.Batch
// is 0.
const DefaultPurgeBatch = 1000

// PurgeOptions are the settings of one purge (Store.PurgeRecords,
// Store.PurgeDeadLetters).
type PurgeOptions struct {
	// Batch is how many rows one statement reads (the expired ones among
	// them are deleted), so the most it deletes. Default DefaultPurgeBatch
	// (1000); 1 to 100000.
	Batch int
	// OlderThan is the dead-letter retention of PurgeDeadLetters: dead
	// letters created longer ago than this (database time) are deleted.
	// Required there (at least 1m); not used by PurgeRecords, whose records
	// carry their own expires_at.
	OlderThan time.Duration
	// Progress, when set, is called after each statement with the rows
	// deleted so far by this purge (for an operator's progress line). It
	// runs on the purging goroutine: keep it fast.
	Progress func(deleted int64)
}

func (o PurgeOptions) batch() (int, error) {
	switch {
	case o.Batch == 0:
		return DefaultPurgeBatch, nil
	case o.Batch < 1 || o.Batch > 100000:
		return 0, fmt.Errorf("%w: PurgeOptions.Batch %d must be 1 to 100000", dedup.ErrInvalidConfig, o.Batch)
	}
	return o.Batch, nil
}

// PurgeRecords is Purge with options: o.Batch records per statement, and
// o.Progress called after each statement. When ctx ends, the statement in
// flight finishes (it is cancelled only 30s later) and the purge stops, so
// the count it returns with ctx's error is what it deleted (PurgeDeadLetters
// alike). It returns how many records it
// deleted, also with an error (ctx ending between statements, or a
// statement failing), and an error wrapping dedup.ErrInvalidConfig for a
// Batch out of range.
func (s *Store) PurgeRecords(ctx context.Context, o PurgeOptions) (int64, error) {
	batch, err := o.batch()
	if err != nil {
		return 0, err
	}
	return walkPurge(ctx, s.pool, "purge", s.q.purgeBoundSQL, s.q.purgeSQL, batch, s.cfg.SucceededRetention, 0, o.Progress)
}

// PurgeDeadLetters deletes the dead letters created more than o.OlderThan
// ago (database time), re-driven or not, with their re-drive audit rows,
// walking the table in primary-key order as Purge walks the records: at
// most o.Batch per statement, stopping at the first step whose dead letters
// are all younger than o.OlderThan and of which none was deleted. A dead
// letter whose re-drive as new (RedriveAsNew) was requested and not yet
// published is kept. Live dead letters younger than o.OlderThan are never
// deleted; keep o.OlderThan at least Config.FailedFinalRetention so that a
// FAILED_FINAL record never outlives its dead letter (MaintenanceConfig
// checks that). A RedriveAsNew of a dead letter at the moment the purge
// deletes it makes that statement fail (the new audit row references it):
// the purge returns the error, nothing is lost, and the next purge keeps
// the dead letter while the re-drive is unpublished.
//
// It returns how many dead letters it deleted, also with an error, and an
// error wrapping dedup.ErrInvalidConfig when o.OlderThan is under 1m or
// o.Batch out of range.
func (s *Store) PurgeDeadLetters(ctx context.Context, o PurgeOptions) (int64, error) {
	batch, err := o.batch()
	if err != nil {
		return 0, err
	}
	if o.OlderThan < time.Minute {
		return 0, fmt.Errorf("%w: PurgeOptions.OlderThan %s must be at least 1m", dedup.ErrInvalidConfig, o.OlderThan)
	}
	m, err := s.maintQueries()
	if err != nil {
		return 0, err
	}
	return walkPurge(ctx, s.pool, "purge dead letters", m.deadLettersPurgeBoundSQL, m.deadLettersPurgeSQL, batch, o.OlderThan, 0, o.Progress)
}

// stopGrace is how long a purge statement in flight may run on after the
// purge's ctx ended before it is cancelled.
const stopGrace = 30 * time.Second

// rowQuerier is a *pgxpool.Pool or a *pgxpool.Conn.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// walkPurge runs step on q (args: after id, batch, bound, young seconds;
// scans last id, deleted, all young) from id 0 to the bound read by
// boundSQL or to the frontier, as Purge describes, sleeping pause between
// statements (0: none) and calling progress (when set) after a statement
// that deleted rows.
func walkPurge(ctx context.Context, q rowQuerier, what, boundSQL, step string, batch int, young, pause time.Duration, progress func(int64)) (int64, error) {
	var bound int64
	if err := q.QueryRow(ctx, boundSQL).Scan(&bound); err != nil {
		return 0, fmt.Errorf("idemq: %s: %w", what, err)
	}
	// A statement in flight when ctx ends finishes (each deletes at most
	// batch rows), so the count returned is what was deleted; it is
	// cancelled only if it runs on for stopGrace after that.
	stmtCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stopAfter := context.AfterFunc(ctx, func() { time.AfterFunc(stopGrace, cancel) })
	defer stopAfter()
	var total, after int64
	for {
		if err := ctx.Err(); err != nil {
			return total, fmt.Errorf("idemq: %s: %w", what, err)
		}
		var last *int64
		var deleted int64
		var allYoung bool
		if err := q.QueryRow(stmtCtx, step, after, batch, bound, young.Seconds()).Scan(&last, &deleted, &allYoung); err != nil {
			return total, fmt.Errorf("idemq: %s: %w", what, err)
		}
		total += deleted
		if progress != nil && deleted > 0 {
			progress(total)
		}
		if last == nil || *last >= bound || (deleted == 0 && allYoung) {
			return total, nil
		}
		after = *last
		if pause > 0 && !sleep(ctx, pause) {
			return total, fmt.Errorf("idemq: %s: %w", what, ctx.Err())
		}
	}
}
