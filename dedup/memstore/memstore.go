package memstore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq/dedup"
)

// ErrInvalidConfig is wrapped by every error New returns for a bad Config.
// It is dedup.ErrInvalidConfig.
var ErrInvalidConfig = dedup.ErrInvalidConfig

// Config configures a Store. The zero value is valid: every field has a
// default.
type Config struct {
	// MaxAttempts is how many handler executions a record gets; a failure
	// at the last one is final (FAILED_FINAL and a dead letter). Default 5;
	// 1 to 1000.
	MaxAttempts int
	// SucceededRetention is how long a SUCCEEDED record is kept before
	// Purge removes it. Default 7 days; positive.
	SucceededRetention time.Duration
	// FailedRetention is how long a FAILED_FINAL record, and a dead letter,
	// is kept before Purge removes it. Default max(30 days,
	// SucceededRetention); at least SucceededRetention.
	FailedRetention time.Duration
	// Fingerprinter fingerprints payloads for conflict detection. Default:
	// HMAC-SHA256 under a fixed key with ID "memstore" (an in-memory store
	// has no secret to protect).
	Fingerprinter *dedup.Fingerprinter
}

func (c Config) withDefaults() (Config, error) {
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 5
	}
	if c.SucceededRetention == 0 {
		c.SucceededRetention = 7 * 24 * time.Hour
	}
	if c.FailedRetention == 0 {
		c.FailedRetention = max(30*24*time.Hour, c.SucceededRetention)
	}
	if c.Fingerprinter == nil {
		fp, err := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "memstore", Secret: []byte("idemq-memstore-fingerprint-key")})
		if err != nil {
			return c, err
		}
		c.Fingerprinter = fp
	}
	switch {
	case c.MaxAttempts < 1 || c.MaxAttempts > 1000:
		return c, fmt.Errorf("%w: MaxAttempts %d must be 1 to 1000", ErrInvalidConfig, c.MaxAttempts)
	case c.SucceededRetention < 0:
		return c, fmt.Errorf("%w: SucceededRetention %s must be positive", ErrInvalidConfig, c.SucceededRetention)
	case c.FailedRetention < c.SucceededRetention:
		return c, fmt.Errorf("%w: FailedRetention %s must be at least SucceededRetention %s", ErrInvalidConfig, c.FailedRetention, c.SucceededRetention)
	}
	return c, nil
}

// Store is an in-memory consumption-record store. Its zero value is not
// usable; build one with New. It is safe for concurrent use.
type Store struct {
	cfg Config
	now func() time.Time // the store's clock; time.Now (tests move it)

	mu     sync.Mutex
	byID   map[ident]*record // (scope, message ID) → record
	byKey  map[ident]*record // (scope, business key) → record
	dead   []dedup.DeadLetter
	lastDL int64
	values map[string][]byte // committed Tx writes
}

// ident is one unique key of a record: (scope, message ID) or (scope,
// business key).
type ident struct{ scope, key string }

// record is a consumption record and its lease.
type record struct {
	dedup.Record
	owner      uuid.UUID
	leaseUntil time.Time
	// running is closed when the atomic-mode execution holding the record
	// ends; nil when none runs (copies wait for it, like a row lock).
	running chan struct{}
}

var _ dedup.TxStore[*Tx] = (*Store)(nil)

// New validates cfg and returns an empty Store. Errors wrap ErrInvalidConfig
// and name the field.
func New(cfg Config) (*Store, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Store{cfg: cfg, now: time.Now, byID: map[ident]*record{}, byKey: map[ident]*record{}, values: map[string][]byte{}}, nil
}

// Config returns the store's configuration with defaults applied.
func (s *Store) Config() Config { return s.cfg }

// MaxAttempts is Config.MaxAttempts.
func (s *Store) MaxAttempts() int { return s.cfg.MaxAttempts }

// SucceededRetention is Config.SucceededRetention.
func (s *Store) SucceededRetention() time.Duration { return s.cfg.SucceededRetention }

// ValidateRetention refuses a SucceededRetention shorter than horizon, the
// broker's redelivery horizon, with an error wrapping
// dedup.ErrRetentionTooShort.
func (s *Store) ValidateRetention(horizon time.Duration) error {
	if s.cfg.SucceededRetention < horizon {
		return fmt.Errorf("%w: SucceededRetention %s < broker redelivery horizon %s", dedup.ErrRetentionTooShort, s.cfg.SucceededRetention, horizon)
	}
	return nil
}

func checkMsg(msg *dedup.Message) error {
	if msg == nil || msg.Identity.Scope == "" || msg.Identity.MessageID == "" {
		return errors.New("idemq: memstore: message identity not set (use dedup.NewIdentity)")
	}
	return nil
}

// match finds the record of msg by message ID, then by business key. s.mu
// is held.
func (s *Store) match(id dedup.Identity) (*record, dedup.MatchedBy) {
	if r := s.byID[ident{id.Scope, id.MessageID}]; r != nil {
		return r, dedup.ByMessageID
	}
	if id.BusinessKey != "" {
		if r := s.byKey[ident{id.Scope, id.BusinessKey}]; r != nil {
			return r, dedup.ByBusinessKey
		}
	}
	return nil, ""
}

// conflict checks msg's payload against r's fingerprint and, when they
// differ, dead-letters msg (once per message ID, reason and payload) and
// returns the conflict's Result. s.mu is held.
func (s *Store) conflict(msg *dedup.Message, r *record, by dedup.MatchedBy) (dedup.Result, bool) {
	if len(r.Fingerprint) == 0 {
		// A record of bad input without a fingerprint takes the first
		// fingerprint that reaches it by message ID.
		if sum, keyID, err := s.cfg.Fingerprinter.Sum(msg.Payload); err == nil && by == dedup.ByMessageID {
			r.Fingerprint, r.FingerprintKeyID = sum, keyID
		}
		return dedup.Result{}, false
	}
	ok, err := s.cfg.Fingerprinter.Matches(msg.Payload, r.Fingerprint, r.FingerprintKeyID)
	if ok {
		return dedup.Result{}, false
	}
	var cause error
	if errors.Is(err, dedup.ErrUnknownFingerprintKey) {
		cause = err
	}
	reason := dedup.ConflictReason(by, msg.Identity.BusinessKey, r.BusinessKey)
	cerr := &dedup.ConflictError{Reason: reason, Identity: msg.Identity, MatchedBy: by, Cause: cause,
		Record: dedup.Identity{Scope: r.Scope, MessageID: r.MessageID, BusinessKey: r.BusinessKey}}
	res := dedup.Result{Outcome: dedup.OutcomeConflict, MatchedBy: by, Status: r.Status, Attempts: r.Attempts, Err: cerr, Reason: reason}
	if !s.liveDeadLetter(msg, reason) {
		res.DeadLetterID = s.deadLetter(msg, reason, cerr, r.Attempts)
	}
	return res, true
}

// liveDeadLetter reports whether msg already has a dead letter of reason
// with the same payload that was not re-driven. s.mu is held.
func (s *Store) liveDeadLetter(msg *dedup.Message, reason string) bool {
	for _, d := range s.dead {
		if d.Scope == msg.Identity.Scope && d.MessageID == msg.Identity.MessageID && d.Reason == reason &&
			d.RedrivenAt == nil && string(d.Payload) == string(msg.Payload) {
			return true
		}
	}
	return false
}

// deadLetter appends a dead letter keeping msg whole and returns its ID.
// s.mu is held.
func (s *Store) deadLetter(msg *dedup.Message, reason string, cause error, attempts int) int64 {
	s.lastDL++
	d := dedup.DeadLetter{ID: s.lastDL, Scope: msg.Identity.Scope, MessageID: msg.Identity.MessageID, BusinessKey: msg.Identity.BusinessKey,
		Reason: reason, Attempts: attempts, Topic: msg.Topic, Key: clone(msg.Key), Payload: clone(msg.Payload),
		Headers: cloneMap(msg.Headers), Source: msg.Source, CreatedAt: s.now()}
	if cause != nil {
		d.Error, d.ErrorClass = cause.Error(), dedup.ErrorClass(cause)
	}
	s.dead = append(s.dead, d)
	return d.ID
}

// insert adds a new record for msg. s.mu is held.
func (s *Store) insert(msg *dedup.Message, sum []byte, keyID string) *record {
	now := s.now()
	id := msg.Identity
	r := &record{Record: dedup.Record{Scope: id.Scope, MessageID: id.MessageID, BusinessKey: id.BusinessKey,
		Fingerprint: sum, FingerprintKeyID: keyID, Status: dedup.StatusFailedRetryable, CreatedAt: now, UpdatedAt: now}}
	s.byID[ident{id.Scope, id.MessageID}] = r
	if id.BusinessKey != "" {
		s.byKey[ident{id.Scope, id.BusinessKey}] = r
	}
	return r
}

// remove drops r from the indexes. s.mu is held.
func (s *Store) remove(r *record) {
	if s.byID[ident{r.Scope, r.MessageID}] == r {
		delete(s.byID, ident{r.Scope, r.MessageID})
	}
	if r.BusinessKey != "" && s.byKey[ident{r.Scope, r.BusinessKey}] == r {
		delete(s.byKey, ident{r.Scope, r.BusinessKey})
	}
}

// finish sets r's status after an execution, with its error and expiry.
// s.mu is held.
func (s *Store) finish(r *record, msg *dedup.Message, status dedup.Status, herr error) {
	now := s.now()
	r.Status, r.UpdatedAt, r.leaseUntil = status, now, time.Time{}
	r.Source, r.ReconsumeTimes = msg.Source, msg.ReconsumeTimes
	if herr != nil {
		r.LastError, r.LastErrorClass = herr.Error(), dedup.ErrorClass(herr)
	}
	switch status {
	case dedup.StatusSucceeded:
		exp := now.Add(s.cfg.SucceededRetention)
		r.ExpiresAt = &exp
	case dedup.StatusFailedFinal:
		exp := now.Add(s.cfg.FailedRetention)
		r.ExpiresAt = &exp
	default:
		r.ExpiresAt = nil
	}
}

// Reject records msg as bad input without running a handler: FAILED_FINAL
// and a dead letter with reason and cause. A copy of a decided record (or
// of one whose business key matches) is a duplicate; a record held by a
// live lease or running execution answers OutcomeRetry (ErrLeaseHeld).
func (s *Store) Reject(ctx context.Context, msg *dedup.Message, reason string, cause error) (dedup.Result, error) {
	if err := checkMsg(msg); err != nil {
		return dedup.Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return dedup.Result{}, err
	}
	if cause == nil {
		cause = errors.New(reason)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, by := s.match(msg.Identity)
	if r != nil {
		switch {
		case r.Status == dedup.StatusSucceeded || r.Status == dedup.StatusFailedFinal:
			return dedup.Result{Outcome: dedup.OutcomeDuplicate, MatchedBy: by, Status: r.Status, Attempts: r.Attempts}, nil
		case r.running != nil || r.Status == dedup.StatusProcessing && s.now().Before(r.leaseUntil):
			return dedup.Result{Outcome: dedup.OutcomeRetry, Status: r.Status, Attempts: r.Attempts, Err: dedup.ErrLeaseHeld}, nil
		}
	} else {
		sum, keyID, _ := s.cfg.Fingerprinter.Sum(msg.Payload) // none for a payload the canonicalizer refuses
		r = s.insert(msg, sum, keyID)
	}
	r.owner = uuid.New() // fences an owner that died holding the lease
	s.finish(r, msg, dedup.StatusFailedFinal, cause)
	id := s.deadLetter(msg, reason, cause, r.Attempts)
	return dedup.Result{Outcome: dedup.OutcomeDeadLetter, Status: dedup.StatusFailedFinal, Attempts: r.Attempts, Err: cause, Reason: reason, DeadLetterID: id}, nil
}

// Lookup returns a copy of the record of (scope, message ID) (the key is
// normalized with dedup.NormalizeKey), or an error wrapping
// dedup.ErrNotFound.
func (s *Store) Lookup(_ context.Context, scope, messageID string) (dedup.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.byID[ident{scope, dedup.NormalizeKey(messageID)}]
	if r == nil {
		return dedup.Record{}, fmt.Errorf("%w: %s/%s", dedup.ErrNotFound, scope, messageID)
	}
	return copyRecord(r.Record), nil
}

// LookupBusinessKey returns a copy of the record holding business key
// businessKey in scope, or an error wrapping dedup.ErrNotFound.
func (s *Store) LookupBusinessKey(_ context.Context, scope, businessKey string) (dedup.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.byKey[ident{scope, dedup.NormalizeKey(businessKey)}]
	if r == nil {
		return dedup.Record{}, fmt.Errorf("%w: %s business key %s", dedup.ErrNotFound, scope, businessKey)
	}
	return copyRecord(r.Record), nil
}

// DeadLetters lists the dead letters of scope with an ID above afterID,
// oldest first, at most limit (default 100 when limit ≤ 0).
func (s *Store) DeadLetters(_ context.Context, scope string, afterID int64, limit int) ([]dedup.DeadLetter, error) {
	if limit <= 0 {
		limit = 100
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []dedup.DeadLetter
	for _, d := range s.dead {
		if d.Scope == scope && d.ID > afterID && len(out) < limit {
			d.Payload, d.Key, d.Headers = clone(d.Payload), clone(d.Key), cloneMap(d.Headers)
			out = append(out, d)
		}
	}
	return out, nil
}

// Redrive is the operator's re-drive of the FAILED_FINAL record of (scope,
// message ID): it becomes FAILED_RETRYABLE (its attempts kept), so the next
// copy runs the handler once more, and its dead letters are stamped
// RedrivenAt. Errors wrap dedup.ErrNotFound (no record) or dedup.ErrNotFinal
// (another status, named).
func (s *Store) Redrive(_ context.Context, scope, messageID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.byID[ident{scope, dedup.NormalizeKey(messageID)}]
	switch {
	case r == nil:
		return fmt.Errorf("%w: %s/%s", dedup.ErrNotFound, scope, messageID)
	case r.Status != dedup.StatusFailedFinal:
		return fmt.Errorf("%w: %s/%s is %s", dedup.ErrNotFinal, scope, messageID, r.Status)
	}
	now := s.now()
	r.Status, r.ExpiresAt, r.UpdatedAt = dedup.StatusFailedRetryable, nil, now
	for i := range s.dead {
		if d := &s.dead[i]; d.Scope == scope && d.MessageID == r.MessageID && d.RedrivenAt == nil {
			d.RedrivenAt = &now
		}
	}
	return nil
}

// Purge deletes the records whose retention ended (ExpiresAt before now:
// SUCCEEDED after SucceededRetention, FAILED_FINAL after FailedRetention)
// and the dead letters older than FailedRetention, and returns how many
// records it deleted. Records not final are never purged. A copy of a purged
// message runs again as new.
func (s *Store) Purge(context.Context) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var n int64
	for _, r := range s.byID {
		if r.ExpiresAt != nil && r.ExpiresAt.Before(now) && r.running == nil {
			s.remove(r)
			n++
		}
	}
	kept := s.dead[:0]
	for _, d := range s.dead {
		if now.Sub(d.CreatedAt) <= s.cfg.FailedRetention {
			kept = append(kept, d)
		}
	}
	s.dead = kept
	return n, nil
}

// Get returns the value a committed Tx wrote under key (Tx.Set), and
// whether there is one. Handler unit tests read their effects with it.
func (s *Store) Get(key string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.values[key]
	return clone(v), ok
}

// Keys returns the keys committed Tx writes set, sorted.
func (s *Store) Keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.values))
	for k := range s.values {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func copyRecord(r dedup.Record) dedup.Record {
	r.Fingerprint = clone(r.Fingerprint)
	if r.ExpiresAt != nil {
		t := *r.ExpiresAt
		r.ExpiresAt = &t
	}
	return r
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
