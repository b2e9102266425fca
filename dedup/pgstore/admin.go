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
	return s.lookup(ctx, s.q.lookupByMessageIDSQL, scope, dedup.NormalizeKey(messageID))
}

// LookupBusinessKey returns the record of (scope, business key), or ErrNotFound.
func (s *Store) LookupBusinessKey(ctx context.Context, scope, businessKey string) (dedup.Record, error) {
	return s.lookup(ctx, s.q.lookupByBusinessKeySQL, scope, dedup.NormalizeKey(businessKey))
}

// lookup runs query (lookup_by_message_id or lookup_by_business_key) with
// key as stored (the callers normalize it).
func (s *Store) lookup(ctx context.Context, query, scope, key string) (dedup.Record, error) {
	var r dedup.Record
	var status string
	var lastErr, lastClass *string
	err := s.pool.QueryRow(ctx, query, scope, key).
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
	return s.listDeadLetters(ctx, s.q.deadLettersListSQL, scope, afterID, limit)
}

// listDeadLetters runs query (dead_letters_list or dead_letters_prefix)
// with the scope or prefix, as DeadLetters says.
func (s *Store) listDeadLetters(ctx context.Context, query, scope string, afterID int64, limit int) ([]dedup.DeadLetter, error) {
	if limit <= 0 {
		limit = 100
	}
	if limit > 10000 {
		return nil, fmt.Errorf("idemq: dead letters: limit %d above 10000", limit)
	}
	rows, err := s.pool.Query(ctx, query, scope, afterID, limit)
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
		tag, err := tx.Exec(ctx, s.q.redriveRecordSQL, scope, dedup.NormalizeKey(messageID))
		if err != nil {
			return fmt.Errorf("idemq: redrive: %w", err)
		}
		if tag.RowsAffected() == 0 {
			var status string
			err := tx.QueryRow(ctx, s.q.redriveRecordStatusSQL, scope, dedup.NormalizeKey(messageID)).Scan(&status)
			if errors.Is(err, pgx.ErrNoRows) {
				return dedup.ErrNotFound
			}
			if err != nil {
				return fmt.Errorf("idemq: redrive: %w", err)
			}
			return fmt.Errorf("%w: %s/%s is %s", dedup.ErrNotFinal, scope, messageID, status)
		}
		_, err = tx.Exec(ctx, s.q.redriveDeadLettersSQL, scope, dedup.NormalizeKey(messageID))
		return err
	})
}

// Purge deletes expired records (expires_at before the database's now()),
// walking them in primary-key (id, so insertion) order from the oldest, at
// most batch records per statement (default 1000, at most 100000, else an
// error wrapping dedup.ErrInvalidConfig): each statement reads the
// next batch records and deletes the expired ones among them, so it never
// deletes more than batch rows. Records without expires_at (PROCESSING,
// FAILED_RETRYABLE) are never purged, nor any record before its expires_at.
//
// The walk stops at the expiry frontier: after the first step that deleted
// nothing and whose records were all created less than
// Config.SucceededRetention ago (or at the highest id when the purge
// started). A record written under that retention or a longer one expires
// at least that long after its creation, so none of them lies expired
// beyond the frontier. One written by a Store with a shorter
// SucceededRetention may: it is deleted by this walk when a step around it
// deletes anything (scopes sharing the table with a shorter retention
// interleave their records with the others'), else by a purge once the
// records ahead of it are older than Config.SucceededRetention, or at once
// by a purge from a Store with the shorter retention. Records kept
// behind the frontier (FAILED_FINAL within its longer retention, and
// non-terminal records) are read again by every purge. Run one purge per
// table at a time: a second one walks the same records, waiting on the
// rows the first is deleting. docs/operations.md ("Purge cost and indexes")
// gives the costs.
//
// It returns how many rows it deleted, also with an error (ctx ending
// between statements, or a statement failing).
func (s *Store) Purge(ctx context.Context, batch int) (int64, error) {
	if batch <= 0 {
		batch = DefaultPurgeBatch
	}
	return s.PurgeRecords(ctx, PurgeOptions{Batch: batch})
}
