package dedup

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
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
// broker (the CLI, `idemq redrive --as-new`, publishes with outbox/kafkapub or
// outbox/rocketmqpub), then stamps the audit row published. Every step is
// idempotent because the derived ID is a function of the dead letter: a
// second call for the same dead letter finds the published audit row and
// does nothing new; a call that failed or crashed after the audit row (the
// broker down, the process killed between publish and stamp) publishes again
// when repeated, and the consumer's dedup drops any second copy of the
// derived ID. The dead letter itself stays live (redriven_at is not set), so
// a redelivered copy of the same conflicting message still finds it and
// writes no new dead letter that could be re-driven a second time.

// RedriveAsNewOptions configure pgstore.Store.RedriveAsNew (and the Redis-only
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
