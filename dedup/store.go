package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/internal/pgtext"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Handler is the user's business logic for one message. It receives the
// transaction that also holds the consumption record: every write it makes
// through tx (business rows, outbox rows) commits if and only if the record is
// marked SUCCEEDED. A handler must not commit or roll back tx, and must not
// write through another connection if those writes must be exactly once.
//
// Returning nil marks the record SUCCEEDED. Returning Permanent(err) marks it
// FAILED_FINAL with a dead letter. Any other error rolls the transaction back
// and marks FAILED_RETRYABLE (FAILED_FINAL once Config.MaxAttempts is
// reached). A panic is recovered and treated as a retryable error.
type Handler func(ctx context.Context, tx pgx.Tx, msg *Message) error

// Store keeps consumption records and dead letters in Postgres and runs
// handlers in atomic mode. It is safe for concurrent use by any number of
// goroutines and processes.
type Store struct {
	pool *pgxpool.Pool
	cfg  Config
	fp   *Fingerprinter
	q    queries
	fast fastPathStats
}

// NewStore validates cfg and returns a Store on pool. It does not touch the
// database; call Migrate once at start. Errors wrap ErrInvalidConfig.
func NewStore(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidConfig)
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Store{pool: pool, cfg: cfg, fp: cfg.Fingerprinter, q: newQueries(cfg)}, nil
}

// Config returns the store's configuration with defaults applied.
func (s *Store) Config() Config { return s.cfg }

// MaxAttempts is Config.MaxAttempts: how many handler executions a record
// gets before it is FAILED_FINAL.
func (s *Store) MaxAttempts() int { return s.cfg.MaxAttempts }

// SucceededRetention is Config.SucceededRetention: how long a SUCCEEDED
// record is kept (and duplicates are recognized) after it succeeded.
func (s *Store) SucceededRetention() time.Duration { return s.cfg.SucceededRetention }

// Pool returns the pool the store runs on.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Process runs h for msg in atomic mode and reports the outcome. msg.Identity
// must be set (see NewIdentity); msg.Attempt is set before h runs.
//
// The returned error is non-nil only when the outcome could not be made
// durable (database unreachable, ctx canceled during the handler): the
// delivery must then not be acknowledged, and nothing was marked. Handler
// failures are not errors of Process: they come back as OutcomeRetry or
// OutcomeDeadLetter with Result.Err set.
func (s *Store) Process(ctx context.Context, msg *Message, h Handler) (Result, error) {
	if msg == nil || h == nil {
		return Result{}, errors.New("idemq: Process: nil message or handler")
	}
	if msg.Identity.Scope == "" || msg.Identity.MessageID == "" {
		return Result{}, errors.New("idemq: Process: message identity not set (use NewIdentity)")
	}
	sum, keyID, err := s.fp.Sum(msg.Payload)
	if err != nil {
		return s.Reject(ctx, msg, ReasonBadInput, err)
	}
	if res, hit := s.fastLookup(ctx, msg); hit {
		return res, nil
	}
	res, herr, err := s.claimAndRun(ctx, msg, sum, keyID, h)
	if err == nil && res.Status == StatusSucceeded && (res.Outcome == OutcomeProcessed || res.Outcome == OutcomeDuplicate) {
		s.fastRemember(ctx, msg.Identity, sum, keyID)
	}
	if err != nil || herr == nil {
		return res, err
	}
	// The handler failed and its transaction is rolled back. A shutdown is not
	// the message's fault: mark nothing and let the broker redeliver.
	if ctx.Err() != nil {
		return Result{}, fmt.Errorf("idemq: handler interrupted: %w", errors.Join(ctx.Err(), herr))
	}
	return s.markFailed(ctx, msg, sum, keyID, herr, ReasonAttemptsExhausted)
}

// Reject records a delivery that cannot be processed at all (bad input: the
// business-key extractor or canonicalizer failed, the payload cannot be
// decoded): the record becomes FAILED_FINAL with reason and err, and a
// dead-letter row keeps the whole message. The handler never runs. A copy of
// an identity that already has a record is reported as a duplicate.
//
// The record keeps the payload's fingerprint when one can be made (the
// canonicalizer accepts the payload), so that once re-driven (Redrive) the
// next copy is recognized as the same message and runs the handler. A record
// without one (the canonicalizer failed) takes the fingerprint of the first
// copy that reaches it by message ID after its re-drive.
func (s *Store) Reject(ctx context.Context, msg *Message, reason string, cause error) (Result, error) {
	if cause == nil {
		cause = errors.New(reason)
	}
	sum, keyID, ferr := s.fp.Sum(msg.Payload)
	if ferr != nil {
		sum, keyID = nil, ""
	}
	return s.markFailed(ctx, msg, sum, keyID, Permanent(cause), reason)
}

// record is the locked view of an existing consumption record.
type record struct {
	id          int64
	messageID   string
	businessKey string
	fingerprint []byte
	keyID       string
	status      Status
	attempts    int
}

func (r *record) matchedBy(id Identity) MatchedBy {
	if r.messageID == id.MessageID {
		return ByMessageID
	}
	return ByBusinessKey
}

// claimAndRun is step 1–3 of atomic mode. It returns the handler's error
// separately (herr) when the handler ran and failed; the transaction is then
// already rolled back.
func (s *Store) claimAndRun(ctx context.Context, msg *Message, sum []byte, keyID string, h Handler) (res Result, herr error, err error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return Result{}, nil, fmt.Errorf("idemq: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	res, herr, err = s.claimAndRunIn(ctx, tx, msg, sum, keyID, h, true)
	if err != nil || herr != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return res, herr, err
	}
	if err := tx.Commit(ctx); err != nil {
		var pgErr *pgconn.PgError
		if res.HandlerCalled && (errors.Is(err, pgx.ErrTxCommitRollback) || errors.As(err, &pgErr)) {
			// The server refused the commit: the handler left the
			// transaction aborted, or a deferred constraint of its writes
			// failed. That is the handler's failure, marked like any other.
			return Result{HandlerCalled: true, Attempts: res.Attempts}, fmt.Errorf("idemq: commit refused: %w", err), nil
		}
		return Result{}, nil, fmt.Errorf("idemq: commit: %w", err)
	}
	return res, nil, nil
}

// claimAndRunIn claims msg in tx, decides, and runs h in tx when the record
// must be processed; it marks SUCCEEDED, or the failure, but does not commit.
// herr is set only when a handler failure could not be marked in tx (the
// transaction is unusable): the caller must then roll back and markFailed in
// a new transaction. On err the caller must roll back.
//
// optimistic inserts a new record as SUCCEEDED right away (one statement
// less): only for a caller that commits only when the handler succeeded and
// that treats a refused commit as the handler's failure (claimAndRun).
func (s *Store) claimAndRunIn(ctx context.Context, tx pgx.Tx, msg *Message, sum []byte, keyID string, h Handler, optimistic bool) (res Result, herr error, err error) {
	id := msg.Identity
	rowID, rec, err := s.claim(ctx, tx, msg, sum, keyID, optimistic)
	attempts := 1
	if err != nil {
		return Result{}, nil, err
	}
	if rec != nil {
		// Someone else's record (or our own earlier one) decides.
		res, run, err := s.decide(ctx, tx, msg, sum, rec)
		if err != nil || !run {
			return res, nil, err
		}
		rowID = rec.id
		if attempts, err = s.q.reclaim(ctx, tx, rec.id, msg); err != nil {
			return Result{}, nil, err
		}
		if _, err := tx.Exec(ctx, "savepoint "+handlerSavepoint); err != nil {
			return Result{}, nil, fmt.Errorf("idemq: savepoint: %w", err)
		}
	}

	// The handler runs after a savepoint (set with the claim): when it fails,
	// its writes roll back alone and the failure is marked in this same
	// transaction, still holding the record's row lock, so no other copy can
	// slip in between.
	msg.Attempt = attempts
	called := Result{HandlerCalled: true, Attempts: attempts}
	herr = runHandler(ctx, tx, msg, h)
	if herr == nil && optimistic && rec == nil {
		return Result{Outcome: OutcomeProcessed, Status: StatusSucceeded, Attempts: attempts, HandlerCalled: true}, nil, nil
	}
	if herr == nil {
		err := s.q.markSucceeded(ctx, tx, id, rowID, *s.expiry(StatusSucceeded))
		if err == nil {
			return Result{Outcome: OutcomeProcessed, Status: StatusSucceeded, Attempts: attempts, HandlerCalled: true}, nil, nil
		}
		// The handler left the transaction unusable (for example it
		// swallowed an error and went on): that is a handler failure.
		herr = fmt.Errorf("idemq: mark succeeded: %w", err)
	}
	if ctx.Err() != nil {
		// A shutdown is not the message's fault: mark nothing; the caller
		// rolls back and the broker redelivers.
		return Result{}, nil, fmt.Errorf("idemq: handler interrupted: %w", errors.Join(ctx.Err(), herr))
	}
	if _, err := tx.Exec(ctx, "rollback to savepoint "+handlerSavepoint); err != nil {
		return called, herr, nil // transaction unusable: the caller marks in a new one
	}
	res, err = s.markClaimedFailed(ctx, tx, rowID, attempts, msg, sum, herr)
	if err != nil {
		return called, herr, nil
	}
	return res, nil, nil
}

// markClaimedFailed marks the record this transaction claimed (attempts
// already counted by the claim) FAILED_RETRYABLE, or FAILED_FINAL with a dead
// letter when the error is permanent or the attempts are used up.
func (s *Store) markClaimedFailed(ctx context.Context, tx pgx.Tx, rowID int64, attempts int, msg *Message, sum []byte, herr error) (Result, error) {
	status, reason := StatusFailedRetryable, ReasonAttemptsExhausted
	switch {
	case IsPermanent(herr):
		status, reason = StatusFailedFinal, ReasonPermanentError
	case attempts >= s.cfg.MaxAttempts:
		status = StatusFailedFinal
	}
	if err := s.q.updateFailed(ctx, tx, rowID, status, false, msg, clip(herr.Error(), s.cfg.MaxErrorBytes), ErrorClass(herr), s.expiry(status)); err != nil {
		return Result{}, err
	}
	res := Result{Outcome: OutcomeRetry, Status: status, Attempts: attempts, HandlerCalled: true, Err: herr}
	if status == StatusFailedFinal {
		var err error
		res.Outcome, res.Reason = OutcomeDeadLetter, reason
		if res.DeadLetterID, err = s.q.insertDeadLetter(ctx, tx, msg, sum, reason, herr, attempts, s.cfg.MaxErrorBytes); err != nil {
			return Result{}, err
		}
	}
	return res, nil
}

// claim inserts a PROCESSING (optimistic: SUCCEEDED) record with attempts 1
// (returning its row id),
// or, when either unique key already exists, locks the existing record FOR
// UPDATE and returns it.
func (s *Store) claim(ctx context.Context, tx pgx.Tx, msg *Message, sum []byte, keyID string, optimistic bool) (int64, *record, error) {
	status, expiry := StatusProcessing, (*float64)(nil)
	if optimistic {
		status, expiry = StatusSucceeded, s.expiry(StatusSucceeded)
	}
	for try := 0; try < 3; try++ {
		rowID, rec, err := s.q.claimInsert(ctx, tx, msg, sum, keyID, status, expiry)
		if err != nil || rowID != 0 || rec != nil {
			return rowID, rec, err
		}
		// The conflicting record vanished between the two statements (purged):
		// claim again.
	}
	return 0, nil, fmt.Errorf("idemq: claim %s: record keeps vanishing", msg.Identity)
}

// decide applies the state machine to an existing, locked record. run reports
// whether the handler must run (the record was FAILED_RETRYABLE).
func (s *Store) decide(ctx context.Context, tx pgx.Tx, msg *Message, sum []byte, rec *record) (res Result, run bool, err error) {
	id := msg.Identity
	by := rec.matchedBy(id)
	res = Result{MatchedBy: by, Status: rec.status, Attempts: rec.attempts}
	if len(rec.fingerprint) == 0 && rec.status == StatusFailedRetryable && by == ByMessageID {
		// Bad input rejected before its payload could be fingerprinted
		// (Reject), re-driven since: this copy gives the record its
		// fingerprint and runs the handler.
		if _, err := tx.Exec(ctx, `update `+s.q.records+` set fingerprint = $2, fingerprint_key_id = $3 where id = $1`,
			rec.id, sum, s.fp.CurrentKeyID()); err != nil {
			return Result{}, false, fmt.Errorf("idemq: fingerprint re-driven record %s: %w", id, err)
		}
		return res, true, nil
	}
	same, cause := s.fp.Matches(msg.Payload, rec.fingerprint, rec.keyID)
	if cause != nil || !same {
		reason := ConflictReason(by, id.BusinessKey, rec.businessKey)
		cerr := &ConflictError{Reason: reason, Identity: id, MatchedBy: by, Cause: cause,
			Record: Identity{Scope: id.Scope, MessageID: rec.messageID, BusinessKey: rec.businessKey}}
		res.Outcome, res.Err, res.Reason = OutcomeConflict, cerr, reason
		res.DeadLetterID, err = s.q.insertDeadLetter(ctx, tx, msg, sum, reason, cerr, rec.attempts, s.cfg.MaxErrorBytes)
		return res, false, err
	}
	switch rec.status {
	case StatusSucceeded, StatusFailedFinal:
		res.Outcome = OutcomeDuplicate
		return res, false, nil
	case StatusFailedRetryable:
		return res, true, nil
	default:
		// PROCESSING committed by a lease-mode owner; atomic mode never
		// commits it. Leave it to its owner: retry later.
		res.Outcome, res.Err = OutcomeRetry, fmt.Errorf("idemq: %s is being processed by another owner", id)
		return res, false, nil
	}
}

// markFailed records a failed execution (or a rejection) in its own short
// transaction after the handler's transaction rolled back. finalReason is the
// dead-letter reason used when retries are exhausted.
func (s *Store) markFailed(ctx context.Context, msg *Message, sum []byte, keyID string, herr error, finalReason string) (Result, error) {
	ctx = context.WithoutCancel(ctx) // the mark must land even during shutdown
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return Result{}, fmt.Errorf("idemq: begin mark failed: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	res, err := s.markFailedIn(ctx, tx, msg, sum, keyID, herr, finalReason)
	if err != nil {
		return Result{}, err
	}
	return res, commit(ctx, tx)
}

// markFailedIn is markFailed's work inside tx (no commit).
func (s *Store) markFailedIn(ctx context.Context, tx pgx.Tx, msg *Message, sum []byte, keyID string, herr error, finalReason string) (Result, error) {
	permanent := IsPermanent(herr)
	reason := finalReason
	if permanent && finalReason == ReasonAttemptsExhausted {
		reason = ReasonPermanentError
	}
	if sum == nil {
		sum, keyID = []byte{}, s.fp.CurrentKeyID()
	}
	errText, class := clip(herr.Error(), s.cfg.MaxErrorBytes), ErrorClass(herr)
	status := StatusFailedRetryable
	if permanent || s.cfg.MaxAttempts <= 1 {
		status = StatusFailedFinal
	}
	res := Result{HandlerCalled: finalReason == ReasonAttemptsExhausted, Err: herr}
	rowID, err := s.q.insert(ctx, tx, msg, sum, keyID, status, 1, errText, class, s.expiry(status))
	if err != nil {
		return Result{}, err
	}
	res.Attempts = 1
	if rowID == 0 {
		rec, err := s.q.lock(ctx, tx, msg.Identity)
		if err != nil {
			return Result{}, err
		}
		if rec == nil {
			return Result{}, fmt.Errorf("idemq: mark failed %s: record vanished", msg.Identity)
		}
		if rec.status == StatusSucceeded || rec.status == StatusFailedFinal {
			// Another copy finished meanwhile: this delivery is a duplicate.
			return Result{Outcome: OutcomeDuplicate, MatchedBy: rec.matchedBy(msg.Identity), Status: rec.status, Attempts: rec.attempts, HandlerCalled: res.HandlerCalled}, nil
		}
		res.Attempts = rec.attempts + 1
		if res.Attempts >= s.cfg.MaxAttempts {
			status = StatusFailedFinal
		}
		if err := s.q.updateFailed(ctx, tx, rec.id, status, true, msg, errText, class, s.expiry(status)); err != nil {
			return Result{}, err
		}
	}
	res.Status = status
	res.Outcome = OutcomeRetry
	if status == StatusFailedFinal {
		res.Outcome, res.Reason = OutcomeDeadLetter, reason
		if res.DeadLetterID, err = s.q.insertDeadLetter(ctx, tx, msg, sum, reason, herr, res.Attempts, s.cfg.MaxErrorBytes); err != nil {
			return Result{}, err
		}
	}
	return res, nil
}

// expiry returns the retention of a status in seconds (nil: never expires).
func (s *Store) expiry(status Status) *float64 {
	var d float64
	switch status {
	case StatusSucceeded:
		d = s.cfg.SucceededRetention.Seconds()
	case StatusFailedFinal:
		d = s.cfg.FailedFinalRetention.Seconds()
	default:
		return nil
	}
	return &d
}

func runHandler(ctx context.Context, tx pgx.Tx, msg *Message, h Handler) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v}
		}
	}()
	return h(ctx, tx, msg)
}

func commit(ctx context.Context, tx pgx.Tx) error {
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("idemq: commit: %w", err)
	}
	return nil
}

// clip makes s storable in a text column (see pgtext.Clip).
func clip(s string, n int) string { return pgtext.Clip(s, n) }
