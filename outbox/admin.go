package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Row is an outbox row as stored, for inspection, operators and tests.
type Row struct {
	// Seq orders rows: database-assigned at insert, increasing.
	Seq int64
	// ID is the row's UUIDv7, its message ID unless MessageID is set.
	ID uuid.UUID
	// Topic is Message.Topic.
	Topic string
	// Key is Message.Key; nil when the row has none (an empty key is
	// stored as none).
	Key []byte
	// Headers are Message.Headers as written (never the message-ID or
	// causation header: Envelope adds those).
	Headers map[string]string
	// Payload is Message.Payload; nil when it was nil.
	Payload []byte
	// CausationID is Message.CausationID ("" when none).
	CausationID string
	// CreatedAt is the database time of the insert.
	CreatedAt time.Time
	// AvailableAt is when the row may next be published: insert time plus
	// Message.Delay, then after each failed publish, the failure time plus
	// the retry delay.
	AvailableAt time.Time
	// Attempts counts recorded publish attempts (successful or failed). A
	// publish whose mark was lost (crash between publish and mark) is not
	// counted.
	Attempts int
	// LastError is the error of the most recent failed publish, at most
	// RelayConfig.MaxErrorBytes (2048) bytes; "" when none. It is kept
	// after the row publishes, as history: a published row with a
	// LastError failed before and was published since; an unpublished one
	// is failing now.
	LastError string
	// LastErrorAt is the database time of the most recent failed publish
	// (nil when none, and for rows published before migration 002, which
	// did not record it).
	LastErrorAt *time.Time
	// LastAttemptAt is the database time of the most recent recorded
	// attempt (nil when none).
	LastAttemptAt *time.Time
	// ParkedAt is set when the row failed RelayConfig.MaxAttempts times;
	// a parked row is not published, and holds back the later rows of its
	// key, until an operator calls Unpark.
	ParkedAt *time.Time
	// PublishedAt is the database time at which a relay marked the row
	// published (nil while unpublished).
	PublishedAt *time.Time
	// PublishedBy is the RelayConfig.Name of the relay that marked it.
	PublishedBy string
	// MessageID is Message.MessageID: the caller-chosen message ID the
	// row is published under; "" when it is published under ID (migration
	// 003 added the column; older rows have "").
	MessageID string
}

// ErrNotFound is returned by Get when no row has the ID.
var ErrNotFound = errors.New("idemq/outbox: row not found")

func scanRow(r pgx.Row) (Row, error) {
	var row Row
	err := r.Scan(&row.Seq, &row.ID, &row.Topic, &row.Key, &row.Headers, &row.Payload, &row.CausationID,
		&row.CreatedAt, &row.AvailableAt, &row.Attempts, &row.LastError, &row.LastErrorAt, &row.LastAttemptAt, &row.ParkedAt,
		&row.PublishedAt, &row.PublishedBy, &row.MessageID)
	return row, err
}

// Get returns the row with message ID id, or ErrNotFound.
func (o *Outbox) Get(ctx context.Context, id uuid.UUID) (Row, error) {
	if o.pool == nil {
		return Row{}, ErrNoPool
	}
	row, err := scanRow(o.pool.QueryRow(ctx, o.q.getSQL, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Row{}, ErrNotFound
	}
	if err != nil {
		return Row{}, fmt.Errorf("idemq/outbox: get %s: %w", id, err)
	}
	return row, nil
}

// ListOptions select the rows List returns.
type ListOptions struct {
	// AfterSeq starts the list after this seq; 0 (the default) starts at the
	// first row.
	AfterSeq int64
	// Limit is how many rows at most: 1 to 10,000. Required.
	Limit int
	// PendingOnly lists only rows not yet published (parked ones
	// included); the default lists every row.
	PendingOnly bool
}

// List returns up to opt.Limit rows in seq order, starting after
// opt.AfterSeq; opt.PendingOnly selects only unpublished rows.
func (o *Outbox) List(ctx context.Context, opt ListOptions) ([]Row, error) {
	query := o.q.listAllSQL
	if opt.PendingOnly {
		query = o.q.listPendingSQL
	}
	return o.list(ctx, query, opt.AfterSeq, opt.Limit)
}

// Parked returns up to limit parked rows (1 to 10,000), oldest first.
func (o *Outbox) Parked(ctx context.Context, limit int) ([]Row, error) {
	return o.list(ctx, o.q.listParkedSQL, 0, limit)
}

func (o *Outbox) list(ctx context.Context, sql string, after int64, limit int) ([]Row, error) {
	if o.pool == nil {
		return nil, ErrNoPool
	}
	if limit < 1 || limit > 10_000 {
		return nil, fmt.Errorf("idemq/outbox: limit %d must be 1 to 10000", limit)
	}
	rows, err := o.pool.Query(ctx, sql, after, limit)
	if err != nil {
		return nil, fmt.Errorf("idemq/outbox: list: %w", err)
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		row, err := scanRow(rows)
		if err != nil {
			return nil, fmt.Errorf("idemq/outbox: list: %w", err)
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idemq/outbox: list: %w", err)
	}
	return out, nil
}

// Unpark makes parked rows publishable again now, with attempts reset to 0
// (the last error is kept), and wakes the relays. It returns how many rows
// it changed; IDs that are not parked are ignored.
func (o *Outbox) Unpark(ctx context.Context, ids ...uuid.UUID) (int64, error) {
	if o.pool == nil {
		return 0, ErrNoPool
	}
	tag, err := o.pool.Exec(ctx, o.q.unparkSQL, ids)
	if err != nil {
		return 0, fmt.Errorf("idemq/outbox: unpark: %w", err)
	}
	if tag.RowsAffected() > 0 {
		_, _ = o.pool.Exec(ctx, o.q.notifySQL, o.q.channel)
	}
	return tag.RowsAffected(), nil
}

// Stats is a snapshot of an outbox table.
type Stats struct {
	// Pending counts unpublished rows that are not parked (including rows
	// waiting for a retry or a Delay).
	Pending int64
	// Failing counts the Pending rows whose last publish attempt failed:
	// failing now, waiting for a retry (a row unparked after failures
	// counts until it publishes).
	Failing int64
	// Parked counts parked rows.
	Parked int64
	// Published counts published rows not yet purged.
	Published int64
	// PublishedAfterFailure counts the Published rows that failed at least
	// once before they were published: failed before, published since.
	PublishedAfterFailure int64
	// LastErrorAt is the database time of the most recent failed publish
	// among the rows not yet purged; zero when none (or only failures
	// older than migration 002, which did not record it).
	LastErrorAt time.Time
	// OldestPending is the age of the oldest pending row (database now()
	// minus its created_at): the relay lag. Zero when nothing is pending.
	OldestPending time.Duration
}

// Stats counts the table's rows by state. It scans the table: meant for
// status pages and tests, not for a hot path.
func (o *Outbox) Stats(ctx context.Context) (Stats, error) {
	if o.pool == nil {
		return Stats{}, ErrNoPool
	}
	var s Stats
	var lagSecs float64
	var lastErrorAt *time.Time
	err := o.pool.QueryRow(ctx, o.q.statsSQL).Scan(&s.Pending, &s.Failing, &s.Parked, &s.Published, &s.PublishedAfterFailure, &lastErrorAt, &lagSecs)
	if err != nil {
		return Stats{}, fmt.Errorf("idemq/outbox: stats: %w", err)
	}
	if lastErrorAt != nil {
		s.LastErrorAt = *lastErrorAt
	}
	s.OldestPending = time.Duration(lagSecs * float64(time.Second))
	return s, nil
}

// Purge deletes rows published more than olderThan ago (database time), in
// batches of batch rows (1 to 100,000), until none is left or ctx ends, and
// returns how many it deleted. Unpublished and parked rows are never
// deleted. Concurrent purges skip each other's rows. The relay calls it on
// its own (RelayConfig.Retention).
func (o *Outbox) Purge(ctx context.Context, olderThan time.Duration, batch int) (int64, error) {
	return o.purge(ctx, olderThan, batch, nil, false)
}

// PurgeWithProgress is Purge for an operator (`idemq outbox purge`):
// progress, when not nil, is called after each statement that deleted rows
// with the rows deleted so far, and when ctx ends the statement in flight
// still finishes (it is cancelled only 30s later), then the purge stops and
// returns ctx's error, so the count it returns is exactly what left the
// table.
func (o *Outbox) PurgeWithProgress(ctx context.Context, olderThan time.Duration, batch int, progress func(deleted int64)) (int64, error) {
	return o.purge(ctx, olderThan, batch, progress, true)
}

func (o *Outbox) purge(ctx context.Context, olderThan time.Duration, batch int, progress func(int64), finishStatement bool) (int64, error) {
	if o.pool == nil {
		return 0, ErrNoPool
	}
	if batch < 1 || batch > 100_000 || olderThan < 0 {
		return 0, fmt.Errorf("idemq/outbox: purge: batch %d must be 1 to 100000 and olderThan %s not negative", batch, olderThan)
	}
	var total int64
	for {
		stmtCtx, cancel := ctx, context.CancelFunc(func() {})
		if finishStatement {
			if err := ctx.Err(); err != nil {
				return total, err
			}
			stmtCtx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		}
		tag, err := o.pool.Exec(stmtCtx, o.q.purgeSQL, olderThan.Seconds(), batch)
		cancel()
		if err != nil {
			return total, fmt.Errorf("idemq/outbox: purge: %w", err)
		}
		total += tag.RowsAffected()
		if progress != nil && tag.RowsAffected() > 0 {
			progress(total)
		}
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			if finishStatement {
				return total, err
			}
			return total, nil
		}
	}
}
