package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// Lookup returns the record of (scope, message ID) (key is normalized with
// NormalizeKey first), or ErrNotFound.
func (s *Store) Lookup(ctx context.Context, scope, messageID string) (dedup.Record, error) {
	return s.lookup(ctx, "message_id", scope, messageID)
}

// LookupBusinessKey returns the record of (scope, business key), or ErrNotFound.
func (s *Store) LookupBusinessKey(ctx context.Context, scope, businessKey string) (dedup.Record, error) {
	return s.lookup(ctx, "business_key", scope, businessKey)
}

func (s *Store) lookup(ctx context.Context, col, scope, key string) (dedup.Record, error) {
	var r dedup.Record
	var status string
	var lastErr, lastClass *string
	err := s.pool.QueryRow(ctx, `select scope, message_id, business_key, fingerprint, fingerprint_key_id, status,
  attempts, last_error, last_error_class, fence, source, reconsume_times, created_at, updated_at, expires_at
from `+s.q.records+` where scope = $1 and `+pgx.Identifier{col}.Sanitize()+` = $2 and `+pgx.Identifier{col}.Sanitize()+` <> ''`, scope, dedup.NormalizeKey(key)).
		Scan(&r.Scope, &r.MessageID, &r.BusinessKey, &r.Fingerprint, &r.FingerprintKeyID, &status, &r.Attempts,
			&lastErr, &lastClass, &r.Fence, &r.Source, &r.ReconsumeTimes, &r.CreatedAt, &r.UpdatedAt, &r.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return dedup.Record{}, dedup.ErrNotFound
	}
	if err != nil {
		return dedup.Record{}, fmt.Errorf("idemq: lookup: %w", err)
	}
	r.Status = dedup.Status(status)
	if lastErr != nil {
		r.LastError = *lastErr
	}
	if lastClass != nil {
		r.LastErrorClass = *lastClass
	}
	return r, nil
}

// DeadLetters lists the dead letters of scope, oldest first, at most limit
// rows (1 to 10000; 0 means 100), starting after id afterID (0 for the start),
// each with RedrivenAs when RedriveAsNew re-drove it.
func (s *Store) DeadLetters(ctx context.Context, scope string, afterID int64, limit int) ([]dedup.DeadLetter, error) {
	if limit <= 0 {
		limit = 100
	}
	if limit > 10000 {
		return nil, fmt.Errorf("idemq: dead letters: limit %d above 10000", limit)
	}
	rows, err := s.pool.Query(ctx, `select d.id, d.scope, d.message_id, d.business_key, d.reason, d.error, d.error_class,
  d.attempts, d.topic, d.message_key, d.payload, d.headers, d.source, d.created_at, d.redriven_at,
  coalesce(r.new_message_id, '')
from `+s.q.deadLetters+` d left join `+s.redrivesTable()+` r on r.dead_letter_id = d.id
where d.scope = $1 and d.id > $2 order by d.id limit $3`, scope, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("idemq: dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (dedup.DeadLetter, error) {
		var d dedup.DeadLetter
		err := row.Scan(&d.ID, &d.Scope, &d.MessageID, &d.BusinessKey, &d.Reason, &d.Error, &d.ErrorClass, &d.Attempts,
			&d.Topic, &d.Key, &d.Payload, &d.Headers, &d.Source, &d.CreatedAt, &d.RedrivenAt, &d.RedrivenAs)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("idemq: dead letters: %w", err)
	}
	return out, nil
}

// Redrive is the operator's re-drive of a FAILED_FINAL record of (scope,
// message ID): the record becomes FAILED_RETRYABLE (attempts kept, so each
// re-drive allows one more execution before it is final again) and its live
// dead letters are stamped redriven_at. The next delivery of the message runs
// the handler. It returns ErrNotFound when no record matches and ErrNotFinal
// when the record is not FAILED_FINAL. A Kafka message whose offset was
// committed is not redelivered by the broker on its own: republish it (its
// payload and headers are in the dead letter) or reset the group's offset.
func (s *Store) Redrive(ctx context.Context, scope, messageID string) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `update `+s.q.records+`
set status = 'FAILED_RETRYABLE', expires_at = null, updated_at = now()
where scope = $1 and message_id = $2 and status = 'FAILED_FINAL'`, scope, dedup.NormalizeKey(messageID))
		if err != nil {
			return fmt.Errorf("idemq: redrive: %w", err)
		}
		if tag.RowsAffected() == 0 {
			var status string
			err := tx.QueryRow(ctx, `select status from `+s.q.records+` where scope = $1 and message_id = $2`, scope, dedup.NormalizeKey(messageID)).Scan(&status)
			if errors.Is(err, pgx.ErrNoRows) {
				return dedup.ErrNotFound
			}
			if err != nil {
				return fmt.Errorf("idemq: redrive: %w", err)
			}
			return fmt.Errorf("%w: %s/%s is %s", dedup.ErrNotFinal, scope, messageID, status)
		}
		_, err = tx.Exec(ctx, `update `+s.q.deadLetters+` set redriven_at = now()
where scope = $1 and message_id = $2 and redriven_at is null`, scope, dedup.NormalizeKey(messageID))
		return err
	})
}

// Purge deletes expired records (expires_at before the database's now()), at
// most batch rows per statement (default 1000), until none is left or ctx
// ends. Records without expires_at (PROCESSING, FAILED_RETRYABLE) are never
// purged. It returns how many rows it deleted.
func (s *Store) Purge(ctx context.Context, batch int) (int64, error) {
	if batch <= 0 {
		batch = 1000
	}
	var total int64
	for {
		tag, err := s.pool.Exec(ctx, `delete from `+s.q.records+` where id in (
  select id from `+s.q.records+` where expires_at < now() order by expires_at limit $1 for update skip locked)`, batch)
		if err != nil {
			return total, fmt.Errorf("idemq: purge: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
	}
}
