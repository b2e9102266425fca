package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq/dedup"
	"github.com/redis/go-redis/v9"
)

// redrive is the audit hash of RedriveAsNew for dead letter id: fields
// new_message_id, message_id, business_key, reason, forced, operator,
// request (the token of the call that created it), created_ms and, once
// published, published_ms. It expires with the dead letters
// (FailedRetention).
func (k keys) redrive(deadLetterID int64) string {
	return k.base + ":redrive:" + strconv.FormatInt(deadLetterID, 10)
}

// redriveCreateScript creates the audit hash KEYS[1] unless it exists.
// ARGV: 1 TTL ms, 2 request token, then field/value pairs. It replies {1}
// when it created the hash, or when the hash holds this request's token (the
// reply of a first run was lost and go-redis ran the script again: the same
// answer), else {0, new_message_id, created_ms, published_ms or ""}.
var redriveCreateScript = redis.NewScript(prelude + `
if redis.call('EXISTS', KEYS[1]) == 1 then
  local r = redis.call('HMGET', KEYS[1], 'request', 'new_message_id', 'created_ms', 'published_ms')
  if r[1] == ARGV[2] then return {1} end
  return {0, r[2], r[3], r[4] or ''}
end
redis.call('HSET', KEYS[1], 'request', ARGV[2], 'created_ms', now, unpack(ARGV, 3))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return {1}
`)

// redrivePublishedScript stamps the audit hash KEYS[1] published (once;
// a second run keeps the first time) and replies published_ms, or "" when
// the hash is gone.
var redrivePublishedScript = redis.NewScript(prelude + `
if redis.call('EXISTS', KEYS[1]) == 0 then return '' end
local p = redis.call('HGET', KEYS[1], 'published_ms')
if p then return p end
redis.call('HSET', KEYS[1], 'published_ms', now)
return tostring(now)
`)

// RedriveAsNew re-drives dead letter deadLetterID of scope as a new message,
// as pgstore.Store.RedriveAsNew does on Postgres: an audit hash
// "…:redrive:<dead-letter ID>" (created once per dead letter, expiring with
// the dead letters after FailedRetention), then opt.Publish under the
// derived message ID dedup.RedriveAsNewID(message ID, deadLetterID), then the
// audit hash is stamped published. A second call for the same dead letter
// finds the published audit hash and does nothing new; a call whose publish
// failed publishes when repeated. Only conflicts are re-driven
// (dedup.RedrivableAsNew): message-ID collisions always, payload conflicts
// with opt.Force, and not when their business key has a record. Errors as
// pgstore.Store.RedriveAsNew: dedup.ErrNotFound (no such dead letter, or it
// was trimmed), dedup.ErrPayloadConflict, dedup.ErrNotAConflict,
// dedup.ErrInvalidConfig, or the publish's error, wrapped.
func (s *Store) RedriveAsNew(ctx context.Context, scope string, deadLetterID int64, opt dedup.RedriveAsNewOptions) (dedup.RedriveAsNewResult, error) {
	if err := opt.Validate(); err != nil {
		return dedup.RedriveAsNewResult{}, err
	}
	k := s.keysOf(scope)
	var res dedup.RedriveAsNewResult
	dls, err := s.DeadLetters(ctx, scope, deadLetterID-1, 1)
	if err != nil {
		return res, err
	}
	if len(dls) == 0 || dls[0].ID != deadLetterID {
		return res, fmt.Errorf("%w: no dead letter %d in scope %q", dedup.ErrNotFound, deadLetterID, scope)
	}
	d := dls[0]
	res.DeadLetter = d
	if err := dedup.RedrivableAsNew(d.Reason, opt.Force); err != nil {
		return res, err
	}
	if d.Reason != dedup.ReasonMessageIDCollision && d.BusinessKey != "" {
		holder, err := s.c.Get(ctx, k.businessKey(d.BusinessKey)).Result()
		switch {
		case err == nil:
			return res, fmt.Errorf("%w: business key %q has record %s/%s: a re-driven copy would match it and conflict again", dedup.ErrPayloadConflict, d.BusinessKey, scope, holder)
		case !errors.Is(err, redis.Nil):
			return res, fmt.Errorf("idemq/redisstore: redrive as new: %w", err)
		}
	}
	res.MessageID = dedup.RedriveAsNewID(d.MessageID, d.ID)
	audit := k.redrive(d.ID)
	v, err := redriveCreateScript.Run(ctx, s.c, []string{audit}, ms(s.cfg.FailedRetention), uuid.NewString(),
		"new_message_id", res.MessageID, "message_id", d.MessageID, "business_key", d.BusinessKey, "reason", d.Reason,
		"forced", flag(opt.Force), "operator", opt.Operator).Slice()
	if err != nil {
		return res, fmt.Errorf("idemq/redisstore: redrive as new: audit: %w", err)
	}
	res.Created = num(v, 0) == 1
	if !res.Created {
		res.MessageID = str(v, 1)
		created, _ := strconv.ParseInt(str(v, 2), 10, 64)
		res.RequestedAt = time.UnixMilli(created)
		if p, err := strconv.ParseInt(str(v, 3), 10, 64); err == nil {
			res.PublishedAt = time.UnixMilli(p)
			return res, nil // published by an earlier call: nothing new
		}
	}
	if err := opt.Publish(ctx, dedup.RedriveMessage{MessageID: res.MessageID, Topic: d.Topic, Key: d.Key, Headers: d.Headers,
		Payload: d.Payload, DeadLetterID: d.ID}); err != nil {
		return res, fmt.Errorf("idemq/redisstore: redrive as new: publish %s (audit kept; call again to publish): %w", res.MessageID, err)
	}
	res.Published = true
	p, err := redrivePublishedScript.Run(context.WithoutCancel(ctx), s.c, []string{audit}).Text()
	if err != nil {
		return res, fmt.Errorf("idemq/redisstore: redrive as new: %s published, but stamping its audit failed (a repeated call publishes a copy, which dedup drops): %w", res.MessageID, err)
	}
	if pms, err := strconv.ParseInt(p, 10, 64); err == nil {
		res.PublishedAt = time.UnixMilli(pms)
	}
	if res.Created {
		if c, err := s.c.HGet(ctx, audit, "created_ms").Int64(); err == nil {
			res.RequestedAt = time.UnixMilli(c)
		}
	}
	return res, nil
}
