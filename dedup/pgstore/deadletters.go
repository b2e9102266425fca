package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// Dead-letter tooling: one dead letter by ID, filtered keyset pages, counts,
// bulk re-drives and republishing through the outbox. The filter's
// statements are built here (deadLetterWhere) with only the conditions a
// filter sets, its values always parameters; the fixed ones are in
// sql/deadletters.sql. A scope's pages walk the (scope, id) index of
// migration 007, the others the primary key; docs/operations.md ("Dead
// letters") gives the costs.

// deadLetterColumns are the columns scanned by scanDeadLetter, over the
// dead-letter table d left-joined to the re-drive-as-new audit r.
const deadLetterColumns = `d.id, d.scope, d.message_id, d.business_key, d.reason, d.error, d.error_class,
  d.attempts, d.topic, d.message_key, d.payload, d.headers, d.source, d.created_at, d.redriven_at,
  coalesce(r.new_message_id, '')`

func scanDeadLetter(row pgx.Row) (dedup.DeadLetter, error) {
	var d dedup.DeadLetter
	err := row.Scan(&d.ID, &d.Scope, &d.MessageID, &d.BusinessKey, &d.Reason, &d.Error, &d.ErrorClass, &d.Attempts,
		&d.Topic, &d.Key, &d.Payload, &d.Headers, &d.Source, &d.CreatedAt, &d.RedrivenAt, &d.RedrivenAs)
	return d, err
}

// deadLetterWhere is the WHERE condition of f over the table alias d (AfterID
// and Limit excluded), appending its values to args as $n parameters.
func deadLetterWhere(f dedup.DeadLetterFilter, args *[]any) string {
	conds := []string{"true"}
	add := func(cond string, v any) {
		*args = append(*args, v)
		conds = append(conds, strings.ReplaceAll(cond, "$?", "$"+strconv.Itoa(len(*args))))
	}
	if f.Scope != "" {
		add("d.scope = $?", f.Scope)
	}
	if f.ScopePrefix != "" {
		add("starts_with(d.scope, $?)", f.ScopePrefix)
	}
	if f.Reason != "" {
		add("d.reason = $?", f.Reason)
	}
	if !f.Since.IsZero() {
		add("d.created_at >= $?", f.Since)
	}
	if !f.Until.IsZero() {
		add("d.created_at < $?", f.Until)
	}
	if f.Redriven != nil {
		if *f.Redriven {
			conds = append(conds, "d.redriven_at is not null")
		} else {
			conds = append(conds, "d.redriven_at is null")
		}
	}
	return strings.Join(conds, " and ")
}

func (s *Store) table(name string) string { v, _ := s.q.tables[name].(string); return v }

// DeadLetter returns dead letter id (any scope), with RedrivenAs when
// RedriveAsNew re-drove it, or an error wrapping dedup.ErrNotFound when
// there is none (never written, or purged).
func (s *Store) DeadLetter(ctx context.Context, id int64) (dedup.DeadLetter, error) {
	d, err := scanDeadLetter(s.pool.QueryRow(ctx, `select `+deadLetterColumns+`
from `+s.table("dead_letters")+` d left join `+s.table("redrives")+` r on r.dead_letter_id = d.id
where d.id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return dedup.DeadLetter{}, fmt.Errorf("%w: no dead letter %d", dedup.ErrNotFound, id)
	}
	if err != nil {
		return dedup.DeadLetter{}, fmt.Errorf("idemq: dead letter %d: %w", id, err)
	}
	return d, nil
}

// ScanDeadLetters returns up to f.Limit (default 100, at most 10000) dead
// letters with ID > f.AfterID matching f, in ID order, each whole (payload,
// key, headers) and with RedrivenAs when RedriveAsNew re-drove it. It is a
// keyset page: pass the last ID back as f.AfterID for the next one; an
// empty page is the end. Each page is one statement with only f's
// conditions: with f.Scope it walks the (scope, id) index from AfterID,
// otherwise the primary key (a filter that matches few of the rows after
// AfterID reads those rows to find them; ScopePrefix always walks the
// primary key). Errors: an invalid f (wrapping dedup.ErrInvalidConfig,
// naming the field), or the database's.
func (s *Store) ScanDeadLetters(ctx context.Context, f dedup.DeadLetterFilter) ([]dedup.DeadLetter, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	args := []any{f.AfterID, f.PageSize()}
	where := deadLetterWhere(f, &args)
	rows, err := s.pool.Query(ctx, `select `+deadLetterColumns+`
from `+s.table("dead_letters")+` d left join `+s.table("redrives")+` r on r.dead_letter_id = d.id
where d.id > $1 and `+where+` order by d.id limit $2`, args...)
	if err != nil {
		return nil, fmt.Errorf("idemq: scan dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (dedup.DeadLetter, error) { return scanDeadLetter(row) })
	if err != nil {
		return nil, fmt.Errorf("idemq: scan dead letters: %w", err)
	}
	return out, nil
}

// CountDeadLetters counts the dead letters matching f (f.AfterID and
// f.Limit ignored), in one statement (an index-only count over the (scope,
// id) index with f.Scope alone). Errors as ScanDeadLetters.
func (s *Store) CountDeadLetters(ctx context.Context, f dedup.DeadLetterFilter) (int64, error) {
	f.AfterID, f.Limit = 0, 0
	if err := f.Validate(); err != nil {
		return 0, err
	}
	var args []any
	where := deadLetterWhere(f, &args)
	var n int64
	if err := s.pool.QueryRow(ctx, `select count(*) from `+s.table("dead_letters")+` d where `+where, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("idemq: count dead letters: %w", err)
	}
	return n, nil
}

// RedriveDeadLetters re-drives, as Redrive does one by one, the records of
// every dead letter matching f (f.AfterID and f.Limit ignored) that have a
// record of their own (dedup.RedrivableInPlace: not the conflicts, which
// RedriveAsNew handles) and are not re-driven yet: each record still
// FAILED_FINAL becomes FAILED_RETRYABLE and all its live dead letters are
// stamped redriven_at, so the next delivery of the message runs the
// handler. It walks the dead letters in ID order up to the highest ID when
// it started (dead letters written meanwhile are left to the next run), at
// most o.Batch (default 500) per step, each step one page read and one
// transaction, and calls o.Progress after each step.
//
// It is idempotent: a second run finds the dead letters stamped and
// re-drives nothing (Redriven 0), unless a record failed again since and has
// a new dead letter. Two runs at once (two operators, two CLI processes)
// never both release one record: each step locks the records FOR UPDATE
// SKIP LOCKED, so a record the other run holds is skipped here and
// released there, and neither waits on the other; a record a consumer holds
// at that moment is skipped too (run again). With o.DryRun nothing
// changes: Redriven is 0 and Skipped counts what would be skipped.
//
// A Kafka message whose offset was committed is not redelivered by the
// broker on its own: republish it (RepublishDeadLetter) or reset the
// group's offset.
//
// It returns the summary so far also with an error (ctx ending between
// steps, a statement failing: the steps before it are committed), and an
// error wrapping dedup.ErrInvalidConfig for an invalid f or o.
func (s *Store) RedriveDeadLetters(ctx context.Context, f dedup.DeadLetterFilter, o dedup.RedriveOptions) (dedup.RedriveSummary, error) {
	var sum dedup.RedriveSummary
	f.AfterID, f.Limit = 0, 0
	if err := f.Validate(); err != nil {
		return sum, err
	}
	if err := o.Validate(); err != nil {
		return sum, err
	}
	var matched int64
	if o.Progress != nil {
		n, err := s.CountDeadLetters(ctx, f)
		if err != nil {
			return sum, err
		}
		matched = n
	}
	var bound int64
	if err := s.pool.QueryRow(ctx, s.q.deadLettersBoundSQL).Scan(&bound); err != nil {
		return sum, fmt.Errorf("idemq: redrive dead letters: %w", err)
	}
	args := []any{int64(0), bound, o.BatchSize()}
	where := deadLetterWhere(f, &args)
	page := `select d.id, d.reason, d.redriven_at is not null from ` + s.table("dead_letters") + ` d
where d.id > $1 and d.id <= $2 and ` + where + ` order by d.id limit $3`
	for {
		if err := ctx.Err(); err != nil {
			return sum, fmt.Errorf("idemq: redrive dead letters: %w", err)
		}
		rows, err := s.pool.Query(ctx, page, args...)
		if err != nil {
			return sum, fmt.Errorf("idemq: redrive dead letters: %w", err)
		}
		var ids []int64
		var last, n int64
		for rows.Next() {
			var id int64
			var reason string
			var redriven bool
			if err := rows.Scan(&id, &reason, &redriven); err != nil {
				rows.Close()
				return sum, fmt.Errorf("idemq: redrive dead letters: %w", err)
			}
			last, n = id, n+1
			if dedup.RedrivableInPlace(reason) && !redriven {
				ids = append(ids, id)
			}
		}
		if err := rows.Err(); err != nil {
			return sum, fmt.Errorf("idemq: redrive dead letters: %w", err)
		}
		if n == 0 {
			return sum, nil
		}
		sum.Matched += n
		sum.Skipped += n - int64(len(ids))
		if len(ids) > 0 {
			var released int64
			if o.DryRun {
				err = s.pool.QueryRow(ctx, s.q.deadLettersRedriveDrySQL, ids).Scan(&released)
			} else {
				var stamped int64
				err = s.pool.QueryRow(ctx, s.q.deadLettersRedriveStepSQL, ids).Scan(&released, &stamped)
				sum.Redriven += released
			}
			if err != nil {
				return sum, fmt.Errorf("idemq: redrive dead letters: step after id %d: %w", args[0], err)
			}
			sum.Skipped += int64(len(ids)) - released
		}
		if o.Progress != nil {
			o.Progress(sum.Matched, matched)
		}
		args[0] = last
	}
}

// RepublishOptions tunes (*Store).RepublishDeadLetter.
type RepublishOptions struct {
	// Topic is the destination; "" = the dead letter's own Topic (the one
	// it was consumed from).
	Topic string
	// NewMessageID chooses the message ID the outbox row carries: false
	// (default) keeps the dead letter's message ID, so the consumer's dedup
	// treats the copy as the same message (re-drive its FAILED_FINAL record
	// first, or the copy is skipped as already failed); true uses the
	// derived ID dedup.RedriveAsNewID(message ID, dead letter ID), so it is
	// processed as a message of its own.
	NewMessageID bool
	// Outbox is the outbox whose table receives the row: an *outbox.Outbox
	// (it implements RepublishOutbox) in the Store's database, since the row
	// is written in the Store's transaction. Required.
	Outbox RepublishOutbox
	// Operator names who asked, for the audit row: at most 255 bytes of
	// UTF-8 without NUL. Default "" (unknown).
	Operator string
}

// RepublishOutbox is where RepublishDeadLetter writes its row:
// *outbox.Outbox implements it (Outbox.QualifiedTable, Outbox.AddRedrive).
// It is an interface so that the dedup packages import no outbox code.
type RepublishOutbox interface {
	// QualifiedTable is the outbox table's quoted, schema-qualified name: it
	// names the destination in the republish audit row.
	QualifiedTable() string
	// AddRedrive inserts m as an outbox row in tx under m.MessageID (the
	// outbox's own message-ID and causation headers dropped from
	// m.Headers) and returns the row's ID.
	AddRedrive(ctx context.Context, tx pgx.Tx, m dedup.RedriveMessage) (string, error)
}

// RepublishResult says what RepublishDeadLetter did.
type RepublishResult struct {
	// OutboxID is the outbox row's ID (its UUIDv7, outbox.Row.ID).
	OutboxID string
	// MessageID is the message ID the row carries (outbox.Row.MessageID).
	MessageID string
	// Already is true when an earlier call already republished this dead
	// letter to the same destination with the same message-ID choice: no
	// second row was written.
	Already bool
}

// RepublishDeadLetter writes dead letter id's payload, key and headers as an
// outbox row (o.Outbox.Add) in one transaction with an audit row (table
// <DeadLettersTable>_republishes), exactly once per (dead letter, outbox
// table and topic, message-ID choice): a second call, or one running at the
// same time, writes no row and returns the first call's row with Already
// true. The relay then publishes the row under the chosen message ID
// (outbox.Message.MessageID). The dead letter's message-ID and causation
// headers (the outbox's Config.MessageIDHeader and CausationHeader) are
// dropped: the relay sets them. The dead letter and its record are left as
// they are; republishing does not re-drive.
//
// A dead letter whose message ID was stored hashed ("sha256:…", an ID too
// long or invalid when it arrived) keeps that hashed form: the consumer
// hashes it again, so with NewMessageID false such a copy is a new message
// to the consumer.
//
// Errors: dedup.ErrNotFound (wrapped) when there is no dead letter id;
// dedup.ErrInvalidConfig (wrapped, naming the field) for no Outbox, a bad
// Operator or Topic, or no topic (o.Topic empty and the dead letter has none);
// outbox.ErrInvalidMessage (wrapped) when the outbox refuses the message
// (e.g. an invalid topic); or the database's.
func (s *Store) RepublishDeadLetter(ctx context.Context, id int64, o RepublishOptions) (RepublishResult, error) {
	var res RepublishResult
	if o.Outbox == nil {
		return res, fmt.Errorf("%w: RepublishOptions.Outbox is required (the outbox whose table receives the row)", dedup.ErrInvalidConfig)
	}
	if err := (dedup.RedriveOptions{Operator: o.Operator}).Validate(); err != nil {
		return res, fmt.Errorf("%w: RepublishOptions.Operator must be at most %d bytes of UTF-8 without NUL", dedup.ErrInvalidConfig, dedup.MaxKeyBytes)
	}
	if o.Topic != "" && (len(o.Topic) > dedup.MaxKeyBytes || !utf8.ValidString(o.Topic) || strings.IndexByte(o.Topic, 0) >= 0) {
		return res, fmt.Errorf("%w: RepublishOptions.Topic must be 1 to %d bytes of UTF-8 without NUL", dedup.ErrInvalidConfig, dedup.MaxKeyBytes)
	}
	outboxTable := o.Outbox.QualifiedTable()
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var d dedup.DeadLetter
		err := tx.QueryRow(ctx, s.q.deadLetterShareSQL, id).
			Scan(&d.ID, &d.Scope, &d.MessageID, &d.BusinessKey, &d.Reason, &d.Error, &d.ErrorClass, &d.Attempts,
				&d.Topic, &d.Key, &d.Payload, &d.Headers, &d.Source, &d.CreatedAt, &d.RedrivenAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: no dead letter %d", dedup.ErrNotFound, id)
		}
		if err != nil {
			return fmt.Errorf("idemq: republish dead letter %d: %w", id, err)
		}
		topic := o.Topic
		if topic == "" {
			topic = d.Topic
		}
		if topic == "" {
			return fmt.Errorf("%w: RepublishOptions.Topic is empty and dead letter %d has no topic", dedup.ErrInvalidConfig, id)
		}
		res.MessageID = d.MessageID
		if o.NewMessageID {
			res.MessageID = dedup.RedriveAsNewID(d.MessageID, d.ID)
		}
		var auditID int64
		err = tx.QueryRow(ctx, s.q.republishInsertSQL, d.ID, outboxTable, topic, o.NewMessageID, res.MessageID, o.Operator).Scan(&auditID)
		if errors.Is(err, pgx.ErrNoRows) {
			res.Already = true
			err = tx.QueryRow(ctx, s.q.republishGetSQL, d.ID, outboxTable, topic, o.NewMessageID).Scan(&res.MessageID, &res.OutboxID)
			if err != nil {
				return fmt.Errorf("idemq: republish dead letter %d: audit: %w", id, err)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("idemq: republish dead letter %d: audit: %w", id, err)
		}
		rowID, err := o.Outbox.AddRedrive(ctx, tx, dedup.RedriveMessage{MessageID: res.MessageID, Topic: topic, Key: d.Key,
			Headers: d.Headers, Payload: d.Payload, DeadLetterID: d.ID})
		if err != nil {
			return fmt.Errorf("idemq: republish dead letter %d: %w", id, err)
		}
		res.OutboxID = rowID
		if _, err := tx.Exec(ctx, s.q.republishSetOutboxSQL, auditID, res.OutboxID); err != nil {
			return fmt.Errorf("idemq: republish dead letter %d: audit: %w", id, err)
		}
		return nil
	})
	if err != nil {
		return RepublishResult{}, err
	}
	return res, nil
}
