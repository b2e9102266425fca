package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Record is a consumption record as stored, for inspection and tests. JSON
// field names are the table's column names.
type Record struct {
	// Scope, MessageID and BusinessKey are the identity, normalized
	// (NormalizeKey); BusinessKey is "" when the message had none.
	Scope       string `json:"scope"`
	MessageID   string `json:"message_id"`
	BusinessKey string `json:"business_key"`
	// Fingerprint is the HMAC-SHA256 of the payload (32 bytes; empty for a
	// record of bad input whose payload could not be fingerprinted) under the
	// key FingerprintKeyID.
	Fingerprint      []byte `json:"fingerprint"`
	FingerprintKeyID string `json:"fingerprint_key_id"`
	// Status is the record's state.
	Status Status `json:"status"`
	// Attempts counts handler executions started.
	Attempts int `json:"attempts"`
	// LastError and LastErrorClass describe the latest failure (ErrorClass;
	// the text bounded by Config.MaxErrorBytes); "" when none.
	LastError      string `json:"last_error"`
	LastErrorClass string `json:"last_error_class"`
	// Fence grows by one at every lease-mode claim or takeover; 0 for
	// records only ever handled in atomic mode.
	Fence int64 `json:"fence"`
	// Source is the broker position of the latest copy handled, e.g.
	// "kafka:payments/2/1041".
	Source string `json:"source"`
	// ReconsumeTimes is RocketMQ's counter on the latest copy handled.
	ReconsumeTimes int32 `json:"reconsume_times"`
	// CreatedAt and UpdatedAt are database times.
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// ExpiresAt is nil while the record must be kept (not final yet).
	ExpiresAt *time.Time `json:"expires_at"`
}

// ErrNotFound is returned by Lookup and Redrive when no record matches.
var ErrNotFound = errors.New("idemq: record not found")

// ErrNotFinal is returned by Redrive for a record that exists but is not
// FAILED_FINAL (only final failures can be re-driven); the error names the
// record's status.
var ErrNotFinal = errors.New("idemq: record is not FAILED_FINAL")

// Lookup returns the record of (scope, message ID) (key is normalized with
// NormalizeKey first), or ErrNotFound.
func (s *Store) Lookup(ctx context.Context, scope, messageID string) (Record, error) {
	return s.lookup(ctx, "message_id", scope, messageID)
}

// LookupBusinessKey returns the record of (scope, business key), or ErrNotFound.
func (s *Store) LookupBusinessKey(ctx context.Context, scope, businessKey string) (Record, error) {
	return s.lookup(ctx, "business_key", scope, businessKey)
}

func (s *Store) lookup(ctx context.Context, col, scope, key string) (Record, error) {
	var r Record
	var status string
	var lastErr, lastClass *string
	err := s.pool.QueryRow(ctx, `select scope, message_id, business_key, fingerprint, fingerprint_key_id, status,
  attempts, last_error, last_error_class, fence, source, reconsume_times, created_at, updated_at, expires_at
from `+s.q.records+` where scope = $1 and `+pgx.Identifier{col}.Sanitize()+` = $2 and `+pgx.Identifier{col}.Sanitize()+` <> ''`, scope, NormalizeKey(key)).
		Scan(&r.Scope, &r.MessageID, &r.BusinessKey, &r.Fingerprint, &r.FingerprintKeyID, &status, &r.Attempts,
			&lastErr, &lastClass, &r.Fence, &r.Source, &r.ReconsumeTimes, &r.CreatedAt, &r.UpdatedAt, &r.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, ErrNotFound
	}
	if err != nil {
		return Record{}, fmt.Errorf("idemq: lookup: %w", err)
	}
	r.Status = Status(status)
	if lastErr != nil {
		r.LastError = *lastErr
	}
	if lastClass != nil {
		r.LastErrorClass = *lastClass
	}
	return r, nil
}

// DeadLetter is one row of the dead-letter table: a delivery that could not
// be applied, kept whole.
type DeadLetter struct {
	// ID orders dead letters (use it as the DeadLetters cursor).
	ID int64
	// Scope, MessageID and BusinessKey are the delivery's identity.
	Scope, MessageID, BusinessKey string
	// Reason is one of the Reason* constants.
	Reason string
	// Error and ErrorClass are the cause (ErrorClass of the error).
	Error, ErrorClass string
	// Attempts is the record's attempts when the delivery was dead-lettered.
	Attempts int
	// Topic, Key, Payload and Headers are the message as delivered.
	Topic        string
	Key, Payload []byte
	Headers      map[string]string
	// Source is the broker position of the copy.
	Source string
	// CreatedAt is the database time of the dead-lettering.
	CreatedAt time.Time
	// RedrivenAt is set once an operator re-drove the record (Redrive).
	RedrivenAt *time.Time
	// RedrivenAs is the derived message ID under which RedriveAsNew
	// re-drove this dead letter as a new message; "" when it did not.
	RedrivenAs string
}

// DeadLetters lists the dead letters of scope, oldest first, at most limit
// rows (1 to 10000; 0 means 100), starting after id afterID (0 for the start),
// each with RedrivenAs when RedriveAsNew re-drove it.
func (s *Store) DeadLetters(ctx context.Context, scope string, afterID int64, limit int) ([]DeadLetter, error) {
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
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
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
where scope = $1 and message_id = $2 and status = 'FAILED_FINAL'`, scope, NormalizeKey(messageID))
		if err != nil {
			return fmt.Errorf("idemq: redrive: %w", err)
		}
		if tag.RowsAffected() == 0 {
			var status string
			err := tx.QueryRow(ctx, `select status from `+s.q.records+` where scope = $1 and message_id = $2`, scope, NormalizeKey(messageID)).Scan(&status)
			if errors.Is(err, pgx.ErrNoRows) {
				return ErrNotFound
			}
			if err != nil {
				return fmt.Errorf("idemq: redrive: %w", err)
			}
			return fmt.Errorf("%w: %s/%s is %s", ErrNotFinal, scope, messageID, status)
		}
		_, err = tx.Exec(ctx, `update `+s.q.deadLetters+` set redriven_at = now()
where scope = $1 and message_id = $2 and redriven_at is null`, scope, NormalizeKey(messageID))
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
