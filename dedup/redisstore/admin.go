package redisstore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq/dedup"
	"github.com/redis/go-redis/v9"
)

// Lookup returns the record of (scope, message ID) (the key is normalized
// with dedup.NormalizeKey first), or dedup.ErrNotFound. ExpiresAt is when
// Redis will drop the record (its key's TTL).
func (s *Store) Lookup(ctx context.Context, scope, messageID string) (dedup.Record, error) {
	return s.lookup(ctx, scope, dedup.NormalizeKey(messageID))
}

// LookupBusinessKey returns the record holding business key businessKey
// (normalized with dedup.NormalizeKey) in scope, or dedup.ErrNotFound.
func (s *Store) LookupBusinessKey(ctx context.Context, scope, businessKey string) (dedup.Record, error) {
	mid, err := s.c.Get(ctx, s.keysOf(scope).businessKey(dedup.NormalizeKey(businessKey))).Result()
	if errors.Is(err, redis.Nil) {
		return dedup.Record{}, dedup.ErrNotFound
	}
	if err != nil {
		return dedup.Record{}, fmt.Errorf("idemq/redisstore: lookup: %w", err)
	}
	return s.lookup(ctx, scope, mid)
}

func (s *Store) lookup(ctx context.Context, scope, messageID string) (dedup.Record, error) {
	key := s.keysOf(scope).record(messageID)
	pipe := s.c.Pipeline()
	all := pipe.HGetAll(ctx, key)
	ttl := pipe.PTTL(ctx, key)
	if _, err := pipe.Exec(ctx); err != nil {
		return dedup.Record{}, fmt.Errorf("idemq/redisstore: lookup: %w", err)
	}
	h := all.Val()
	if len(h) == 0 {
		return dedup.Record{}, dedup.ErrNotFound
	}
	atoi := func(f string) int64 { n, _ := strconv.ParseInt(h[f], 10, 64); return n }
	// reconsume_times is written from an int32; parsing it as 32 bits keeps
	// the conversion in range.
	atoi32 := func(f string) int32 { n, _ := strconv.ParseInt(h[f], 10, 32); return int32(n) }
	r := dedup.Record{
		Scope: h["scope"], MessageID: h["message_id"], BusinessKey: h["business_key"],
		Status: dedup.Status(h["status"]), Attempts: int(atoi("attempts")), Fence: atoi("fence"),
		LastError: h["last_error"], LastErrorClass: h["last_error_class"], Source: h["source"],
		ReconsumeTimes: atoi32("reconsume_times"),
		CreatedAt:      time.UnixMilli(atoi("created_ms")), UpdatedAt: time.UnixMilli(atoi("updated_ms")),
	}
	if i := strings.LastIndexByte(h["fingerprint"], ':'); i >= 0 { // "<key ID>:<hex>"; a key ID may hold ':'
		r.FingerprintKeyID = h["fingerprint"][:i]
		r.Fingerprint, _ = hex.DecodeString(h["fingerprint"][i+1:])
	}
	if d := ttl.Val(); d > 0 && (r.Status == dedup.StatusSucceeded || r.Status == dedup.StatusFailedFinal) {
		at := time.Now().Add(d)
		r.ExpiresAt = &at
	}
	return r, nil
}

// Redrive is the operator's re-drive of a FAILED_FINAL record of (scope,
// message ID), as pgstore.Store.Redrive: the record becomes FAILED_RETRYABLE
// (attempts kept, so each re-drive allows one more execution) and the next
// delivery of the message runs the handler. Dead letters in the stream are
// kept as they are (a stream entry is not updated); the record notes
// redriven_ms, and redriven_by, a token fresh per call, by which a second
// run of the script (go-redis resends it when the reply was lost) answers as
// the first did. It returns dedup.ErrNotFound when no record matches and an
// error wrapping dedup.ErrNotFinal when the record is not FAILED_FINAL.
func (s *Store) Redrive(ctx context.Context, scope, messageID string) error {
	mid := dedup.NormalizeKey(messageID)
	k := s.keysOf(scope)
	rec := k.record(mid)
	bki := rec
	if r, err := s.lookup(ctx, scope, mid); err == nil && r.BusinessKey != "" {
		bki = k.businessKey(r.BusinessKey)
	}
	// The token lets a second run of the script (a retry by the client after
	// a lost reply) recognise this call and answer as the first run did.
	st, err := redriveScript.Run(ctx, s.c, []string{rec, bki}, ms(s.cfg.FailedRetention), uuid.NewString()).Text()
	if err != nil {
		return fmt.Errorf("idemq/redisstore: redrive: %w", err)
	}
	return redriveReply(scope, messageID, st)
}

// redriveReply reads redriveScript's reply: the record's status before the
// re-drive, "" when there is none.
func redriveReply(scope, messageID, st string) error {
	switch st {
	case "":
		return dedup.ErrNotFound
	case string(dedup.StatusFailedFinal):
		return nil
	}
	return fmt.Errorf("%w: %s/%s is %s", dedup.ErrNotFinal, scope, messageID, st)
}

// DeadLetters lists the dead letters of scope, oldest first, at most limit
// (1 to 10000; 0 means 100), starting after ID afterID (0 for the start). A
// dead letter's ID is its stream entry ID "<ms>-<seq>" as ms·1,000,000+seq.
// Dead letters are trimmed once older than Config.FailedRetention.
// RedrivenAs is set for dead letters re-driven with RedriveAsNew, RedrivenAt
// for those whose record was re-driven (Redrive, RedriveDeadLetters) after
// they were written.
func (s *Store) DeadLetters(ctx context.Context, scope string, afterID int64, limit int) ([]dedup.DeadLetter, error) {
	if limit <= 0 {
		limit = 100
	}
	if limit > 10000 {
		return nil, fmt.Errorf("idemq/redisstore: dead letters: limit %d above 10000", limit)
	}
	page, err := s.streamPage(ctx, s.keysOf(scope).deadLetters(), dedup.DeadLetterFilter{}, afterID, 0, limit)
	return letters(page), err
}
