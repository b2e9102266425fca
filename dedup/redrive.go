package dedup

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// Re-driving a dead letter as a new message.
//
// Redrive makes a FAILED_FINAL record retryable in place: the next copy of
// the same message ID runs the handler. A conflict's dead letter has no such
// record: the record its message ID or business key matched belongs to
// another message, and usually SUCCEEDED. RedriveAsNew is the operator's
// action for it: the dead-lettered message is published again under a
// derived message ID, "<message ID>#redrive-<dead-letter ID>" (RedriveAsNewID),
// so the consumer processes it as a message of its own. Both records are
// kept (the one it collided with, and the new one of the derived ID), and an
// audit row says who re-drove which dead letter, when, and under which ID.
//
// The store cannot run the user's handler, so "process" means "make the
// message come back to the consumer": RedriveAsNew writes the audit row,
// then calls RedriveAsNewOptions.Publish, which sends the message to the
// broker (the CLI, `idemq redrive -as-new`, publishes with outbox/kafkapub or
// outbox/rocketmqpub), then stamps the audit row published. Every step is
// idempotent because the derived ID is a function of the dead letter: a
// second call for the same dead letter finds the published audit row and
// does nothing new; a call that failed or crashed after the audit row (the
// broker down, the process killed between publish and stamp) publishes again
// when repeated, and the consumer's dedup drops any second copy of the
// derived ID. The dead letter itself stays live (redriven_at is not set), so
// a redelivered copy of the same conflicting message still finds it and
// writes no new dead letter that could be re-driven a second time.

// RedriveAsNewOptions configure Store.RedriveAsNew (and the Redis-only
// store's RedriveAsNew).
type RedriveAsNewOptions struct {
	// Publish sends the message back to the broker under its derived
	// message ID and returns nil only once the broker acknowledged it.
	// Required. It is called after the audit row is durable, at most once
	// per RedriveAsNew call, and not at all when an earlier call already
	// published this dead letter.
	Publish func(ctx context.Context, m RedriveMessage) error
	// Force also re-drives a payload conflict (ReasonPayloadConflict, or
	// ReasonFingerprintConflict from v0.1.0): one intent sent with two
	// payloads, where the record usually stands for the right one. Default
	// false: such dead letters are refused with ErrPayloadConflict. Even
	// forced, a payload conflict whose business key has a record is refused:
	// the re-driven copy would match it by business key and conflict again.
	Force bool
	// Operator names who asked, for the audit row (e.g. a login); at most
	// 255 bytes of UTF-8 without NUL. Default "" (unknown).
	Operator string
}

// RedriveMessage is a dead letter as RedriveAsNew hands it to
// RedriveAsNewOptions.Publish.
type RedriveMessage struct {
	// MessageID is the derived message ID (RedriveAsNewID). Put it in the
	// message-ID header or property the consumer reads
	// (kafkaadapter.Config.MessageIDHeader,
	// rocketmqadapter.Config.MessageIDProperty; wire.MessageIDHeader by
	// default).
	MessageID string
	// Topic, Key, Headers and Payload are the dead-lettered message as it
	// was delivered. Headers still hold its old message-ID header, if any,
	// and for RocketMQ its system properties: the publisher replaces or
	// drops them (see rocketmqadapter.UserProperties).
	Topic   string
	Key     []byte
	Headers map[string]string
	Payload []byte
	// DeadLetterID is the ID of the dead letter re-driven.
	DeadLetterID int64
}

// RedriveAsNewResult reports what RedriveAsNew did.
type RedriveAsNewResult struct {
	// MessageID is the derived message ID the message is published under.
	MessageID string
	// DeadLetter is the dead letter re-driven.
	DeadLetter DeadLetter
	// Created is true when this call wrote the audit row, false when an
	// earlier call had (this call then only finished its publish, if that
	// had not happened).
	Created bool
	// Published is true when this call published the message; false when an
	// earlier call had already published it, so nothing new was done.
	Published bool
	// RequestedAt is when the audit row was written; PublishedAt when the
	// publish was acknowledged (store time: Postgres now(), Redis TIME).
	RequestedAt, PublishedAt time.Time
}

// ErrNotAConflict is returned by RedriveAsNew for a dead letter whose reason
// is not a conflict (attempts_exhausted, permanent_error, bad_input): its
// message has a FAILED_FINAL record of its own, which Redrive re-drives in
// place.
var ErrNotAConflict = errors.New("idemq: dead letter is not a conflict (re-drive its record in place with Redrive)")

// RedriveAsNewID is the derived message ID under which RedriveAsNew
// republishes dead letter deadLetterID of message messageID (its stored
// form): "<messageID>#redrive-<deadLetterID>". It is stored in its
// normalized form (NormalizeKey) like any message ID, so a long one becomes
// "sha256:<hex>", the same for every copy.
func RedriveAsNewID(messageID string, deadLetterID int64) string {
	return messageID + "#redrive-" + strconv.FormatInt(deadLetterID, 10)
}

// RedrivableAsNew reports whether a dead letter of reason may be re-driven as
// new: nil for ReasonMessageIDCollision; for ReasonPayloadConflict and
// ReasonFingerprintConflict, nil when force, else an error wrapping
// ErrPayloadConflict; for any other reason an error wrapping ErrNotAConflict.
// Both stores' RedriveAsNew apply it.
func RedrivableAsNew(reason string, force bool) error {
	switch reason {
	case ReasonMessageIDCollision:
		return nil
	case ReasonPayloadConflict, ReasonFingerprintConflict:
		if force {
			return nil
		}
		return fmt.Errorf("%w: dead letter reason %s: the record of this business key or message ID stands for the same intent with another payload; re-drive it as new only if both payloads must be applied (force)", ErrPayloadConflict, reason)
	}
	return fmt.Errorf("%w: reason %s", ErrNotAConflict, reason)
}

// RedriveAsNew re-drives dead letter deadLetterID of scope as a new message:
// it writes an audit row (table <DeadLettersTable>_redrives, one row per dead
// letter), then publishes the message through opt.Publish under the derived
// message ID RedriveAsNewID(message ID, deadLetterID), then stamps the audit
// row published. The consumer then processes it as a message of its own; the
// record the dead letter collided with is left as it is. See the comment at
// the top of this file for why each step is safe to repeat.
//
// Only conflicts can be re-driven as new (RedrivableAsNew): message-ID
// collisions always, payload conflicts only with opt.Force. Errors:
// ErrNotFound (no dead letter deadLetterID in scope), ErrPayloadConflict
// (refused; the error says why), ErrNotAConflict, ErrInvalidConfig (no
// Publish, bad Operator), or the publish's error, wrapped (the audit row is
// kept unpublished: call again to publish).
func (s *Store) RedriveAsNew(ctx context.Context, scope string, deadLetterID int64, opt RedriveAsNewOptions) (RedriveAsNewResult, error) {
	if err := opt.Validate(); err != nil {
		return RedriveAsNewResult{}, err
	}
	var res RedriveAsNewResult
	var auditID int64
	var publishedAt *time.Time
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// FOR UPDATE serializes two operators re-driving the same dead letter.
		d, err := s.deadLetter(ctx, tx, scope, deadLetterID)
		if err != nil {
			return err
		}
		res.DeadLetter = d
		if err := RedrivableAsNew(d.Reason, opt.Force); err != nil {
			return err
		}
		if d.Reason != ReasonMessageIDCollision && d.BusinessKey != "" {
			var holder string
			err := tx.QueryRow(ctx, `select message_id from `+s.q.records+` where scope = $1 and business_key = $2 and business_key <> ''`, scope, d.BusinessKey).Scan(&holder)
			if err == nil {
				return fmt.Errorf("%w: business key %q has record %s/%s: a re-driven copy would match it and conflict again", ErrPayloadConflict, d.BusinessKey, scope, holder)
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("idemq: redrive as new: %w", err)
			}
		}
		res.MessageID = RedriveAsNewID(d.MessageID, d.ID)
		err = tx.QueryRow(ctx, `insert into `+s.redrivesTable()+`
  (dead_letter_id, scope, message_id, new_message_id, business_key, reason, forced, operator)
values ($1, $2, $3, $4, $5, $6, $7, $8)
on conflict (dead_letter_id) do nothing
returning id, created_at`, d.ID, scope, d.MessageID, res.MessageID, d.BusinessKey, d.Reason, opt.Force, opt.Operator).
			Scan(&auditID, &res.RequestedAt)
		if err == nil {
			res.Created = true
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("idemq: redrive as new: audit: %w", err)
		}
		err = tx.QueryRow(ctx, `select id, new_message_id, created_at, published_at from `+s.redrivesTable()+` where dead_letter_id = $1`, d.ID).
			Scan(&auditID, &res.MessageID, &res.RequestedAt, &publishedAt)
		if err != nil {
			return fmt.Errorf("idemq: redrive as new: audit: %w", err)
		}
		return nil
	})
	if err != nil {
		return RedriveAsNewResult{}, err
	}
	if publishedAt != nil {
		res.PublishedAt = *publishedAt
		return res, nil // published by an earlier call: nothing new
	}
	d := res.DeadLetter
	if err := opt.Publish(ctx, RedriveMessage{MessageID: res.MessageID, Topic: d.Topic, Key: d.Key, Headers: d.Headers,
		Payload: d.Payload, DeadLetterID: d.ID}); err != nil {
		return res, fmt.Errorf("idemq: redrive as new: publish %s (audit row kept; call again to publish): %w", res.MessageID, err)
	}
	res.Published = true
	err = s.pool.QueryRow(context.WithoutCancel(ctx), `update `+s.redrivesTable()+` set published_at = coalesce(published_at, now())
where id = $1 returning published_at`, auditID).Scan(&res.PublishedAt)
	if err != nil {
		return res, fmt.Errorf("idemq: redrive as new: %s published, but stamping its audit row failed (a repeated call publishes a copy, which dedup drops): %w", res.MessageID, err)
	}
	return res, nil
}

// Validate returns an error wrapping ErrInvalidConfig, naming the field,
// when Publish is nil or Operator is longer than MaxKeyBytes bytes, not
// valid UTF-8 or holds NUL. Both stores' RedriveAsNew call it first.
func (o RedriveAsNewOptions) Validate() error {
	switch {
	case o.Publish == nil:
		return fmt.Errorf("%w: RedriveAsNewOptions.Publish is required (the store cannot run the handler: the message must go back to the broker)", ErrInvalidConfig)
	case len(o.Operator) > MaxKeyBytes || !utf8.ValidString(o.Operator) || strings.IndexByte(o.Operator, 0) >= 0:
		return fmt.Errorf("%w: RedriveAsNewOptions.Operator must be at most %d bytes of UTF-8 without NUL", ErrInvalidConfig, MaxKeyBytes)
	}
	return nil
}

// redrivesTable is the quoted audit table of RedriveAsNew.
func (s *Store) redrivesTable() string {
	return pgx.Identifier{s.cfg.Schema, s.cfg.DeadLettersTable + "_redrives"}.Sanitize()
}

// deadLetter reads and locks one dead letter of scope, or ErrNotFound.
func (s *Store) deadLetter(ctx context.Context, tx pgx.Tx, scope string, id int64) (DeadLetter, error) {
	var d DeadLetter
	err := tx.QueryRow(ctx, `select id, scope, message_id, business_key, reason, error, error_class, attempts,
  topic, message_key, payload, headers, source, created_at, redriven_at
from `+s.q.deadLetters+` where id = $1 and scope = $2 for update`, id, scope).
		Scan(&d.ID, &d.Scope, &d.MessageID, &d.BusinessKey, &d.Reason, &d.Error, &d.ErrorClass, &d.Attempts,
			&d.Topic, &d.Key, &d.Payload, &d.Headers, &d.Source, &d.CreatedAt, &d.RedrivenAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return DeadLetter{}, fmt.Errorf("%w: no dead letter %d in scope %q", ErrNotFound, id, scope)
	}
	if err != nil {
		return DeadLetter{}, fmt.Errorf("idemq: dead letter %d: %w", id, err)
	}
	return d, nil
}
