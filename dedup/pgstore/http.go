package pgstore

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/namedsql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// httpSQLFS holds the statements of HTTP requests, apart from sql/*.sql so
// that a Store that serves no HTTP request binds none of them.
//
//go:embed httpsql/*.sql
var httpSQLFS embed.FS

var httpStatements = namedsql.MustParseFS(httpSQLFS, "httpsql/*.sql")

// HTTPStore runs HTTP requests that carry an Idempotency-Key on a Store's
// consumption records, dead letters and stored-response table (migration
// 006, applied by Store.Migrate). It is the store side of package httpidem,
// which builds one per middleware: use httpidem, not this type, in
// services. Safe for concurrent use.
type HTTPStore struct {
	s *Store

	lockTimeoutSQL, lockTimeoutResetSQL, keyLockSQL, keyTryLockSQL, unfinishedCountSQL, readSQL, upsertSQL, recordIDSQL, storedByIdentitySQL,
	upsertLeasedSQL, inspectSQL string
}

// NewHTTPStore returns the HTTPStore of s. It fails only when the code and
// httpsql/*.sql disagree (a bug, caught by every test).
func NewHTTPStore(s *Store) (*HTTPStore, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: store is nil", dedup.ErrInvalidConfig)
	}
	h := &HTTPStore{s: s}
	err := httpStatements.Bind(s.q.tables, map[string]*string{
		"http_lock_timeout":       &h.lockTimeoutSQL,
		"http_lock_timeout_reset": &h.lockTimeoutResetSQL,
		"http_key_lock":           &h.keyLockSQL,
		"http_key_try_lock":       &h.keyTryLockSQL,
		"http_unfinished_count":   &h.unfinishedCountSQL,
		"http_read":               &h.readSQL,
		"http_upsert":             &h.upsertSQL,
		"http_record_id":          &h.recordIDSQL,
		"http_stored_by_identity": &h.storedByIdentitySQL,
		"http_upsert_leased":      &h.upsertLeasedSQL,
		"http_inspect":            &h.inspectSQL,
	})
	if err != nil {
		return nil, fmt.Errorf("idemq: http statements: %w", err)
	}
	return h, nil
}

// Store returns the Store h runs on.
func (h *HTTPStore) Store() *Store { return h.s }

// HTTPRequest is one request to run with HTTPStore.Process.
type HTTPRequest struct {
	// Message carries the identity (scope; message ID = the
	// Idempotency-Key) and, for dead letters, the canonical request as
	// Payload, the route as Topic, and Source and Headers for audit.
	Message *dedup.Message
	// Principal is the key of the unfinished-records cap (tenant and
	// principal).
	Principal string
	// Sum and KeyID are the request's fingerprint under the current
	// fingerprint key, made with canonicalization version CanonVersion.
	Sum          []byte
	KeyID        string
	CanonVersion int
	// Matches reports whether the request has fingerprint sum under key
	// keyID when its body is canonicalized with version canonVersion (the
	// ones stored with an existing record). An error is a conflict.
	Matches func(canonVersion int, sum []byte, keyID string) (bool, error)
	// LockWait is how long the request waits for a concurrent request with
	// the same identity (its transaction holds the key's advisory lock)
	// before it is answered HTTPInFlight. 0: not at all. Rounded up to
	// whole milliseconds (Postgres's lock_timeout).
	LockWait time.Duration
	// MaxUnfinished is the cap on unfinished records of Principal
	// touched within UnfinishedWindow; a new key beyond it is refused
	// (HTTPTooManyUnfinished).
	MaxUnfinished    int
	UnfinishedWindow time.Duration
}

// HTTPResponse is a final response as stored: its status and the encoded
// (possibly sealed) response with the sealing key's ID ("" = not sealed).
type HTTPResponse struct {
	Status   int
	Stored   []byte
	SealedBy string
}

// HTTPHandler runs a request's handler in tx, the transaction that holds
// the record, for the attempt-th time. It returns the final response to
// store, or an error: a retryable failure (a non-final status, a panic
// recovered by the caller, a failed statement), or dedup.Permanent(err) for
// a final failure without a stored response.
type HTTPHandler func(ctx context.Context, tx pgx.Tx, attempt int) (HTTPResponse, error)

// HTTPOutcome is what HTTPStore.Process did with a request.
type HTTPOutcome string

// HTTPStore.Process outcomes.
const (
	// HTTPExecuted: the handler ran; its response, writes and the record
	// (SUCCEEDED) committed together.
	HTTPExecuted HTTPOutcome = "executed"
	// HTTPReplayed: the record had SUCCEEDED with the same fingerprint;
	// HTTPResult.Response is the stored response.
	HTTPReplayed HTTPOutcome = "replayed"
	// HTTPConflict: the record holds another fingerprint; a dead letter
	// (payload_conflict) keeps the request; nothing else changed.
	HTTPConflict HTTPOutcome = "conflict"
	// HTTPInFlight: another transaction holds the key (LockWait ran
	// out), or a lease-mode owner holds the record.
	HTTPInFlight HTTPOutcome = "in_flight"
	// HTTPTooManyUnfinished: a new key beyond MaxUnfinished; nothing
	// written.
	HTTPTooManyUnfinished HTTPOutcome = "too_many_unfinished"
	// HTTPFailed: the handler failed; its writes rolled back and the
	// record is FAILED_RETRYABLE (attempt counted), or FAILED_FINAL with a
	// dead letter when the attempts are used up or the error is permanent
	// (HTTPResult.Result says which).
	HTTPFailed HTTPOutcome = "failed"
	// HTTPExhausted: the record is FAILED_FINAL; the handler did not run.
	HTTPExhausted HTTPOutcome = "exhausted"
)

// HTTPResult is the outcome of HTTPStore.Process.
type HTTPResult struct {
	Outcome HTTPOutcome
	// Result is the record-level result (status, attempts,
	// HandlerCalled, Err for a failure or conflict).
	Result dedup.Result
	// Response is the stored response (HTTPReplayed) or the one just
	// stored (HTTPExecuted).
	Response HTTPResponse
}

// Process runs one HTTP request in atomic mode: in one transaction it
// takes the identity's advisory lock (waiting at most LockWait for a
// concurrent request with the same key), claims the record, decides (new; replay; conflict, compared under the
// record's stored canonicalization version; retry of a retryable
// failure), runs hd in the same transaction, and commits the record, the
// handler's writes and the stored response together. A handler failure
// rolls back to the savepoint set with the claim and marks the record in
// the same transaction (its attempt counted). Serialization failures and
// deadlocks are retried whole as Config.TransientRetry says. The record
// and its stored response are read in one snapshot: a record the purge
// deletes meanwhile is replayed as it was, or, once gone, claimed again
// and run as new.
//
// A non-nil error means nothing is known to be durable (database
// unreachable, ctx ended, connection lost at COMMIT: wraps
// dedup.ErrOutcomeUnknown); the request may be retried with the same key.
// Callers pass a ctx that the client cannot cancel.
func (h *HTTPStore) Process(ctx context.Context, req HTTPRequest, hd HTTPHandler) (HTTPResult, error) {
	if req.Message == nil || hd == nil || req.Matches == nil {
		return HTTPResult{}, errors.New("idemq: HTTPStore.Process: nil message, handler or Matches")
	}
	if err := dedup.ValidateScope(req.Message.Identity.Scope); err != nil || req.Message.Identity.MessageID == "" {
		return HTTPResult{}, fmt.Errorf("idemq: HTTPStore.Process: identity not set: %w", errors.Join(err, dedup.ErrEmptyMessageID))
	}
	s := h.s
	called := false
	res, err := retryWhile(ctx, s.cfg.TransientRetry, s.cfg.Logger, "http "+req.Message.Identity.String(), dedup.IsTransient, func() (HTTPResult, error) {
		r, err := h.try(ctx, req, hd)
		called = called || r.Result.HandlerCalled
		return r, err
	})
	res.Result.HandlerCalled = res.Result.HandlerCalled || called
	if err != nil {
		return res, wrapUnknown(err)
	}
	return res, nil
}

// errHTTPRefused is a handler transaction that could not be finished in
// place (the handler left it unusable, or the COMMIT was refused): its
// failure is marked in a new transaction.
type errHTTPRefused struct{ err error }

func (e errHTTPRefused) Error() string { return e.err.Error() }
func (e errHTTPRefused) Unwrap() error { return e.err }

// try is one transaction of Process.
func (h *HTTPStore) try(ctx context.Context, req HTTPRequest, hd HTTPHandler) (HTTPResult, error) {
	s, msg := h.s, req.Message
	// One request per identity at a time: a transaction-level advisory
	// lock, taken before the claim, waited for at most LockWait (its
	// lock_timeout is set with BEGIN, in its round trip: a simple-protocol
	// query of two statements; the store's TxOptions were validated by
	// New: an isolation level, read write, no custom queries).
	opts := pgx.TxOptions{BeginQuery: "begin isolation level " + string(s.cfg.TxOptions.IsoLevel) + " read write"}
	if req.LockWait > 0 {
		ms := (req.LockWait + time.Millisecond - 1) / time.Millisecond
		opts.BeginQuery += "; " + strings.Replace(h.lockTimeoutSQL, "$1", "'"+strconv.FormatInt(int64(ms), 10)+"ms'", 1)
	}
	tx, err := s.pool.BeginTx(ctx, opts)
	if err != nil {
		return HTTPResult{}, fmt.Errorf("idemq: begin: %w", err)
	}
	defer s.rollback(ctx, tx)
	held, unfinished, err := h.lockKey(ctx, tx, req)
	if err != nil {
		return HTTPResult{}, err
	}
	if !held {
		return HTTPResult{Outcome: HTTPInFlight, Result: dedup.Result{Outcome: dedup.OutcomeRetry, Err: dedup.ErrLeaseHeld}}, nil
	}
	claim := claimRun{msg: msg, sum: req.Sum, keyID: req.KeyID, mode: claimProcessing}
	rowID, rec, err := s.claim(ctx, tx, claim)
	if err != nil {
		return HTTPResult{}, err
	}
	// The record and its stored part are read again in one statement: a
	// terminal record comes from the claim's read without a lock, and the
	// purge may delete it (and, by cascade, its stored response) before
	// this read. A record gone by then is claimed again: the key is new
	// now, and the request runs as new (once: this transaction holds the
	// key's lock).
	var stored httpStored
	for gone := 0; rec != nil; gone++ {
		raceHook("http claimed", msg.Identity)
		if stored, err = h.read(ctx, tx, rec.id); err != nil {
			return HTTPResult{}, err
		}
		if stored.record {
			break
		}
		if gone == 2 {
			return HTTPResult{}, fmt.Errorf("idemq: http %s: record keeps vanishing", msg.Identity)
		}
		claim.release = true // the claim set the handler's savepoint
		if rowID, rec, err = s.claim(ctx, tx, claim); err != nil {
			return HTTPResult{}, err
		}
	}
	attempts := 1
	if rec == nil {
		if unfinished >= req.MaxUnfinished {
			return HTTPResult{Outcome: HTTPTooManyUnfinished}, nil // rolled back: nothing written
		}
	} else {
		version := req.CanonVersion
		if stored.found {
			version = stored.version
		}
		res := dedup.Result{MatchedBy: rec.matchedBy(msg.Identity), Status: rec.status, Attempts: rec.attempts}
		same, cause := req.Matches(version, rec.fingerprint, rec.keyID)
		if cause != nil || !same {
			if res, err = s.conflictIn(ctx, tx, msg, req.Sum, rec, res, cause); err != nil {
				return HTTPResult{}, err
			}
			if err := commit(ctx, tx); err != nil {
				return HTTPResult{}, err
			}
			return HTTPResult{Outcome: HTTPConflict, Result: res}, nil
		}
		switch rec.status {
		case dedup.StatusSucceeded:
			if !stored.found || stored.status == 0 {
				return HTTPResult{}, fmt.Errorf("idemq: http %s: SUCCEEDED record %d has no stored response", msg.Identity, rec.id)
			}
			res.Outcome = dedup.OutcomeDuplicate
			return HTTPResult{Outcome: HTTPReplayed, Result: res, Response: HTTPResponse{Status: stored.status, Stored: stored.response, SealedBy: stored.keyID}}, nil
		case dedup.StatusFailedFinal:
			res.Outcome = dedup.OutcomeDuplicate
			return HTTPResult{Outcome: HTTPExhausted, Result: res}, nil
		case dedup.StatusProcessing:
			res.Outcome, res.Err = dedup.OutcomeRetry, dedup.ErrLeaseHeld
			return HTTPResult{Outcome: HTTPInFlight, Result: res}, nil
		}
		// FAILED_RETRYABLE, locked by the claim: run again.
		rowID = rec.id
		if attempts, err = s.q.reclaimReset(ctx, tx, rec.id, msg); err != nil {
			return HTTPResult{}, err
		}
		req.CanonVersion = version // the record keeps its version
	}

	msg.Attempt = attempts
	// The handler's statements are watched, so that a failure it swallowed
	// is recorded as the cause (causeTx.explain).
	htx := watchCause(tx)
	resp, herr := hd(ctx, htx, attempts)
	herr = htx.explain(herr, tx)
	res := dedup.Result{HandlerCalled: true, Attempts: attempts}
	if herr == nil {
		if err := h.finish(ctx, tx, rowID, req, resp); err != nil {
			herr = errHTTPRefused{fmt.Errorf("idemq: mark succeeded: %w", err)}
		} else if err := tx.Commit(ctx); err != nil {
			switch commitFailureClass(err) {
			case dedup.FailureOutcomeUnknown:
				return HTTPResult{Result: res}, fmt.Errorf("%w: commit: %w", dedup.ErrOutcomeUnknown, err)
			case dedup.FailureTransient:
				return HTTPResult{Result: res}, fmt.Errorf("idemq: commit: %w", err)
			}
			return h.failInNewTx(ctx, req, attempts, fmt.Errorf("idemq: commit refused: %w", err))
		} else {
			res.Outcome, res.Status = dedup.OutcomeProcessed, dedup.StatusSucceeded
			return HTTPResult{Outcome: HTTPExecuted, Result: res, Response: resp}, nil
		}
	}
	switch handlerFailureClass(ctx, tx, herr) {
	case dedup.FailureOutcomeUnknown:
		return HTTPResult{Result: res}, fmt.Errorf("%w: handler's transaction lost: %w", dedup.ErrOutcomeUnknown, errors.Join(ctx.Err(), herr))
	case dedup.FailureTransient:
		return HTTPResult{Result: res}, herr
	}
	var refused errHTTPRefused
	if !errors.As(herr, &refused) {
		if _, err := tx.Exec(ctx, s.q.handlerRollbackSQL); err == nil {
			mres, err := s.markClaimedFailed(ctx, tx, claimedFailure{rowID: rowID, attempts: attempts, msg: msg, sum: req.Sum, err: herr})
			if err == nil {
				err = h.upsertFailed(ctx, tx, rowID, req, mres.Status)
			}
			if err == nil {
				err = commit(ctx, tx)
			}
			if err == nil {
				return HTTPResult{Outcome: HTTPFailed, Result: mres}, nil
			}
		}
	}
	s.rollback(ctx, tx)
	return h.failInNewTx(ctx, req, attempts, herr)
}

// failInNewTx marks a handler failure after its transaction rolled back
// whole (the handler left it unusable, or the COMMIT was refused): a new
// transaction counts the attempt (the rolled-back claim did not) and marks
// the record, creating it when the rollback took a new one with it.
func (h *HTTPStore) failInNewTx(ctx context.Context, req HTTPRequest, attempts int, herr error) (HTTPResult, error) {
	s, msg := h.s, req.Message
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return HTTPResult{Result: dedup.Result{HandlerCalled: true, Attempts: attempts}}, fmt.Errorf("idemq: begin mark failed: %w", err)
	}
	defer s.rollback(ctx, tx)
	mres, err := s.markFailedIn(ctx, tx, failure{msg: msg, sum: req.Sum, keyID: req.KeyID, err: herr, finalReason: dedup.ReasonAttemptsExhausted})
	if err != nil {
		return HTTPResult{Result: dedup.Result{HandlerCalled: true, Attempts: attempts}}, err
	}
	mres.HandlerCalled = true
	var rowID int64
	if err := tx.QueryRow(ctx, h.recordIDSQL, msg.Identity.Scope, msg.Identity.MessageID).Scan(&rowID); err != nil {
		return HTTPResult{Result: mres}, fmt.Errorf("idemq: http record id: %w", err)
	}
	if mres.Outcome == dedup.OutcomeRetry || mres.Outcome == dedup.OutcomeDeadLetter {
		if err := h.upsertFailed(ctx, tx, rowID, req, mres.Status); err != nil {
			return HTTPResult{Result: mres}, err
		}
	}
	if err := commit(ctx, tx); err != nil {
		return HTTPResult{Result: mres}, err
	}
	if mres.Outcome == dedup.OutcomeDuplicate {
		// Another copy finished the record meanwhile: answer from it.
		return HTTPResult{Outcome: HTTPInFlight, Result: mres}, nil
	}
	return HTTPResult{Outcome: HTTPFailed, Result: mres}, nil
}

// finish marks the record SUCCEEDED and stores resp, in one round trip.
func (h *HTTPStore) finish(ctx context.Context, tx pgx.Tx, rowID int64, req HTTPRequest, resp HTTPResponse) error {
	b := &pgx.Batch{}
	b.Queue(h.s.q.recordMarkSucceededSQL, rowID, *h.s.expiry(dedup.StatusSucceeded))
	b.Queue(h.upsertSQL, rowID, req.Principal, req.CanonVersion, false, resp.Status, resp.Stored, resp.SealedBy)
	br := tx.SendBatch(ctx, b)
	tag, err := br.Exec()
	if err == nil && tag.RowsAffected() != 1 {
		err = fmt.Errorf("idemq: mark succeeded %s: %d records in PROCESSING", req.Message.Identity, tag.RowsAffected())
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// upsertFailed writes the stored part of a failed record: unfinished while
// it is retryable (what the cap counts), no response.
func (h *HTTPStore) upsertFailed(ctx context.Context, tx pgx.Tx, rowID int64, req HTTPRequest, status dedup.Status) error {
	_, err := tx.Exec(ctx, h.upsertSQL, rowID, req.Principal, req.CanonVersion, status == dedup.StatusFailedRetryable, nil, nil, "")
	if err != nil {
		return fmt.Errorf("idemq: http store failure: %w", err)
	}
	return nil
}

// httpStored is a record's existence and its stored part (http_read).
type httpStored struct {
	record   bool // the record exists (false: purged since the claim)
	found    bool // it has a stored part
	version  int
	status   int
	response []byte
	keyID    string
}

// read reads record rowID and its stored part in one statement.
func (h *HTTPStore) read(ctx context.Context, tx pgx.Tx, rowID int64) (httpStored, error) {
	var st httpStored
	var version, status *int32
	err := tx.QueryRow(ctx, h.readSQL, rowID).Scan(&version, &status, &st.response, &st.keyID, &st.found)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return httpStored{}, nil
	case err != nil:
		return httpStored{}, fmt.Errorf("idemq: http read: %w", err)
	}
	st.record = true
	if version != nil {
		st.version = int(*version)
	}
	if status != nil {
		st.status = int(*status)
	}
	return st, nil
}

// lockKey takes the identity's advisory lock in tx: waiting at most the
// transaction's lock_timeout when req.LockWait is set (then resetting it),
// else without waiting. It reports false when another transaction holds
// it. In the same round trip it counts the principal's unfinished records
// (at most MaxUnfinished: one scan of the partial index, used when the
// claim finds the key new), so that a new key pays no round trip for the
// cap.
func (h *HTTPStore) lockKey(ctx context.Context, tx pgx.Tx, req HTTPRequest) (held bool, unfinished int, err error) {
	id := req.Message.Identity
	key := httpKeyLock(h.s.cfg.Schema+"."+h.s.cfg.RecordsTable, id)
	b := &pgx.Batch{}
	if req.LockWait > 0 {
		b.Queue(h.keyLockSQL, key)
		b.Queue(h.lockTimeoutResetSQL)
	} else {
		b.Queue(h.keyTryLockSQL, key)
	}
	b.Queue(h.unfinishedCountSQL, req.Principal, req.UnfinishedWindow.Seconds(), req.MaxUnfinished)
	br := tx.SendBatch(ctx, b)
	if req.LockWait > 0 {
		_, err = br.Exec()
		held = err == nil
		if err == nil {
			_, err = br.Exec()
		}
	} else {
		err = br.QueryRow().Scan(&held)
	}
	if err == nil && held {
		err = br.QueryRow().Scan(&unfinished)
	}
	if cerr := br.Close(); err == nil && held {
		err = cerr
	}
	if isLockTimeout(err) {
		return false, 0, nil
	}
	if err != nil {
		return false, 0, fmt.Errorf("idemq: http key lock %s: %w", id, err)
	}
	return held, unfinished, nil
}

// httpKeyLock is the advisory lock key of an identity in the records table
// table (schema.table, unquoted): the first 8 bytes of SHA-256 over table,
// NUL, scope, NUL, message ID. Advisory locks are database-wide, so the
// table is part of the key: the same scope and key in another schema (a
// second service, or tests running side by side) never passes for a request
// in flight. Two identities share one with probability 2^-64; they would
// then take turns, which costs a 409 and a retry, never a wrong answer.
func httpKeyLock(table string, id dedup.Identity) int64 {
	h := sha256.New()
	h.Write([]byte(table))
	h.Write([]byte{0})
	h.Write([]byte(id.Scope))
	h.Write([]byte{0})
	h.Write([]byte(id.MessageID))
	return int64(binary.BigEndian.Uint64(h.Sum(nil)[:8])) //nolint:gosec // a hash: wrapping is intended
}

// isLockTimeout reports whether err is Postgres's lock_not_available
// (55P03): the claim's lock_timeout ran out.
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// HTTPStored is what HTTPStore.Stored finds for an identity.
type HTTPStored struct {
	// Status is the record's status ("" when there is no record).
	Status dedup.Status
	// CanonVersion is the canonicalization version stored with the
	// record (0 when it has no stored part yet).
	CanonVersion int
	// Response is the stored final response (Status 0 when none).
	Response HTTPResponse
}

// Stored reads the record of id and its stored part, without a lock: the
// canonicalization version a lease-mode request must be fingerprinted
// with, and the response a duplicate replays.
func (h *HTTPStore) Stored(ctx context.Context, id dedup.Identity) (HTTPStored, error) {
	var st HTTPStored
	var status *string
	var version, code *int32
	err := h.s.pool.QueryRow(ctx, h.storedByIdentitySQL, id.Scope, id.MessageID).
		Scan(&status, &version, &code, &st.Response.Stored, &st.Response.SealedBy)
	if errors.Is(err, pgx.ErrNoRows) {
		return HTTPStored{}, nil
	}
	if err != nil {
		return HTTPStored{}, fmt.Errorf("idemq: http stored %s: %w", id, err)
	}
	if status != nil {
		st.Status = dedup.Status(*status)
	}
	if version != nil {
		st.CanonVersion = int(*version)
	}
	if code != nil {
		st.Response.Status = int(*code)
	}
	return st, nil
}

// StoreLeased writes the stored part of a lease-mode record in a
// transaction of its own, only while l (owner token and fence) still holds
// the record: a final response (final true; resp stored, no longer
// unfinished) before the owner marks the record SUCCEEDED, or a retryable
// failure (final false; counted by the unfinished cap). It returns an
// error wrapping dedup.ErrFenced when the lease was taken over.
func (h *HTTPStore) StoreLeased(ctx context.Context, l dedup.Lease, principal string, canonVersion int, final bool, resp HTTPResponse) error {
	id := l.Identity
	var status *int
	if final {
		status = &resp.Status
	}
	var rowID int64
	err := h.s.pool.QueryRow(ctx, h.upsertLeasedSQL, id.Scope, id.MessageID, principal, canonVersion, !final, status, resp.Stored,
		resp.SealedBy, l.OwnerToken, l.Fence).Scan(&rowID)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: http store %s", dedup.ErrFenced, id)
	}
	if err != nil {
		return fmt.Errorf("idemq: http store %s: %w", id, err)
	}
	return nil
}

// CountUnfinished returns how many unfinished records principal has that
// were touched within window, counting at most limit (one scan of the
// partial index): lease mode's cap check, before its claim.
func (h *HTTPStore) CountUnfinished(ctx context.Context, principal string, window time.Duration, limit int) (int, error) {
	var n int
	if err := h.s.pool.QueryRow(ctx, h.unfinishedCountSQL, principal, window.Seconds(), limit).Scan(&n); err != nil {
		return 0, fmt.Errorf("idemq: http count unfinished: %w", err)
	}
	return n, nil
}
