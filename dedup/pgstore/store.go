package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/pgtext"
	"github.com/idemq/idemq/internal/pooler"

	"github.com/jackc/pgx/v5"
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
// reached). A panic is recovered and treated as a retryable error. A
// statement error the handler ignores is still its failure (the transaction
// is aborted), recorded with that statement's error as its cause, not the
// 25P02 ("current transaction is aborted") that follows it.
//
// It is dedup.TxHandler for pgx.Tx; consumer.Handler is the same type.
type Handler = dedup.TxHandler[pgx.Tx]

// ErrInvalidConfig is wrapped by every error New returns for a bad Config;
// it is dedup.ErrInvalidConfig.
var ErrInvalidConfig = dedup.ErrInvalidConfig

var _ dedup.TxStore[pgx.Tx] = (*Store)(nil)

// Store keeps consumption records and dead letters in Postgres and runs
// handlers in atomic mode. It is safe for concurrent use by any number of
// goroutines and processes.
type Store struct {
	pool *pgxpool.Pool
	cfg  Config
	fp   *dedup.Fingerprinter
	q    queries
	fast fastPathStats
}

// New validates cfg and returns a Store on pool. It does not touch the
// database; call Migrate once at start. Errors wrap ErrInvalidConfig and name
// the field.
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pool is nil", dedup.ErrInvalidConfig)
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.TransactionPooler {
		if err := pooler.CheckExecMode(pool, "pgstore.Config.TransactionPooler", dedup.ErrInvalidConfig); err != nil {
			return nil, err
		}
	}
	q, err := newQueries(cfg)
	if err != nil {
		return nil, err
	}
	return &Store{pool: pool, cfg: cfg, fp: cfg.Fingerprinter, q: q}, nil
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
// durable (database unreachable, ctx canceled during the handler, the
// connection lost or terminated at COMMIT: these wrap ErrOutcomeUnknown):
// the delivery must then not be acknowledged, and nothing was counted or
// marked; Result.HandlerCalled still says whether the handler ran. Handler
// failures are not errors of Process: they come back as OutcomeRetry or
// OutcomeDeadLetter with Result.Err set. Serialization failures and
// deadlocks are retried first as Config.TransientRetry says (see
// FailureClass for the whole table).
func (s *Store) Process(ctx context.Context, msg *dedup.Message, h Handler) (dedup.Result, error) {
	if msg == nil || h == nil {
		return dedup.Result{}, errors.New("idemq: Process: nil message or handler")
	}
	if msg.Identity.Scope == "" || msg.Identity.MessageID == "" {
		return dedup.Result{}, errors.New("idemq: Process: message identity not set (use NewIdentity)")
	}
	sum, keyID, err := s.fp.Sum(msg.Payload)
	if err != nil {
		return s.Reject(ctx, msg, dedup.ReasonBadInput, err)
	}
	if res, hit := s.fastLookup(ctx, msg); hit {
		return res, nil
	}
	res, herr, err := s.runAtomic(ctx, claimRun{msg: msg, sum: sum, keyID: keyID, h: h, mode: claimSucceeded})
	if err == nil && res.Status == dedup.StatusSucceeded && (res.Outcome == dedup.OutcomeProcessed || res.Outcome == dedup.OutcomeDuplicate) {
		s.fastRemember(ctx, msg.Identity, sum, keyID)
	}
	if err != nil || herr == nil {
		return res, err
	}
	// The handler failed and its transaction is rolled back. A shutdown is not
	// the message's fault: mark nothing and let the broker redeliver.
	if ctx.Err() != nil {
		return dedup.Result{HandlerCalled: true}, fmt.Errorf("%w: handler interrupted: %w", dedup.ErrOutcomeUnknown, errors.Join(ctx.Err(), herr))
	}
	mres, err := s.markFailed(ctx, failure{msg: msg, sum: sum, keyID: keyID, err: herr, finalReason: dedup.ReasonAttemptsExhausted})
	if err != nil {
		return dedup.Result{HandlerCalled: true, Attempts: res.Attempts}, wrapUnknown(err)
	}
	return mres, nil
}

// runAtomic is claimAndRun, retried in place as Config.TransientRetry says
// while it fails with a serialization failure or a deadlock (in the handler,
// the claim, a mark or the COMMIT). Each try is a new transaction, so a
// rolled-back try counts no attempt. When the retries are used up, a
// transient handler failure comes back as herr (the caller marks it: it is
// then the handler's failure) and a transient error outside the handler as
// err. HandlerCalled is true when any try ran the handler.
func (s *Store) runAtomic(ctx context.Context, c claimRun) (res dedup.Result, herr, err error) {
	msg := c.msg
	type try struct {
		res       dedup.Result
		herr, err error
	}
	called := false
	last, waitErr := retryWhile(ctx, s.cfg.TransientRetry, s.cfg.Logger, "process "+msg.Identity.String(), dedup.IsTransient, func() (try, error) {
		var t try
		t.res, t.herr, t.err = s.claimAndRun(ctx, c)
		called = called || t.res.HandlerCalled || t.herr != nil
		switch {
		case dedup.IsTransient(t.herr):
			return t, t.herr
		case dedup.IsTransient(t.err):
			return t, t.err
		}
		return t, nil
	})
	if waitErr != nil && !dedup.IsTransient(waitErr) {
		// ctx ended while waiting to retry: nothing of this delivery is
		// durable, and it is not the handler's failure.
		return dedup.Result{HandlerCalled: called}, nil, fmt.Errorf("%w: %w", dedup.ErrOutcomeUnknown, waitErr)
	}
	last.res.HandlerCalled = last.res.HandlerCalled || called
	return last.res, last.herr, wrapUnknown(last.err)
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
func (s *Store) Reject(ctx context.Context, msg *dedup.Message, reason string, cause error) (dedup.Result, error) {
	if cause == nil {
		cause = errors.New(reason)
	}
	sum, keyID, ferr := s.fp.Sum(msg.Payload)
	if ferr != nil {
		sum, keyID = nil, ""
	}
	return s.markFailed(ctx, failure{msg: msg, sum: sum, keyID: keyID, err: dedup.Permanent(cause), finalReason: reason})
}

// record is the view of an existing consumption record: locked (FOR
// UPDATE) when it is PROCESSING or FAILED_RETRYABLE, read without a lock when
// it is terminal (SUCCEEDED, FAILED_FINAL; see terminal).
type record struct {
	id          int64
	messageID   string
	businessKey string
	fingerprint []byte
	keyID       string
	status      dedup.Status
	attempts    int
}

func (r *record) matchedBy(id dedup.Identity) dedup.MatchedBy {
	if r.messageID == id.MessageID {
		return dedup.ByMessageID
	}
	return dedup.ByBusinessKey
}

// claimMode is how a claim inserts a new record.
type claimMode int

const (
	// claimProcessing inserts a new record PROCESSING; the handler's
	// outcome is marked on it afterwards (batched mode).
	claimProcessing claimMode = iota
	// claimSucceeded inserts a new record SUCCEEDED right away (one
	// statement less): only for a caller that commits only when the handler
	// succeeded and that treats a refused commit as the handler's failure
	// (claimAndRun, atomic mode).
	claimSucceeded
)

// claimRun is one message to claim and run the handler for: the message,
// its payload's fingerprint, the handler, and how a new record is inserted.
type claimRun struct {
	msg   *dedup.Message
	sum   []byte // payload fingerprint
	keyID string // the fingerprint's key ID
	h     Handler
	mode  claimMode
	// release: the transaction still holds an earlier message's handler
	// savepoint (batched mode), released in the claim's round trip.
	release bool
	// markAtCommit: the caller sends the success mark of a reclaimed record
	// with its COMMIT (claimAndRun): claimAndRunMark leaves it pending.
	markAtCommit bool
}

// pendingMark is a mark left for the COMMIT (claimRun.markAtCommit): the
// record claimed and the attempts its claim counted, and the handler's
// failure to mark (nil: the success of a reclaimed record). rowID 0: none.
type pendingMark struct {
	rowID    int64
	attempts int
	failed   error
}

// claimAndRun is step 1–3 of atomic mode. It returns the handler's error
// separately (herr) when the handler ran and failed, or is transient, or
// the server refused the COMMIT; the transaction is then already rolled
// back. A COMMIT whose outcome is unknown returns an err wrapping
// ErrOutcomeUnknown with HandlerCalled set.
//
// Round trips: BEGIN travels with the claim (lazyTx), and a reclaimed
// record's success mark, or a handler failure's mark, with the COMMIT
// (commitWith), so that a new message costs 2 round trips plus the
// handler's own, a duplicate 2, a handler failure 2, and a retry of a
// FAILED_RETRYABLE record 3 (the reclaim needs the claim's answer first).
func (s *Store) claimAndRun(ctx context.Context, c claimRun) (res dedup.Result, herr error, err error) {
	bctx, cancel := s.bound(ctx) // the pool may dial
	tx, err := beginLazy(bctx, s.pool, s.cfg.TxOptions)
	cancel()
	if err != nil {
		return dedup.Result{}, nil, fmt.Errorf("idemq: begin: %w", err)
	}
	defer s.rollback(ctx, tx)
	c.markAtCommit = true
	res, pend, herr, err := s.claimAndRunMark(ctx, tx, c)
	if err != nil || herr != nil {
		s.rollback(ctx, tx)
		return res, herr, err
	}
	// The handler has returned: what is left (marks, COMMIT) is idemq's.
	ctx, cancel = s.bound(ctx)
	defer cancel()
	if pend.failed != nil {
		return s.commitClaimedFailure(ctx, tx, c, pend)
	}
	var cerr error
	ended := true
	if pend.rowID == 0 {
		cerr = tx.Commit(ctx)
	} else {
		b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 2)}
		b.Queue(s.q.recordMarkSucceededAtCommitSQL, pend.rowID, *s.expiry(dedup.StatusSucceeded))
		ended, cerr = tx.commitWith(ctx, b, nil)
	}
	if cerr != nil && !ended {
		// The mark failed and the server skipped the COMMIT behind it: the
		// handler left the transaction unusable (for example it swallowed
		// an error and went on). That is a handler failure, marked in this
		// transaction after its savepoint, as when the mark ran alone.
		res, herr, err = s.handlerFailed(ctx, tx, c, pend, fmt.Errorf("idemq: mark succeeded: %w", cerr))
		if err != nil || herr != nil {
			s.rollback(ctx, tx)
			return res, herr, err
		}
		cerr = tx.Commit(ctx)
	}
	if cerr != nil {
		called := dedup.Result{HandlerCalled: res.HandlerCalled, Attempts: res.Attempts}
		switch commitFailureClass(cerr) {
		case dedup.FailureOutcomeUnknown:
			// The connection was lost or terminated at COMMIT: it may or may
			// not have committed. Not the handler's failure: count and mark
			// nothing; the next copy finds the truth.
			return called, nil, fmt.Errorf("%w: commit: %w", dedup.ErrOutcomeUnknown, cerr)
		case dedup.FailureTransient:
			if res.HandlerCalled {
				return called, fmt.Errorf("idemq: commit: %w", cerr), nil
			}
			return called, nil, fmt.Errorf("idemq: commit: %w", cerr)
		}
		if res.HandlerCalled {
			// The server refused the commit: the handler left the
			// transaction aborted, or a deferred constraint of its writes
			// failed. That is the handler's failure, marked like any other.
			return called, fmt.Errorf("idemq: commit refused: %w", cerr), nil
		}
		return dedup.Result{}, nil, fmt.Errorf("idemq: commit: %w", cerr)
	}
	return res, nil, nil
}

// claimAndRunIn claims msg in tx, decides, and runs h in tx when the record
// must be processed; it marks SUCCEEDED, or the failure, but does not commit.
// herr is set only when a handler failure could not be marked in tx (the
// transaction is unusable), or is transient (FailureTransient: the whole
// transaction must be retried): the caller must then roll back, and retry or
// markFailed in a new transaction. On err the caller must roll back; an err
// wrapping ErrOutcomeUnknown (ctx ended, connection lost while the handler
// ran) comes with HandlerCalled set. c.mode says how a new record is
// inserted (see claimMode).
func (s *Store) claimAndRunIn(ctx context.Context, tx pgx.Tx, c claimRun) (res dedup.Result, herr error, err error) {
	c.markAtCommit = false
	res, _, herr, err = s.claimAndRunMark(ctx, tx, c)
	return res, herr, err
}

// claimAndRunMark is claimAndRunIn, except that with c.markAtCommit the
// success mark of a reclaimed record is not sent but returned in pend, for
// the caller to send with its COMMIT.
func (s *Store) claimAndRunMark(ctx context.Context, tx pgx.Tx, c claimRun) (res dedup.Result, pend pendingMark, herr error, err error) {
	msg, sum := c.msg, c.sum
	id := msg.Identity
	// The claim (with BEGIN), the decision and the reclaim are idemq's own
	// steps: bounded by StatementTimeout; the handler gets ctx.
	cctx, cancel := s.bound(ctx)
	defer cancel()
	rowID, rec, err := s.claim(cctx, tx, c)
	attempts := 1
	if err != nil {
		return dedup.Result{}, pend, nil, err
	}
	if rec != nil {
		// Someone else's record (or our own earlier one) decides.
		res, run, err := s.decide(cctx, tx, msg, sum, rec)
		if err != nil || !run {
			return res, pend, nil, err
		}
		rowID = rec.id
		// The claim's savepoint is behind the reclaim's update: it is
		// replaced (released, then set again) in the reclaim's round trip,
		// so that the handler's rollback keeps the reclaim and savepoints
		// never nest.
		if attempts, err = s.q.reclaimReset(cctx, tx, rec.id, msg); err != nil {
			return dedup.Result{}, pend, nil, err
		}
	}
	cancel()

	// The handler runs after a savepoint (set with the claim): when it fails,
	// its writes roll back alone and the failure is marked in this same
	// transaction, still holding the record's row lock, so no other copy can
	// slip in between.
	msg.Attempt = attempts
	herr = runHandler(ctx, tx, msg, c.h)
	processed := dedup.Result{Outcome: dedup.OutcomeProcessed, Status: dedup.StatusSucceeded, Attempts: attempts, HandlerCalled: true}
	if herr == nil && c.mode == claimSucceeded && rec == nil {
		return processed, pend, nil, nil
	}
	if herr == nil && c.markAtCommit {
		return processed, pendingMark{rowID: rowID, attempts: attempts}, nil, nil
	}
	if herr == nil {
		mctx, cancel := s.bound(ctx)
		err := s.q.markSucceeded(mctx, tx, id, rowID, *s.expiry(dedup.StatusSucceeded))
		cancel()
		if err == nil {
			return processed, pend, nil, nil
		}
		// The handler left the transaction unusable (for example it
		// swallowed an error and went on): that is a handler failure.
		herr = fmt.Errorf("idemq: mark succeeded: %w", err)
	}
	at := pendingMark{rowID: rowID, attempts: attempts}
	if conn := tx.Conn(); c.markAtCommit && conn != nil && !conn.IsClosed() {
		// A connection closed under the handler (its own deadline) cannot
		// mark: handlerFailed hands the failure to a new transaction.
		switch handlerFailureClass(ctx, tx, herr) {
		case dedup.FailureHandler, dedup.FailurePermanent:
			// Marked with the COMMIT, by the caller (commitClaimedFailure).
			at.failed = herr
			return dedup.Result{HandlerCalled: true, Attempts: attempts}, at, nil, nil
		}
	}
	res, herr, err = s.handlerFailed(ctx, tx, c, at, herr)
	return res, pend, herr, err
}

// handlerFailed handles herr, a failure of the handler that ran for c on
// the record at.rowID (its claim counted at.attempts) in tx, as
// claimAndRunIn documents: outcome unknown (err), transient (herr: retry the
// whole transaction), or marked in tx after the handler's savepoint is
// rolled back (res; herr when tx is unusable and the caller must mark in a
// new transaction).
func (s *Store) handlerFailed(ctx context.Context, tx pgx.Tx, c claimRun, at pendingMark, herr error) (res dedup.Result, _ error, err error) {
	called := dedup.Result{HandlerCalled: true, Attempts: at.attempts}
	switch handlerFailureClass(ctx, tx, herr) {
	case dedup.FailureOutcomeUnknown:
		// A shutdown, or the connection lost under the handler, is not the
		// message's fault: mark nothing; the caller rolls back and the
		// broker redelivers.
		return called, nil, fmt.Errorf("%w: handler's transaction lost (shutdown or connection closed): %w", dedup.ErrOutcomeUnknown, errors.Join(ctx.Err(), herr))
	case dedup.FailureTransient:
		// A serialization failure or deadlock dooms the transaction (under
		// serializable isolation a savepoint does not help): the caller
		// retries it whole, counting nothing.
		return called, herr, nil
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if _, err := tx.Exec(ctx, s.q.handlerRollbackSQL); err != nil {
		return called, herr, nil // transaction unusable: the caller marks in a new one
	}
	res, err = s.markClaimedFailed(ctx, tx, claimedFailure{rowID: at.rowID, attempts: at.attempts, msg: c.msg, sum: c.sum, err: herr})
	if err != nil {
		return called, herr, nil
	}
	return res, nil, nil
}

// claimedFailure is a handler failure on the record this transaction
// claimed: its row id, the attempts the claim counted, the message and its
// payload fingerprint, and the handler's error.
type claimedFailure struct {
	rowID    int64
	attempts int
	msg      *dedup.Message
	sum      []byte
	err      error
}

// markClaimedFailed marks the record this transaction claimed (attempts
// already counted by the claim) FAILED_RETRYABLE, or FAILED_FINAL with a dead
// letter when the error is permanent or the attempts are used up.
func (s *Store) markClaimedFailed(ctx context.Context, tx pgx.Tx, f claimedFailure) (dedup.Result, error) {
	m, dl, res := s.planClaimedFailure(f)
	if err := s.q.updateFailed(ctx, tx, m); err != nil {
		return dedup.Result{}, err
	}
	if dl != nil {
		var err error
		if res.DeadLetterID, err = s.q.insertDeadLetter(ctx, tx, *dl); err != nil {
			return dedup.Result{}, err
		}
	}
	return res, nil
}

// planClaimedFailure is what markClaimedFailed writes for f: the record's
// mark, the dead letter when the failure is final (nil otherwise), and the
// result (its DeadLetterID still to be filled in).
func (s *Store) planClaimedFailure(f claimedFailure) (failureMark, *deadLetterRow, dedup.Result) {
	herr, attempts := f.err, f.attempts
	status, reason := dedup.StatusFailedRetryable, dedup.ReasonAttemptsExhausted
	switch {
	case dedup.IsPermanent(herr):
		status, reason = dedup.StatusFailedFinal, dedup.ReasonPermanentError
	case attempts >= s.cfg.MaxAttempts:
		status = dedup.StatusFailedFinal
	}
	m := failureMark{rowID: f.rowID, status: status, attempt: attemptCounted, msg: f.msg,
		errText: clip(herr.Error(), s.cfg.MaxErrorBytes), errClass: dedup.ErrorClass(herr), expirySecs: s.expiry(status)}
	res := dedup.Result{Outcome: dedup.OutcomeRetry, Status: status, Attempts: attempts, HandlerCalled: true, Err: herr}
	if status != dedup.StatusFailedFinal {
		return m, nil, res
	}
	res.Outcome, res.Reason = dedup.OutcomeDeadLetter, reason
	return m, &deadLetterRow{msg: f.msg, sum: f.sum, reason: reason, cause: herr, attempts: attempts}, res
}

// claim inserts a PROCESSING (claimSucceeded: SUCCEEDED) record with
// attempts 1 (returning its row id), or, when either unique key already
// exists, returns the existing record: read without a lock when it is
// terminal, locked FOR UPDATE otherwise (see claimInsert).
func (s *Store) claim(ctx context.Context, tx pgx.Tx, c claimRun) (int64, *record, error) {
	msg := c.msg
	r := newRecord{msg: msg, sum: c.sum, keyID: c.keyID, status: dedup.StatusProcessing, attempts: 1}
	if c.mode == claimSucceeded {
		r.status, r.expirySecs = dedup.StatusSucceeded, s.expiry(dedup.StatusSucceeded)
	}
	release := c.release
	for try := 0; try < 3; try++ {
		rowID, rec, err := s.q.claimInsert(ctx, tx, r, release)
		if err != nil || rowID != 0 || rec != nil {
			return rowID, rec, err
		}
		release = true // this try set a savepoint of its own
		// The conflicting record vanished between the two statements
		// (purged), or became terminal while the claim waited for its lock
		// (another copy finished it): claim again, and read it as it is.
	}
	return 0, nil, fmt.Errorf("idemq: claim %s: record keeps vanishing", msg.Identity)
}

// decide applies the state machine to an existing record: locked, or
// terminal and read without a lock (then it answers a duplicate or a
// conflict, and never runs the handler). run reports whether the handler
// must run (the record was FAILED_RETRYABLE, and is locked).
func (s *Store) decide(ctx context.Context, tx pgx.Tx, msg *dedup.Message, sum []byte, rec *record) (res dedup.Result, run bool, err error) {
	id := msg.Identity
	by := rec.matchedBy(id)
	res = dedup.Result{MatchedBy: by, Status: rec.status, Attempts: rec.attempts}
	if len(rec.fingerprint) == 0 && rec.status == dedup.StatusFailedRetryable && by == dedup.ByMessageID {
		// Bad input rejected before its payload could be fingerprinted
		// (Reject), re-driven since: this copy gives the record its
		// fingerprint and runs the handler.
		if _, err := tx.Exec(ctx, s.q.recordSetFingerprintSQL, rec.id, sum, s.fp.CurrentKeyID()); err != nil {
			return dedup.Result{}, false, fmt.Errorf("idemq: fingerprint re-driven record %s: %w", id, err)
		}
		return res, true, nil
	}
	same, cause := s.fp.Matches(msg.Payload, rec.fingerprint, rec.keyID)
	if cause != nil || !same {
		res, err = s.conflictIn(ctx, tx, msg, sum, rec, res, cause)
		return res, false, err
	}
	switch rec.status {
	case dedup.StatusSucceeded, dedup.StatusFailedFinal:
		res.Outcome = dedup.OutcomeDuplicate
		return res, false, nil
	case dedup.StatusFailedRetryable:
		return res, true, nil
	default:
		// PROCESSING committed by a lease-mode owner; atomic mode never
		// commits it. Leave it to its owner: retry later.
		res.Outcome, res.Err = dedup.OutcomeRetry, fmt.Errorf("idemq: %s is being processed by another owner", id)
		return res, false, nil
	}
}

// conflictIn answers a copy of msg whose fingerprint does not match rec's
// (or could not be compared: cause): res (MatchedBy, Status, Attempts set by
// the caller) becomes OutcomeConflict with a *dedup.ConflictError, and a
// dead letter of the reason dedup.ConflictReason gives is inserted in tx.
// The MQ path (decide) and the HTTP path (HTTPStore) share it.
func (s *Store) conflictIn(ctx context.Context, tx pgx.Tx, msg *dedup.Message, sum []byte, rec *record, res dedup.Result, cause error) (dedup.Result, error) {
	id := msg.Identity
	reason := dedup.ConflictReason(res.MatchedBy, id.BusinessKey, rec.businessKey)
	cerr := &dedup.ConflictError{Reason: reason, Identity: id, MatchedBy: res.MatchedBy, Cause: cause,
		Record: dedup.Identity{Scope: id.Scope, MessageID: rec.messageID, BusinessKey: rec.businessKey}}
	res.Outcome, res.Err, res.Reason = dedup.OutcomeConflict, cerr, reason
	var err error
	res.DeadLetterID, err = s.q.insertDeadLetter(ctx, tx, deadLetterRow{msg: msg, sum: sum, reason: reason, cause: cerr, attempts: rec.attempts})
	return res, err
}

// failure is a failed execution, or a rejection, to mark on msg's record.
type failure struct {
	msg   *dedup.Message
	sum   []byte // payload fingerprint; nil when it has none (bad input)
	keyID string // the fingerprint's key ID
	err   error  // the handler's error, or the rejection's cause
	// finalReason is the dead-letter reason used when retries are
	// exhausted; ReasonAttemptsExhausted means the handler ran.
	finalReason string
}

// markFailed records a failed execution (or a rejection) in its own short
// transaction after the handler's transaction rolled back.
func (s *Store) markFailed(ctx context.Context, f failure) (dedup.Result, error) {
	msg := f.msg
	ctx, cancel := s.detach(ctx) // the mark must land even during shutdown, within StatementTimeout
	defer cancel()
	// A deadlock or serialization failure of the mark is retried at once;
	// the mark counts its attempt only when it commits.
	return retryWhile(ctx, s.cfg.TransientRetry, s.cfg.Logger, "mark failed "+msg.Identity.String(), dedup.IsTransient, func() (dedup.Result, error) {
		// BEGIN travels with the mark's claim (lazyTx).
		tx, err := beginLazy(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
		if err != nil {
			return dedup.Result{}, fmt.Errorf("idemq: begin mark failed: %w", err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		res, err := s.markFailedIn(ctx, tx, f)
		if err != nil {
			return dedup.Result{}, err
		}
		return res, commit(ctx, tx)
	})
}

// markFailedIn is markFailed's work inside tx (no commit).
func (s *Store) markFailedIn(ctx context.Context, tx pgx.Tx, f failure) (dedup.Result, error) {
	msg, sum, keyID, herr, finalReason := f.msg, f.sum, f.keyID, f.err, f.finalReason
	permanent := dedup.IsPermanent(herr)
	reason := finalReason
	if permanent && finalReason == dedup.ReasonAttemptsExhausted {
		reason = dedup.ReasonPermanentError
	}
	if sum == nil {
		sum, keyID = []byte{}, s.fp.CurrentKeyID()
	}
	errText, class := clip(herr.Error(), s.cfg.MaxErrorBytes), dedup.ErrorClass(herr)
	status := dedup.StatusFailedRetryable
	if permanent || s.cfg.MaxAttempts <= 1 {
		status = dedup.StatusFailedFinal
	}
	res := dedup.Result{HandlerCalled: finalReason == dedup.ReasonAttemptsExhausted, Err: herr}
	// A terminal record is answered from the claim's read, never locked
	// (nor waited for); any other is locked and read again under the lock.
	rowID, rec, err := s.q.claimRecord(ctx, tx, newRecord{msg: msg, sum: sum, keyID: keyID, status: status, attempts: 1,
		errText: errText, errClass: class, expirySecs: s.expiry(status)})
	if err != nil {
		return dedup.Result{}, err
	}
	res.Attempts = 1
	if rowID == 0 {
		live := false
		if rec == nil || !terminal(rec.status) {
			if rec, live, err = s.q.lockLease(ctx, tx, msg.Identity); err != nil {
				return dedup.Result{}, err
			}
		}
		if rec == nil {
			return dedup.Result{}, fmt.Errorf("idemq: mark failed %s: record vanished", msg.Identity)
		}
		if rec.status == dedup.StatusProcessing && live {
			// A lease-mode owner is running this record now: marking it
			// would fence the owner after its side effect. The copy is
			// not acked and finds the owner's outcome when redelivered,
			// as in the Redis-only store.
			return dedup.Result{Outcome: dedup.OutcomeRetry, Err: dedup.ErrLeaseHeld, Status: rec.status, Attempts: rec.attempts,
				MatchedBy: rec.matchedBy(msg.Identity), HandlerCalled: res.HandlerCalled}, nil
		}
		if rec.status == dedup.StatusSucceeded || rec.status == dedup.StatusFailedFinal {
			// Another copy finished meanwhile: this delivery is a duplicate.
			return dedup.Result{Outcome: dedup.OutcomeDuplicate, MatchedBy: rec.matchedBy(msg.Identity), Status: rec.status, Attempts: rec.attempts, HandlerCalled: res.HandlerCalled}, nil
		}
		res.Attempts = rec.attempts + 1
		if res.Attempts >= s.cfg.MaxAttempts {
			status = dedup.StatusFailedFinal
		}
		if err := s.q.updateFailed(ctx, tx, failureMark{rowID: rec.id, status: status, attempt: attemptNew, msg: msg,
			errText: errText, errClass: class, expirySecs: s.expiry(status)}); err != nil {
			return dedup.Result{}, err
		}
	}
	res.Status = status
	res.Outcome = dedup.OutcomeRetry
	if status == dedup.StatusFailedFinal {
		res.Outcome, res.Reason = dedup.OutcomeDeadLetter, reason
		if res.DeadLetterID, err = s.q.insertDeadLetter(ctx, tx, deadLetterRow{msg: msg, sum: sum, reason: reason, cause: herr, attempts: res.Attempts}); err != nil {
			return dedup.Result{}, err
		}
	}
	return res, nil
}

// expiry returns the retention of a status in seconds (nil: never expires).
func (s *Store) expiry(status dedup.Status) *float64 {
	var d float64
	switch status {
	case dedup.StatusSucceeded:
		d = s.cfg.SucceededRetention.Seconds()
	case dedup.StatusFailedFinal:
		d = s.cfg.FailedFinalRetention.Seconds()
	default:
		return nil
	}
	return &d
}

// runHandler runs h for msg on tx, watched (causeTx): its error, a
// recovered panic, or the transaction it left aborted, explained by the
// statement that aborted it (causeTx.explain).
func runHandler(ctx context.Context, tx pgx.Tx, msg *dedup.Message, h Handler) (err error) {
	ct := watchCause(tx)
	defer func() {
		if v := recover(); v != nil {
			err = &dedup.PanicError{Value: v}
		}
		err = ct.explain(err, tx)
	}()
	return h(ctx, ct, msg)
}

func commit(ctx context.Context, tx pgx.Tx) error {
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("idemq: commit: %w", err)
	}
	return nil
}

// clip makes s storable in a text column (see pgtext.Clip).
func clip(s string, n int) string { return pgtext.Clip(s, n) }
