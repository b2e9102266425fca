package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq/dedup"
	leaseengine "github.com/idemq/idemq/internal/lease"
	"github.com/idemq/idemq/internal/pgtext"
	"github.com/redis/go-redis/v9"
)

// Config configures a Store. Fields marked required must be set; every
// other zero value means the default given in the field's comment.
type Config struct {
	// Client is the Redis client (a *redis.Client, *redis.FailoverClient,
	// *redis.ClusterClient or any redis.UniversalClient). Required.
	Client redis.UniversalClient
	// Prefix starts every key. Default "idemq".
	Prefix string
	// Fingerprinter fingerprints payloads (conflict detection). Required.
	Fingerprinter *dedup.Fingerprinter
	// MaxAttempts is how many handler executions a record gets; the last
	// failed one, or a takeover after it, makes it FAILED_FINAL with a dead
	// letter. Default 5; 1 to 1000.
	MaxAttempts int
	// SucceededRetention is how long a SUCCEEDED record is kept (its key's
	// TTL). Default 7 days; at least 1 minute.
	SucceededRetention time.Duration
	// FailedRetention is how long a record that is not SUCCEEDED, and a dead
	// letter, is kept. Default 30 days; at least SucceededRetention.
	FailedRetention time.Duration
	// MaxErrorBytes bounds the error text kept in records and dead letters.
	// Default 2048.
	MaxErrorBytes int
	// Logger receives heartbeat warnings. Default slog.Default().
	Logger *slog.Logger
}

// ErrInvalidConfig is wrapped by every Config error.
var ErrInvalidConfig = errors.New("idemq/redisstore: invalid config")

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = "idemq"
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 5
	}
	if c.SucceededRetention == 0 {
		c.SucceededRetention = 7 * 24 * time.Hour
	}
	if c.FailedRetention == 0 {
		c.FailedRetention = max(30*24*time.Hour, c.SucceededRetention)
	}
	if c.MaxErrorBytes == 0 {
		c.MaxErrorBytes = 2048
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Client == nil:
		return fmt.Errorf("%w: Client is required", ErrInvalidConfig)
	case c.Fingerprinter == nil:
		return fmt.Errorf("%w: Fingerprinter is required", ErrInvalidConfig)
	case c.MaxAttempts < 1 || c.MaxAttempts > 1000:
		return fmt.Errorf("%w: MaxAttempts %d must be 1 to 1000", ErrInvalidConfig, c.MaxAttempts)
	case c.SucceededRetention < time.Minute:
		return fmt.Errorf("%w: SucceededRetention %s must be at least 1m", ErrInvalidConfig, c.SucceededRetention)
	case c.FailedRetention < c.SucceededRetention:
		return fmt.Errorf("%w: FailedRetention %s must be at least SucceededRetention %s", ErrInvalidConfig, c.FailedRetention, c.SucceededRetention)
	case strings.ContainsAny(c.Prefix, "{}"):
		return fmt.Errorf("%w: Prefix %q must not contain { or } (the store puts its own hash tag in every key)", ErrInvalidConfig, c.Prefix)
	case c.MaxErrorBytes < 64:
		return fmt.Errorf("%w: MaxErrorBytes %d must be at least 64", ErrInvalidConfig, c.MaxErrorBytes)
	}
	return nil
}

// Store keeps consumption records and dead letters in Redis alone, for
// lease-mode handlers that have no database. See the package documentation
// for what it guarantees and what it does not.
type Store struct {
	cfg Config
	c   redis.UniversalClient
}

// New validates cfg and returns a Store. It does not contact Redis. Errors
// wrap ErrInvalidConfig.
func New(cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Store{cfg: cfg, c: cfg.Client}, nil
}

// Config returns the store's configuration with defaults applied.
func (s *Store) Config() Config { return s.cfg }

// MaxAttempts is Config.MaxAttempts.
func (s *Store) MaxAttempts() int { return s.cfg.MaxAttempts }

// SucceededRetention is Config.SucceededRetention.
func (s *Store) SucceededRetention() time.Duration { return s.cfg.SucceededRetention }

// ValidateRetention refuses a SucceededRetention shorter than the broker's
// redelivery horizon (Kafka: the topic's retention.ms; RocketMQ: the sum of
// the delay levels up to the max reconsume times): a record forgotten while
// the broker may still redeliver would let a late copy run again. The error
// wraps dedup.ErrRetentionTooShort and names both numbers.
func (s *Store) ValidateRetention(horizon time.Duration) error {
	if s.cfg.SucceededRetention < horizon {
		return fmt.Errorf("%w: SucceededRetention %s < broker redelivery horizon %s", dedup.ErrRetentionTooShort, s.cfg.SucceededRetention, horizon)
	}
	return nil
}

// keys are the Redis keys of one identity. Every key of a scope carries the
// same hash tag (a digest of the scope, so any scope text is safe), so the
// scripts' keys share a slot on Redis Cluster.
type keys struct {
	base string // "<prefix>:{<scope tag>}"
}

func (s *Store) keysOf(scope string) keys {
	h := sha256.Sum256([]byte(scope))
	return keys{base: s.cfg.Prefix + ":{" + hex.EncodeToString(h[:8]) + "}"}
}

func (k keys) record(messageID string) string { return k.base + ":rec:" + messageID }
func (k keys) lease(messageID string) string  { return k.base + ":lease:" + messageID }
func (k keys) deadLetters() string            { return k.base + ":dead_letters" }
func (k keys) businessKey(bk string) string   { return k.base + ":bk:" + bk }

// conflict marks that a conflict of messageID with this payload was
// dead-lettered, so its copies are not dead-lettered again.
func (k keys) conflict(messageID string, sum []byte) string {
	return k.base + ":conflict:" + messageID + ":" + hex.EncodeToString(sum)
}

// bkOrRecord is the business-key index key, or rec when there is no
// business key (the scripts then see the same key twice and skip the index).
func (k keys) bkOrRecord(bk, rec string) string {
	if bk == "" {
		return rec
	}
	return k.businessKey(bk)
}

// ProcessLeased runs h for msg in lease mode, with the record in Redis.
//
// The claim (one script) creates the record PROCESSING with a fresh owner
// token, fence 1 and a lease key set with PX TTL; or finds the record by
// message ID or business key and decides: a payload with another fingerprint
// is a conflict (dead letter, acked, never applied); SUCCEEDED or
// FAILED_FINAL is a duplicate; a live lease is OutcomeRetry with
// dedup.ErrLeaseHeld; FAILED_RETRYABLE, or PROCESSING whose lease expired
// (its owner died), is taken over: attempts and fence grow by one and the
// owner token rotates; when the dead owner had used the last attempt the
// record becomes FAILED_FINAL with a dead letter instead
// (dedup.ReasonAttemptsExhausted, Result.Err wrapping dedup.ErrExecutionLost),
// as pgstore.Store.ProcessLeased does.
//
// While h runs, a watchdog renews the lease every opt.Heartbeat; if it finds
// another owner it cancels h's context with dedup.ErrFenced, and if no
// renewal succeeded for 90% of the TTL with dedup.ErrLeaseExpired. The
// completion (SUCCEEDED, or a failure mark) is a compare-and-set on the owner
// token and fence: a stale owner gets OutcomeFenced (do not ack). A handler
// interrupted by ctx gives the lease back without counting the attempt and
// returns an error (do not ack). Outcomes and errors otherwise mean what they
// mean for pgstore.Store.ProcessLeased; a non-nil error (Redis unreachable)
// means the outcome was not recorded: do not ack.
func (s *Store) ProcessLeased(ctx context.Context, msg *dedup.Message, h dedup.LeaseHandler, opt dedup.LeaseOptions) (dedup.Result, error) {
	if msg == nil || h == nil {
		return dedup.Result{}, errors.New("idemq/redisstore: ProcessLeased: nil message or handler")
	}
	opt = opt.WithDefaults()
	if err := opt.ValidateUnder(0); err != nil {
		return dedup.Result{}, err
	}
	sums, err := s.keyedSums(msg.Payload)
	if err != nil {
		return s.Reject(ctx, msg, dedup.ReasonBadInput, err)
	}
	c, res, err := s.claim(ctx, msg, sums, opt.TTL)
	if err != nil || c == nil {
		return res, err
	}
	return leaseengine.Run(ctx, leaseengine.Params{
		Message: msg, Lease: c.lease, Handler: h, Options: opt, MaxAttempts: s.cfg.MaxAttempts,
		Marks: &redisLease{s: s, msg: msg, c: c, ttl: opt.TTL}, Logger: s.cfg.Logger,
	})
}

// claimed is a claim this execution holds.
type claimed struct {
	lease     dedup.Lease
	recordMID string // message ID of the record (differs from the delivery's when matched by business key)
	recordBK  string // the record's business key
}

func ms(d time.Duration) int64 { return d.Milliseconds() }

// follow runs a script that may answer {"BK", message ID} (the business
// key belongs to that message's record: run again on it) or {"GONE"} (that
// record expired: run again as a new delivery), and returns the final reply
// and the message ID of the record it was about. run gets the record's
// message ID and whether it was reached through the business key.
func follow(id dedup.Identity, run func(recMID string, viaBK bool) ([]any, error)) ([]any, string, error) {
	recMID, viaBK := id.MessageID, false
	for range 5 {
		v, err := run(recMID, viaBK)
		if err != nil {
			return nil, "", err
		}
		switch str(v, 0) {
		case "BK":
			recMID, viaBK = str(v, 1), true
		case "GONE":
			recMID, viaBK = id.MessageID, false
		default:
			return v, recMID, nil
		}
	}
	return nil, "", fmt.Errorf("the record of business key %q kept changing", id.BusinessKey)
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// claim runs claimScript. It returns a nil claim with the delivery's result
// when the handler must not run.
func (s *Store) claim(ctx context.Context, msg *dedup.Message, sums []keyedSum, ttl time.Duration) (*claimed, dedup.Result, error) {
	id := msg.Identity
	k := s.keysOf(id.Scope)
	token := uuid.New()
	v, recMID, err := follow(id, func(recMID string, viaBK bool) ([]any, error) {
		rec := k.record(recMID)
		args := claimArgs{msg: msg, viaBK: viaBK, recordMID: recMID, token: token, leaseTTL: ttl,
			openTTL: s.cfg.FailedRetention, finalTTL: s.cfg.FailedRetention, dlRetention: s.cfg.FailedRetention,
			maxAttempts: s.cfg.MaxAttempts, sums: sums}
		keys := []string{rec, k.bkOrRecord(id.BusinessKey, rec), k.lease(recMID), k.deadLetters(), k.conflict(id.MessageID, sums[0].Sum)}
		return claimScript.Run(ctx, s.c, keys, args.argv()...).Slice()
	})
	if err != nil {
		return nil, dedup.Result{}, fmt.Errorf("idemq/redisstore: claim %s: %w", id, err)
	}
	return claimReply(id, recMID, token, v)
}

// claimReply reads claimScript's final reply v (after follow) about the
// record of message ID recMID, for a claim by owner token: a claim to run
// the handler under, or nil and the delivery's result.
func claimReply(id dedup.Identity, recMID string, token uuid.UUID, v []any) (*claimed, dedup.Result, error) {
	switch str(v, 0) {
	case "RUN":
		if num(v, 1) < 1 || num(v, 2) < 1 || str(v, 3) == "" {
			return nil, dedup.Result{}, fmt.Errorf("idemq/redisstore: claim %s: unexpected reply %v", id, v)
		}
		recID := dedup.Identity{Scope: id.Scope, MessageID: str(v, 3), BusinessKey: str(v, 4)}
		l := dedup.Lease{Identity: id, Record: recID, OwnerToken: token, Attempt: int(num(v, 1)), Fence: num(v, 2)}
		return &claimed{lease: l, recordMID: recID.MessageID, recordBK: recID.BusinessKey}, dedup.Result{}, nil
	case "EXHAUSTED":
		return nil, dedup.Result{Outcome: dedup.OutcomeDeadLetter, Status: dedup.StatusFailedFinal, Attempts: int(num(v, 1)),
			MatchedBy: dedup.MatchedBy(str(v, 2)), DeadLetterID: streamID(str(v, 3)), Reason: dedup.ReasonAttemptsExhausted,
			Err: fmt.Errorf("idemq/redisstore: %s: attempts exhausted: %w (the lease of the last attempt expired)", id, dedup.ErrExecutionLost)}, nil
	}
	res := dedup.Result{Status: dedup.Status(str(v, 1)), Attempts: int(num(v, 2)), MatchedBy: dedup.MatchedBy(str(v, 3))}
	switch str(v, 0) {
	case "DUP":
		res.Outcome = dedup.OutcomeDuplicate
	case "HELD":
		res.Outcome, res.Err = dedup.OutcomeRetry, dedup.ErrLeaseHeld
	case "CONFLICT":
		if r := str(v, 5); r != dedup.ReasonMessageIDCollision && r != dedup.ReasonPayloadConflict {
			return nil, dedup.Result{}, fmt.Errorf("idemq/redisstore: claim %s: unexpected reply %v", id, v)
		}
		res.Outcome, res.DeadLetterID, res.Reason = dedup.OutcomeConflict, streamID(str(v, 4)), str(v, 5)
		res.Err = &dedup.ConflictError{Reason: res.Reason, Identity: id, MatchedBy: res.MatchedBy,
			Record: dedup.Identity{Scope: id.Scope, MessageID: recMID, BusinessKey: str(v, 6)}}
	default:
		return nil, dedup.Result{}, fmt.Errorf("idemq/redisstore: claim %s: unexpected reply %v", id, v)
	}
	return nil, res, nil
}

func str(v []any, i int) string {
	if i < len(v) {
		if s, ok := v[i].(string); ok {
			return s
		}
	}
	return ""
}

func num(v []any, i int) int64 {
	if i < len(v) {
		if n, ok := v[i].(int64); ok {
			return n
		}
	}
	return 0
}

// redisLease is the lease engine's Marks (internal/lease) on the record of
// claim c.
type redisLease struct {
	s   *Store
	msg *dedup.Message
	c   *claimed
	ttl time.Duration
}

func (r *redisLease) Renew(ctx context.Context) (bool, error) {
	k := r.s.keysOf(r.c.lease.Identity.Scope)
	ok, err := renewScript.Run(ctx, r.s.c, []string{k.record(r.c.recordMID), k.lease(r.c.recordMID)},
		r.c.lease.OwnerToken.String(), r.c.lease.Fence, ms(r.ttl)).Int()
	return ok == 1, err
}

func (r *redisLease) Succeed(ctx context.Context) (bool, error) {
	_, fenced, err := r.finish(ctx, finishStatus(dedup.StatusSucceeded), nil, "")
	return fenced, err
}

// Release gives the lease back; it returns dedup.ErrFenced when the record
// is not this owner's any more (it was taken over meanwhile).
func (r *redisLease) Release(ctx context.Context) error {
	_, fenced, err := r.finish(ctx, finishRelease, nil, "")
	if err == nil && fenced {
		return dedup.ErrFenced
	}
	return err
}

func (r *redisLease) Fail(ctx context.Context, status dedup.Status, reason string, herr error) (int64, bool, error) {
	return r.finish(ctx, finishStatus(status), herr, reason)
}

// finish runs finishScript: status is a record status, or finishRelease
// (give the lease back); a dead letter is written when reason is not "".
func (r *redisLease) finish(ctx context.Context, status finishStatus, herr error, reason string) (dlID int64, fenced bool, err error) {
	s, id := r.s, r.msg.Identity
	k := s.keysOf(id.Scope)
	rec := k.record(r.c.recordMID)
	ttl := s.cfg.FailedRetention
	if status == finishStatus(dedup.StatusSucceeded) {
		ttl = s.cfg.SucceededRetention
	}
	errText, class := "", ""
	if herr != nil {
		errText, class = pgtext.Clip(herr.Error(), s.cfg.MaxErrorBytes), dedup.ErrorClass(herr)
	}
	args := finishArgs{token: r.c.lease.OwnerToken, fence: r.c.lease.Fence, status: status, recordTTL: ttl,
		errText: errText, errClass: class, reason: reason, dlRetention: s.cfg.FailedRetention, msg: r.msg}
	v, err := finishScript.Run(ctx, s.c, []string{rec, k.bkOrRecord(r.c.recordBK, rec), k.lease(r.c.recordMID), k.deadLetters()}, args.argv()...).Slice()
	if err != nil {
		return 0, false, err
	}
	dlID, fenced, err = finishReply(v)
	if err != nil {
		return 0, false, fmt.Errorf("idemq/redisstore: finish %s: %w", id, err)
	}
	return dlID, fenced, nil
}

// finishReply reads finishScript's reply: {0} fenced, {1, dead-letter ID or
// ""} done.
func finishReply(v []any) (dlID int64, fenced bool, err error) {
	switch {
	case len(v) == 1 && num(v, 0) == 0:
		return 0, true, nil
	case len(v) == 2 && num(v, 0) == 1:
		if id := str(v, 1); id != "" {
			if dlID = streamID(id); dlID == 0 {
				return 0, false, fmt.Errorf("unexpected dead-letter ID in reply %v", v)
			}
		}
		return dlID, false, nil
	}
	return 0, false, fmt.Errorf("unexpected reply %v", v)
}

// Reject records msg as bad input without running a handler: the record
// (found by message ID or business key, or created) becomes FAILED_FINAL
// with a dead letter holding the whole message, unless it already ended
// (then OutcomeDuplicate) or a live lease holds it (OutcomeRetry with
// dedup.ErrLeaseHeld). A record created here keeps the payload's
// fingerprint when one can be made, as with pgstore.Store: once re-driven, the
// next copy of the message runs the handler, and a later message with the
// same business key and another payload is a conflict. A nil cause becomes
// an error naming reason.
func (s *Store) Reject(ctx context.Context, msg *dedup.Message, reason string, cause error) (dedup.Result, error) {
	if msg == nil {
		return dedup.Result{}, errors.New("idemq/redisstore: Reject: nil message")
	}
	if cause == nil {
		cause = errors.New(reason)
	}
	ctx = context.WithoutCancel(ctx)
	id := msg.Identity
	k := s.keysOf(id.Scope)
	token := uuid.NewString() // recognises a second run of this call's script (see prelude)
	// The payload's fingerprint, when it can be made, stays with a record
	// created here: re-driven, it then recognizes the next copy.
	fp := ""
	if sums, err := s.keyedSums(msg.Payload); err == nil {
		fp = sums[0].KeyID + ":" + hex.EncodeToString(sums[0].Sum)
	}
	v, _, err := follow(id, func(recMID string, viaBK bool) ([]any, error) {
		rec := k.record(recMID)
		args := rejectArgs{msg: msg, viaBK: viaBK, recordMID: recMID, recordTTL: s.cfg.FailedRetention, dlRetention: s.cfg.FailedRetention,
			errText: pgtext.Clip(cause.Error(), s.cfg.MaxErrorBytes), errClass: dedup.ErrorClass(cause), reason: reason, token: token, fingerprint: fp}
		keys := []string{rec, k.bkOrRecord(id.BusinessKey, rec), k.lease(recMID), k.deadLetters()}
		return rejectScript.Run(ctx, s.c, keys, args.argv()...).Slice()
	})
	if err != nil {
		return dedup.Result{}, fmt.Errorf("idemq/redisstore: reject %s: %w", id, err)
	}
	return rejectReply(id, reason, cause, v)
}

// rejectReply reads rejectScript's final reply v (after follow) to a
// rejection for reason.
func rejectReply(id dedup.Identity, reason string, cause error, v []any) (dedup.Result, error) {
	switch str(v, 0) {
	case "DUP":
		return dedup.Result{Outcome: dedup.OutcomeDuplicate, Status: dedup.Status(str(v, 1)), Attempts: int(num(v, 2)), MatchedBy: dedup.MatchedBy(str(v, 3))}, nil
	case "HELD":
		return dedup.Result{Outcome: dedup.OutcomeRetry, Status: dedup.StatusProcessing, Attempts: int(num(v, 2)),
			MatchedBy: dedup.MatchedBy(str(v, 3)), Err: dedup.ErrLeaseHeld}, nil
	case "DEAD":
		return dedup.Result{Outcome: dedup.OutcomeDeadLetter, Status: dedup.StatusFailedFinal, Attempts: int(num(v, 1)),
			Err: cause, DeadLetterID: streamID(str(v, 2)), MatchedBy: dedup.MatchedBy(str(v, 3)), Reason: reason}, nil
	}
	return dedup.Result{}, fmt.Errorf("idemq/redisstore: reject %s: unexpected reply %v", id, v)
}

// streamID turns a dead-letter stream entry ID "<ms>-<seq>" into the int64
// dead-letter ID ms·1,000,000 + seq (ordered like the stream); 0 for "".
func streamID(id string) int64 {
	msPart, seqPart, ok := strings.Cut(id, "-")
	if !ok {
		return 0
	}
	m, err1 := strconv.ParseInt(msPart, 10, 64)
	q, err2 := strconv.ParseInt(seqPart, 10, 64)
	if err1 != nil || err2 != nil || q >= 1_000_000 {
		return 0
	}
	return m*1_000_000 + q
}

// entryID is streamID's inverse.
func entryID(id int64) string {
	return strconv.FormatInt(id/1_000_000, 10) + "-" + strconv.FormatInt(id%1_000_000, 10)
}

// keyedSum is a fingerprint and the ID of the key it was made with.
type keyedSum struct {
	KeyID string
	Sum   []byte
}

// keyedSums is the payload's fingerprint under every configured key, current
// key first (the scripts compare against each; new records get the first).
func (s *Store) keyedSums(payload []byte) ([]keyedSum, error) {
	byID, err := s.cfg.Fingerprinter.Sums(payload)
	if err != nil {
		return nil, err
	}
	ids := s.cfg.Fingerprinter.KeyIDs()
	out := make([]keyedSum, len(ids))
	for i, id := range ids {
		out[i] = keyedSum{KeyID: id, Sum: byID[id]}
	}
	return out, nil
}
