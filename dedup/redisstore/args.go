package redisstore

import (
	"encoding/hex"
	"encoding/json"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq/dedup"
)

// The scripts take positional ARGV lists (scripts.go documents each). The
// structs below name every argument, and their argv methods lay them out in
// the order the script reads them: the only place that order is written in
// Go.

// deadLetterFields are the message fields a dead letter keeps: ARGV topic,
// key, payload, headers JSON, in that order, in every script that writes one.
type deadLetterFields struct{ msg *dedup.Message }

func (d deadLetterFields) argv() []any {
	hdr, _ := json.Marshal(d.msg.Headers)
	if d.msg.Headers == nil {
		hdr = []byte("{}")
	}
	return []any{d.msg.Topic, d.msg.Key, d.msg.Payload, hdr}
}

// claimArgs are claimScript's ARGV.
type claimArgs struct {
	msg *dedup.Message // the delivery: identity, source, reconsume times, dead-letter fields
	// viaBK: the record (recordMID's) is the one the delivery's business
	// key pointed to.
	viaBK     bool
	recordMID string
	token     uuid.UUID
	leaseTTL  time.Duration
	// openTTL is the TTL of a record that is not final, finalTTL of a final
	// one, dlRetention of the dead-letter stream's entries.
	openTTL, finalTTL, dlRetention time.Duration
	maxAttempts                    int
	sums                           []keyedSum // the payload's fingerprints, current key first
}

func (a claimArgs) argv() []any {
	id := a.msg.Identity
	args := append([]any{id.MessageID, id.BusinessKey, flag(a.viaBK), a.recordMID, a.token.String(),
		ms(a.leaseTTL), ms(a.openTTL), a.msg.Source, a.msg.ReconsumeTimes, a.maxAttempts,
		ms(a.finalTTL), ms(a.dlRetention)}, deadLetterFields{a.msg}.argv()...)
	args = append(args, id.Scope, len(a.sums))
	for _, ks := range a.sums {
		args = append(args, ks.KeyID+":"+hex.EncodeToString(ks.Sum))
	}
	return args
}

// finishStatus is what finishScript writes: a record status, or
// finishRelease (give the lease back without counting the attempt).
type finishStatus string

const finishRelease finishStatus = "RELEASE"

// finishArgs are finishScript's ARGV.
type finishArgs struct {
	token     uuid.UUID
	fence     int64
	status    finishStatus
	recordTTL time.Duration
	// errText and errClass are the handler's error ("" for none).
	errText, errClass string
	// reason is the dead-letter reason; "" writes no dead letter.
	reason      string
	dlRetention time.Duration
	msg         *dedup.Message // the delivery: dead-letter fields, source, identity
}

func (a finishArgs) argv() []any {
	id := a.msg.Identity
	args := append([]any{a.token.String(), a.fence, string(a.status), ms(a.recordTTL), a.errText, a.errClass, a.reason,
		ms(a.dlRetention)}, deadLetterFields{a.msg}.argv()...)
	return append(args, a.msg.Source, id.Scope, id.MessageID, id.BusinessKey)
}

// rejectArgs are rejectScript's ARGV.
type rejectArgs struct {
	msg       *dedup.Message // the delivery: identity, dead-letter fields, source, reconsume times
	viaBK     bool           // as in claimArgs
	recordMID string
	// recordTTL is the TTL of the record made FAILED_FINAL; dlRetention of
	// the dead-letter stream's entries.
	recordTTL, dlRetention time.Duration
	errText, errClass      string
	reason                 string
	token                  string
	fingerprint            string // "<key ID>:<hex>", "" when none can be made
}

func (a rejectArgs) argv() []any {
	id := a.msg.Identity
	args := append([]any{id.MessageID, id.BusinessKey, flag(a.viaBK), a.recordMID, ms(a.recordTTL),
		a.errText, a.errClass, a.reason, ms(a.dlRetention)}, deadLetterFields{a.msg}.argv()...)
	return append(args, a.msg.Source, id.Scope, a.msg.ReconsumeTimes, a.token, a.fingerprint)
}
