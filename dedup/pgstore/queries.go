package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// queries holds the SQL of one Store, built once from quoted identifiers.
type queries struct {
	records, deadLetters string // quoted, schema-qualified

	insertSQL, lockSQL, reclaimSQL, succeededSQL, failedSQL, deadLetterSQL string

	leaseInsertSQL, leaseLockSQL, leaseTakeSQL, leaseBeatSQL, leaseDoneSQL, leaseFailSQL, leaseReleaseSQL string

	crash crashLoopQueries // crashloop.go
}

func newQueries(cfg Config) queries {
	q := queries{
		records:     pgx.Identifier{cfg.Schema, cfg.RecordsTable}.Sanitize(),
		deadLetters: pgx.Identifier{cfg.Schema, cfg.DeadLettersTable}.Sanitize(),
	}
	// One statement claims: a conflict on either unique index (message ID, or
	// non-empty business key) inserts nothing and returns no row.
	q.insertSQL = `insert into ` + q.records + ` as r
  (scope, message_id, business_key, fingerprint, fingerprint_key_id, status, attempts,
   last_error, last_error_class, source, reconsume_times, expires_at)
values ($1, $2, $3, $4, $5, $6, $7, nullif($8, ''), nullif($9, ''), $10, $11,
        now() + make_interval(secs => $12::float8))
on conflict do nothing
returning id`
	// The record matching the message ID wins over one matching only the
	// business key. FOR UPDATE makes a second copy wait for the first.
	q.lockSQL = `select id, message_id, business_key, fingerprint, fingerprint_key_id, status, attempts
from ` + q.records + `
where id = (` + q.matchSQL() + `)
for update`
	q.reclaimSQL = `update ` + q.records + `
set status = 'PROCESSING', attempts = attempts + 1, source = $2, reconsume_times = $3, updated_at = now()
where id = $1 and status = 'FAILED_RETRYABLE'
returning attempts`
	q.succeededSQL = `update ` + q.records + `
set status = 'SUCCEEDED', updated_at = now(), expires_at = now() + make_interval(secs => $2::float8)
where id = $1 and status = 'PROCESSING'`
	// $6: whether this mark counts a new attempt (false when the claim in
	// the same transaction already counted it).
	q.failedSQL = `update ` + q.records + `
set status = $2, attempts = attempts + case when $6 then 1 else 0 end, last_error = $3, last_error_class = $4,
    source = $7, reconsume_times = $8, updated_at = now(),
    expires_at = now() + make_interval(secs => $5::float8)
where id = $1`
	// The partial unique index on live dead letters makes a repeated poison
	// message or conflict write one row, not one per copy.
	q.deadLetterSQL = `insert into ` + q.deadLetters + `
  (scope, message_id, business_key, reason, error, error_class, fingerprint, attempts,
   topic, message_key, headers, payload, source)
values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
on conflict (scope, message_id, reason, (coalesce(fingerprint, ''::bytea))) where redriven_at is null do nothing
returning id`
	q.leaseSQL()
	q.crash = newCrashLoopQueries(&q, pgx.Identifier{cfg.Schema, cfg.RecordsTable + laneWatermarksSuffix}.Sanitize())
	return q
}

// matchSQL selects the id of the record holding (scope $1, message ID $2)
// or, failing that, (scope $1, non-empty business key $3). It is a union of
// two index lookups, so that even a generic plan of a prepared statement
// (pgx caches statements; Postgres switches to generic plans) never scans the
// table: an OR over the two keys would.
func (q *queries) matchSQL() string {
	return `select id from (
    select id, 0 as pri from ` + q.records + ` where scope = $1 and message_id = $2
    union all
    select id, 1 from ` + q.records + ` where scope = $1 and business_key = $3 and business_key <> ''
  ) m order by pri limit 1`
}

// leaseSQL builds lease mode's statements. Every deadline is computed from
// the database's now(), never the application clock (S14).
func (q *queries) leaseSQL() {
	q.leaseInsertSQL = `insert into ` + q.records + `
  (scope, message_id, business_key, fingerprint, fingerprint_key_id, status, attempts, source, reconsume_times,
   owner_token, fence, lease_until)
values ($1, $2, $3, $4, $5, 'PROCESSING', 1, $6, $7, $8, 1, now() + make_interval(secs => $9::float8))
on conflict do nothing
returning id`
	q.leaseLockSQL = `select id, message_id, business_key, fingerprint, fingerprint_key_id, status, attempts,
  coalesce(lease_until > now(), false)
from ` + q.records + `
where id = (` + q.matchSQL() + `)
for update`
	q.leaseTakeSQL = `update ` + q.records + `
set status = 'PROCESSING', attempts = attempts + 1, fence = fence + 1, owner_token = $2,
    lease_until = now() + make_interval(secs => $3::float8), source = $4, reconsume_times = $5, updated_at = now()
where id = $1
returning attempts, fence`
	q.leaseBeatSQL = `update ` + q.records + `
set lease_until = now() + make_interval(secs => $4::float8), updated_at = now()
where id = $1 and owner_token = $2 and fence = $3 and status = 'PROCESSING'`
	// The marks that end a lease (done, release, fail) return two booleans:
	// this statement made the mark, and an earlier run of the same mark (same
	// owner token and fence, the status it writes) had already made it. The
	// owner token and fence stay on the row after the lease ends, so a mark
	// retried after its answer was lost recognises its own first run (see
	// lease_unknown.go). The second EXISTS reads the row as it was before
	// this statement.
	mark := func(set, status string) string {
		return `with m as (
  update ` + q.records + `
  set ` + set + `
  where id = $1 and owner_token = $2 and fence = $3 and status = 'PROCESSING'
  returning 1)
select exists (select 1 from m),
       exists (select 1 from ` + q.records + ` where id = $1 and owner_token = $2 and fence = $3 and status = ` + status + `)`
	}
	q.leaseDoneSQL = mark(`status = 'SUCCEEDED', lease_until = null, updated_at = now(),
      expires_at = now() + make_interval(secs => $4::float8)`, `'SUCCEEDED'`)
	// Release gives a lease back after a shutdown interrupted its handler:
	// the attempt is not counted, the next copy runs the handler.
	q.leaseReleaseSQL = mark(`status = 'FAILED_RETRYABLE', attempts = greatest(attempts - 1, 0), lease_until = null,
      updated_at = now()`, `'FAILED_RETRYABLE'`)
	q.leaseFailSQL = mark(`status = $4, last_error = $5, last_error_class = $6, lease_until = null, updated_at = now(),
      expires_at = now() + make_interval(secs => $7::float8)`, `$4`)
}

// lockLease is lock plus whether the record's lease is live in database time.
func (q *queries) lockLease(ctx context.Context, tx pgx.Tx, id dedup.Identity) (*record, bool, error) {
	var r record
	var status string
	var live bool
	err := tx.QueryRow(ctx, q.leaseLockSQL, id.Scope, id.MessageID, id.BusinessKey).
		Scan(&r.id, &r.messageID, &r.businessKey, &r.fingerprint, &r.keyID, &status, &r.attempts, &live)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("idemq: lock record %s: %w", id, err)
	}
	r.status = dedup.Status(status)
	return &r, live, nil
}

// insert returns the new row's id, or 0 when a unique key already exists.
func (q *queries) insert(ctx context.Context, tx pgx.Tx, msg *dedup.Message, sum []byte, keyID string, status dedup.Status, attempts int, errText, errClass string, expirySecs *float64) (int64, error) {
	id := msg.Identity
	var rowID int64
	err := tx.QueryRow(ctx, q.insertSQL, id.Scope, id.MessageID, id.BusinessKey, sum, keyID, string(status), attempts,
		errText, errClass, clip(msg.Source, 1024), msg.ReconsumeTimes, expirySecs).Scan(&rowID)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("idemq: claim %s: %w", id, err)
	}
	return rowID, nil
}

// handlerSavepoint is set before every handler run so that a failing handler
// rolls back alone and its failure is marked in the same transaction.
const handlerSavepoint = "idemq_handler"

// claimInsert inserts a new record (status PROCESSING, or SUCCEEDED with its
// expiry when the caller commits only if the handler succeeds), and, in the
// same round trip, locks the record that already holds either unique key
// (when the insert did nothing) and sets the handler's savepoint. It returns
// the new row's id, or 0 and the locked existing record (nil when it vanished
// in between). A reclaim sets the savepoint again after its update.
func (q *queries) claimInsert(ctx context.Context, tx pgx.Tx, msg *dedup.Message, sum []byte, keyID string, status dedup.Status, expirySecs *float64) (int64, *record, error) {
	id := msg.Identity
	b := &pgx.Batch{}
	b.Queue(q.insertSQL, id.Scope, id.MessageID, id.BusinessKey, sum, keyID, string(status), 1,
		"", "", clip(msg.Source, 1024), msg.ReconsumeTimes, expirySecs)
	b.Queue(q.lockSQL, id.Scope, id.MessageID, id.BusinessKey)
	b.Queue("savepoint " + handlerSavepoint)
	br := tx.SendBatch(ctx, b)
	var rowID int64
	err := br.QueryRow().Scan(&rowID)
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil
	}
	var rec *record
	if err == nil {
		var r record
		var st string
		err = br.QueryRow().Scan(&r.id, &r.messageID, &r.businessKey, &r.fingerprint, &r.keyID, &st, &r.attempts)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			err = nil
		case err == nil && rowID == 0:
			r.status = dedup.Status(st)
			rec = &r
		}
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, nil, fmt.Errorf("idemq: claim %s: %w", id, err)
	}
	return rowID, rec, nil
}

func (q *queries) lock(ctx context.Context, tx pgx.Tx, id dedup.Identity) (*record, error) {
	var r record
	var status string
	err := tx.QueryRow(ctx, q.lockSQL, id.Scope, id.MessageID, id.BusinessKey).
		Scan(&r.id, &r.messageID, &r.businessKey, &r.fingerprint, &r.keyID, &status, &r.attempts)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("idemq: lock record %s: %w", id, err)
	}
	r.status = dedup.Status(status)
	return &r, nil
}

func (q *queries) reclaim(ctx context.Context, tx pgx.Tx, rowID int64, msg *dedup.Message) (int, error) {
	var attempts int
	if err := tx.QueryRow(ctx, q.reclaimSQL, rowID, clip(msg.Source, 1024), msg.ReconsumeTimes).Scan(&attempts); err != nil {
		return 0, fmt.Errorf("idemq: reclaim %s: %w", msg.Identity, err)
	}
	return attempts, nil
}

func (q *queries) markSucceeded(ctx context.Context, tx pgx.Tx, id dedup.Identity, rowID int64, expirySecs float64) error {
	tag, err := tx.Exec(ctx, q.succeededSQL, rowID, expirySecs)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("idemq: mark succeeded %s: %d records in PROCESSING", id, tag.RowsAffected())
	}
	return nil
}

func (q *queries) updateFailed(ctx context.Context, tx pgx.Tx, rowID int64, status dedup.Status, newAttempt bool, msg *dedup.Message, errText, errClass string, expirySecs *float64) error {
	if _, err := tx.Exec(ctx, q.failedSQL, rowID, string(status), errText, errClass, expirySecs, newAttempt,
		clip(msg.Source, 1024), msg.ReconsumeTimes); err != nil {
		return fmt.Errorf("idemq: mark %s: %w", status, err)
	}
	return nil
}

func (q *queries) insertDeadLetter(ctx context.Context, tx pgx.Tx, msg *dedup.Message, sum []byte, reason string, cause error, attempts, maxErr int) (int64, error) {
	return q.insertDeadLetterClass(ctx, tx, msg, sum, reason, cause, dedup.ErrorClass(cause), attempts, maxErr)
}

// insertDeadLetterClass is insertDeadLetter with the error class given.
func (q *queries) insertDeadLetterClass(ctx context.Context, tx pgx.Tx, msg *dedup.Message, sum []byte, reason string, cause error, class string, attempts, maxErr int) (int64, error) {
	id := msg.Identity
	headers := make(map[string]string, len(msg.Headers))
	for k, v := range msg.Headers {
		headers[clip(k, 1024)] = clip(v, 8192)
	}
	var dlID int64
	err := tx.QueryRow(ctx, q.deadLetterSQL, id.Scope, id.MessageID, id.BusinessKey, reason,
		clip(cause.Error(), maxErr), class, sum, attempts, clip(msg.Topic, 1024), msg.Key,
		headers, msg.Payload, clip(msg.Source, 1024)).Scan(&dlID)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("idemq: dead letter %s: %w", id, err)
	}
	return dlID, nil
}
