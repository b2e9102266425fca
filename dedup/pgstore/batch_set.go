package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// BatchHandler is the set-based handler of ProcessBatchSet: called once per
// batch transaction with the messages that must run (new ones, and records
// being retried), in batch order, never with duplicates; it can write them
// all in one statement (COPY, or an INSERT … SELECT FROM unnest). See
// dedup.TxBatchHandler for its contract; consumer.Config.BatchHandler is the
// same type.
type BatchHandler = dedup.TxBatchHandler[pgx.Tx]

// ProcessBatchSet is ProcessBatch with a set-based handler: one transaction
// for the batch, whose claim is one round trip (see ProcessBatch), then one
// call of h with the messages to run, in order — the ones that got a new
// record, and FAILED_RETRYABLE records taken again (Message.Attempt set) —
// and COMMIT. Duplicates of terminal records and conflicts are answered from
// the claim's read and never passed to h; a message appearing twice in the
// batch is passed once (the second copy is its duplicate). No savepoint is
// set for h: a failing h (an error, a panic, or the transaction left
// aborted) fails the whole try, which is then rerun one message per
// transaction, calling h with one-message slices (Process's semantics), so
// that the message at fault is marked FAILED_RETRYABLE, or FAILED_FINAL with
// a dead letter, and the others commit; when h ran for one message only,
// that message is marked with h's error without running h again (one
// execution, one attempt, as in Process). Serialization failures and
// deadlocks are retried whole first (Config.TransientRetry).
//
// Results, ordering (processing stops at the first OutcomeRetry: h is
// called with the messages before it only), the fast path (Config.FastPath:
// hits are answered before any transaction; an all-hit batch opens none)
// and errors (ErrOutcomeUnknown: nothing durable) are ProcessBatch's.
// A message whose fingerprint fails is marked bad input, as in
// ProcessBatch, and not passed to h.
func (s *Store) ProcessBatchSet(ctx context.Context, msgs []*dedup.Message, h BatchHandler) ([]dedup.Result, error) {
	if len(msgs) == 0 {
		return []dedup.Result{}, nil
	}
	if h == nil {
		return nil, errors.New("idemq: ProcessBatchSet: nil handler")
	}
	fps, err := s.batchFingerprints("ProcessBatchSet", msgs)
	if err != nil {
		return nil, err
	}
	w := batchWork{bh: h}
	if s.cfg.FastPath != nil {
		return s.processBatchFast(ctx, msgs, fps, w)
	}
	return s.processBatchPG(ctx, msgs, fps, w)
}

// batchWork is what a batch runs: a per-message handler (ProcessBatch) or a
// set handler (ProcessBatchSet); exactly one is set.
type batchWork struct {
	h  Handler
	bh BatchHandler
}

// perMessage is the work as a per-message Handler, for the one-by-one rerun:
// h itself, or bh called with a one-message slice.
func (w batchWork) perMessage() Handler {
	if w.h != nil {
		return w.h
	}
	bh := w.bh
	return func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		return bh(ctx, tx, []*dedup.Message{m})
	}
}

// batchFingerprints checks each message's identity and fingerprints its
// payload (a failure is kept per message: bad input).
func (s *Store) batchFingerprints(op string, msgs []*dedup.Message) ([]batchFP, error) {
	fps := make([]batchFP, len(msgs))
	for i, m := range msgs {
		if m == nil || m.Identity.Scope == "" || m.Identity.MessageID == "" {
			return nil, fmt.Errorf("idemq: %s: message %d has no identity (use NewIdentity)", op, i)
		}
		fps[i].sum, fps[i].keyID, fps[i].err = s.fp.Sum(m.Payload)
	}
	return fps, nil
}

// recordKey is a record's unique key: (scope, message ID), or (scope,
// non-empty business key) when bk is set.
type recordKey struct {
	scope, key string
	bk         bool
}

// setRecord is a record as the batch's claim read it, kept up to date with
// what this transaction wrote to it.
type setRecord struct {
	record
	scope string
	// inserted: by this transaction's records_claim_set, for msgs[owner].
	inserted bool
	owner    int
}

// setClaim is what a batch's claim round trip found: the records its
// messages match (theirs included), by either key.
type setClaim struct {
	recs       []setRecord
	byKey      map[recordKey]*setRecord
	isNew      []bool // isNew[i]: msgs[i] inserted its record
	savepoints bool   // the handler savepoint was set with the claim
}

// match is the record msg's identity matches: by message ID first, else by
// business key (as record_match), or nil.
func (c *setClaim) match(id dedup.Identity) *setRecord {
	if r := c.byKey[recordKey{scope: id.Scope, key: id.MessageID}]; r != nil {
		return r
	}
	if id.BusinessKey != "" {
		return c.byKey[recordKey{scope: id.Scope, key: id.BusinessKey, bk: true}]
	}
	return nil
}

// put makes r the record of its keys.
func (c *setClaim) put(r *setRecord) {
	c.byKey[recordKey{scope: r.scope, key: r.messageID}] = r
	if r.businessKey != "" {
		c.byKey[recordKey{scope: r.scope, key: r.businessKey, bk: true}] = r
	}
}

// claimSet claims a batch in one round trip, one pipeline of:
// records_claim_set, which reads every record the batch's messages match and
// inserts a SUCCEEDED record (attempts 1, expiry set: the COMMIT decides)
// for the first message of each message ID and non-empty business key that
// no record holds yet; records_lock_set, which locks the matched records
// that are not terminal, in id order; and, when savepoint is set, the
// handler's savepoint. A message that repeats an earlier one's message ID or
// business key in the batch, or that is bad input (which marks its keys so,
// and is not sent), is not inserted: it is answered in its turn, against the
// record as the batch left it.
//
// The argument arrays are allocated once, one per column.
func (s *Store) claimSet(ctx context.Context, tx pgx.Tx, msgs []*dedup.Message, fps []batchFP, savepoint bool) (*setClaim, error) {
	n := len(msgs)
	c := &setClaim{isNew: make([]bool, n)}
	scopes, ids, bks, keyIDs, sources := make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
	sums, reconsumes, offered := make([][]byte, 0, n), make([]int32, 0, n), make([]bool, 0, n)
	used := make(map[recordKey]struct{}, 2*n)
	for i, m := range msgs {
		id := m.Identity
		kID, kBK := recordKey{scope: id.Scope, key: id.MessageID}, recordKey{scope: id.Scope, key: id.BusinessKey, bk: true}
		_, seen := used[kID]
		if id.BusinessKey != "" {
			_, bkSeen := used[kBK]
			seen = seen || bkSeen
			used[kBK] = struct{}{}
		}
		used[kID] = struct{}{}
		if fps[i].err != nil {
			continue
		}
		scopes, ids, bks = append(scopes, id.Scope), append(ids, id.MessageID), append(bks, id.BusinessKey)
		sums, keyIDs = append(sums, fps[i].sum), append(keyIDs, fps[i].keyID)
		sources, reconsumes, offered = append(sources, clip(m.Source, 1024)), append(reconsumes, m.ReconsumeTimes), append(offered, !seen)
	}
	if len(ids) == 0 {
		c.byKey = map[recordKey]*setRecord{}
		return c, nil // bad input only: nothing to claim
	}

	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 3)}
	b.Queue(s.q.recordsClaimSetSQL, scopes, ids, bks, sums, keyIDs, sources, reconsumes, offered, s.expiry(dedup.StatusSucceeded))
	b.Queue(s.q.recordsLockSetSQL, scopes, ids, bks)
	if savepoint {
		b.Queue(s.q.handlerSavepointSQL)
	}
	br := tx.SendBatch(ctx, b)
	c.recs = make([]setRecord, 0, len(ids))
	var r setRecord
	var st string
	err := forEachRow(br, []any{&r.id, &r.messageID, &r.businessKey, &r.fingerprint, &r.keyID, &st, &r.attempts, &r.scope, &r.inserted}, func() error {
		r.status = dedup.Status(st)
		c.recs = append(c.recs, r)
		return nil
	})
	if err == nil {
		_, err = br.Exec()
	}
	if err == nil && savepoint {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("idemq: claim batch of %d: %w", n, err)
	}
	c.savepoints = savepoint
	c.byKey = make(map[recordKey]*setRecord, 2*len(c.recs))
	for j := range c.recs {
		if !c.recs[j].inserted {
			c.put(&c.recs[j])
		}
	}
	for j := range c.recs {
		if c.recs[j].inserted {
			c.put(&c.recs[j]) // wins over a found record sharing one of its keys (none should)
		}
	}
	k := 0
	for i, m := range msgs {
		if fps[i].err != nil {
			continue
		}
		if offered[k] {
			if r := c.byKey[recordKey{scope: m.Identity.Scope, key: m.Identity.MessageID}]; r != nil && r.inserted {
				r.owner, c.isNew[i] = i, true
			}
		}
		k++
	}
	return c, nil
}

// forEachRow reads the rows of br's next statement into scans, calling fn
// after each row.
func forEachRow(br pgx.BatchResults, scans []any, fn func() error) error {
	rows, err := br.Query()
	if err != nil {
		rows.Close()
		return err
	}
	_, err = pgx.ForEachRow(rows, scans, fn)
	return err
}

// setRun is one try of a set-based batch: its transaction, its claim, and
// what it found so far.
type setRun struct {
	s       *Store
	tx      pgx.Tx
	msgs    []*dedup.Message
	fps     []batchFP
	called  []bool
	results []dedup.Result
	claim   *setClaim
	// held: a handler savepoint is set; fresh: and nothing was written
	// since (the next handler can use it as it is).
	held, fresh bool
	// stop is the index of the message that stopped the batch (OutcomeRetry),
	// len(msgs) when none did.
	stop int
	// sole is set when a BatchHandler called with one message failed: that
	// message's failure, which the one-by-one rerun marks without running
	// the handler again.
	sole *soleFailure
}

// soleFailure is the failure of the only message a BatchHandler ran.
type soleFailure struct {
	i   int
	err error
}

// setTx is one try of ProcessBatch or ProcessBatchSet, as batchTx was: one
// transaction for the whole batch, claimed by claimSet in one round trip.
// On failure nothing is durable, and class says what the failure means:
// FailureOutcomeUnknown (failure wraps ErrOutcomeUnknown), FailureTransient
// (retry the batch), or FailureHandler (a message made the batch fail: find
// it). called[i] is set when the handler ran for msgs[i].
func (s *Store) setTx(ctx context.Context, msgs []*dedup.Message, fps []batchFP, w batchWork, called []bool, sole **soleFailure) ([]dedup.Result, dedup.FailureClass, error) {
	// BEGIN and the claim are idemq's own steps: bounded by
	// StatementTimeout, the handlers between them by their own contexts.
	cctx, cancel := s.bound(ctx)
	defer cancel()
	tx, err := s.pool.BeginTx(cctx, s.cfg.TxOptions)
	if err != nil {
		return nil, ownFailureClass(err), wrapUnknown(fmt.Errorf("idemq: begin batch: %w", err))
	}
	defer s.rollback(ctx, tx)

	r := &setRun{s: s, tx: tx, msgs: msgs, fps: fps, called: called, results: make([]dedup.Result, len(msgs)), stop: len(msgs)}
	if r.claim, err = s.claimSet(cctx, tx, msgs, fps, w.h != nil); err != nil {
		return nil, ownFailureClass(err), wrapUnknown(err)
	}
	cancel()
	r.held, r.fresh = r.claim.savepoints, r.claim.savepoints
	var class dedup.FailureClass
	if w.h != nil {
		class, err = r.runEach(ctx, w.h)
	} else {
		class, err = r.runSet(ctx, w.bh)
	}
	if err != nil {
		*sole = r.sole
		return nil, class, err
	}
	cctx, cancel = s.bound(ctx)
	defer cancel()
	if err := r.unclaimAfterStop(cctx); err != nil {
		return nil, ownFailureClass(err), wrapUnknown(err)
	}
	if err := tx.Commit(cctx); err != nil {
		class := commitFailureClass(err)
		if class == dedup.FailureOutcomeUnknown {
			return nil, class, fmt.Errorf("%w: batch commit: %w", dedup.ErrOutcomeUnknown, err)
		}
		return nil, class, fmt.Errorf("idemq: batch commit refused: %w", err)
	}
	return r.results, dedup.FailureNone, nil
}

// badInput marks msgs[i], whose payload has no fingerprint, FAILED_FINAL
// with a dead letter in the batch's transaction.
func (r *setRun) badInput(ctx context.Context, i int) error {
	res, err := r.s.markFailedIn(ctx, r.tx, failure{msg: r.msgs[i], err: dedup.Permanent(r.fps[i].err), finalReason: dedup.ReasonBadInput})
	if err != nil {
		return err
	}
	r.results[i], r.fresh = res, false
	return nil
}

// answer answers msgs[i] from a terminal record read by the claim, without
// a lock: a duplicate, or a conflict (dead letter) when its payload differs.
func (r *setRun) answer(ctx context.Context, i int, rec *setRecord) (dedup.Result, error) {
	res, _, err := r.s.decide(ctx, r.tx, r.msgs[i], r.fps[i].sum, &rec.record)
	if res.Outcome == dedup.OutcomeConflict {
		r.fresh = false // its dead letter
	}
	return res, err
}

// runEach is ProcessBatch's part of a try: each message in order; a new
// one's handler runs after a savepoint (set with the claim for the first,
// then released and set again with the handler's first statement, so they
// never nest and cost no round trip of their own), and
// its failure is rolled back to it and marked on the record; a duplicate of
// a terminal record is answered from the claim's read (no savepoint, no
// write); any other message (a record to retry, being processed, or changed
// since the read) is claimed and run on its own (claimAndRunIn).
func (r *setRun) runEach(ctx context.Context, h Handler) (dedup.FailureClass, error) {
	for i, m := range r.msgs {
		if r.fps[i].err != nil {
			if err := r.badInput(ctx, i); err != nil {
				return ownFailureClass(err), wrapUnknown(err)
			}
			continue
		}
		var res dedup.Result
		var herr, err error
		switch rec := r.claim.match(m.Identity); {
		case r.claim.isNew[i]:
			res, herr, err = r.runNew(ctx, i, rec, h)
		case rec != nil && terminal(rec.status):
			res, err = r.answer(ctx, i, rec)
		default:
			res, herr, err = r.s.claimAndRunIn(ctx, r.tx, claimRun{msg: m, sum: r.fps[i].sum, keyID: r.fps[i].keyID, h: h, mode: claimProcessing, release: r.held})
			r.held, r.fresh = true, false
		}
		r.called[i] = r.called[i] || res.HandlerCalled || herr != nil
		if err != nil {
			return ownFailureClass(err), wrapUnknown(err)
		}
		if herr != nil {
			if dedup.IsTransient(herr) {
				return dedup.FailureTransient, herr
			}
			// The handler's failure could not be rolled back to its
			// savepoint: the transaction is unusable; find the culprit.
			return dedup.FailureHandler, fmt.Errorf("idemq: batch transaction unusable after a handler failure: %w", herr)
		}
		r.results[i] = res
		if res.Outcome == dedup.OutcomeRetry {
			r.stop = i
			break
		}
	}
	return dedup.FailureNone, nil
}

// errLeftAborted is a handler's failure that it did not report: it returned
// nil with its transaction aborted by a failed statement.
var errLeftAborted = errors.New("idemq: the handler returned nil but left the transaction aborted (a failed statement it did not report)")

// txAborted reports whether tx's connection says its transaction is
// aborted (a statement failed): known from the last server reply, no round
// trip.
func txAborted(tx pgx.Tx) bool {
	c := tx.Conn()
	return c != nil && c.PgConn().TxStatus() == 'E'
}

// runNew runs h for msgs[i], which inserted rec (SUCCEEDED, attempts 1), with
// claimAndRunIn's contract: the handler runs after a fresh savepoint (sent
// with its first statement: savepointTx); when it fails, its writes roll
// back alone and rec is marked FAILED_RETRYABLE
// or FAILED_FINAL (+ dead letter) in the same transaction. herr is set when
// the failure is transient or could not be marked (transaction unusable).
func (r *setRun) runNew(ctx context.Context, i int, rec *setRecord, h Handler) (res dedup.Result, herr, err error) {
	m, tx := r.msgs[i], r.tx
	// A fresh savepoint (set with the claim) serves as it is; else the
	// release of the previous one and the new one travel with the handler's
	// first statement (savepointTx), and are not sent if it sends none.
	var pending []string
	switch {
	case r.fresh:
	case r.held:
		pending = []string{r.s.q.handlerReleaseSQL, r.s.q.handlerSavepointSQL}
	default:
		pending = []string{r.s.q.handlerSavepointSQL}
	}
	htx := withPending(tx, pending...)
	m.Attempt = 1
	herr = runHandler(ctx, htx, m, h)
	called := dedup.Result{HandlerCalled: true, Attempts: 1}
	sent, sperr := handlerSent(htx)
	if sent {
		r.held, r.fresh = true, false
	}
	if sperr != nil {
		return called, nil, sperr // the store's own statements failed
	}
	if herr == nil && txAborted(tx) {
		herr = errLeftAborted
	}
	if herr == nil {
		return dedup.Result{Outcome: dedup.OutcomeProcessed, Status: dedup.StatusSucceeded, Attempts: 1, HandlerCalled: true}, nil, nil
	}
	switch handlerFailureClass(ctx, tx, herr) {
	case dedup.FailureOutcomeUnknown:
		return called, nil, fmt.Errorf("%w: handler's transaction lost (shutdown or connection closed): %w", dedup.ErrOutcomeUnknown, errors.Join(ctx.Err(), herr))
	case dedup.FailureTransient:
		return called, herr, nil
	}
	// A handler that sent nothing wrote nothing: there is nothing to roll
	// back (and no savepoint of its own to roll back to).
	if sent {
		if _, err := tx.Exec(ctx, r.s.q.handlerRollbackSQL); err != nil {
			return called, herr, nil
		}
	}
	if res, err = r.s.markClaimedFailed(ctx, tx, claimedFailure{rowID: rec.id, attempts: 1, msg: m, sum: r.fps[i].sum, err: herr}); err != nil {
		return called, herr, nil
	}
	rec.status, rec.attempts = res.Status, res.Attempts
	return res, nil, nil
}

// runSet is ProcessBatchSet's part of a try: decide every message in order
// (new, duplicate, conflict, to retry, bad input) up to the first
// OutcomeRetry, then call h once with the messages to run, and mark
// SUCCEEDED the records that were not inserted so (taken again, or claimed
// on their own). Any failure of h fails the try (FailureHandler: the
// caller reruns one by one; FailureTransient; FailureOutcomeUnknown).
func (r *setRun) runSet(ctx context.Context, h BatchHandler) (dedup.FailureClass, error) {
	run := make([]*dedup.Message, 0, len(r.msgs))
	idx := make([]int, 0, len(r.msgs))
	// marks are the records to mark SUCCEEDED after h (PROCESSING now): the
	// message index and the record id of each.
	var marks []setMark
	for i, m := range r.msgs {
		if r.fps[i].err != nil {
			if err := r.badInput(ctx, i); err != nil {
				return ownFailureClass(err), wrapUnknown(err)
			}
			continue
		}
		processed := dedup.Result{Outcome: dedup.OutcomeProcessed, Status: dedup.StatusSucceeded, Attempts: 1, HandlerCalled: true}
		switch rec := r.claim.match(m.Identity); {
		case r.claim.isNew[i]:
			m.Attempt = 1
			r.results[i] = processed
			run, idx = append(run, m), append(idx, i)
		case rec != nil && terminal(rec.status):
			res, err := r.answer(ctx, i, rec)
			if err != nil {
				return ownFailureClass(err), wrapUnknown(err)
			}
			r.results[i] = res
		default:
			res, rowID, err := r.claimOne(ctx, i)
			if err != nil {
				return ownFailureClass(err), wrapUnknown(err)
			}
			if rowID == 0 {
				r.results[i] = res
				break
			}
			m.Attempt = res.Attempts
			processed.Attempts = res.Attempts
			r.results[i] = processed
			run, idx, marks = append(run, m), append(idx, i), append(marks, setMark{i: i, rowID: rowID})
		}
		if r.results[i].Outcome == dedup.OutcomeRetry {
			r.stop = i
			break
		}
	}
	if len(run) == 0 {
		return dedup.FailureNone, nil
	}
	herr := runBatchHandler(ctx, r.tx, run, h)
	for _, i := range idx {
		r.called[i] = true
	}
	if herr == nil && txAborted(r.tx) {
		herr = errLeftAborted
	}
	if herr != nil {
		switch handlerFailureClass(ctx, r.tx, herr) {
		case dedup.FailureOutcomeUnknown:
			return dedup.FailureOutcomeUnknown, fmt.Errorf("%w: batch handler's transaction lost (shutdown or connection closed): %w", dedup.ErrOutcomeUnknown, errors.Join(ctx.Err(), herr))
		case dedup.FailureTransient:
			return dedup.FailureTransient, herr
		}
		if len(run) == 1 {
			r.sole = &soleFailure{i: idx[0], err: herr}
		}
		return dedup.FailureHandler, fmt.Errorf("idemq: batch handler failed: %w", herr)
	}
	for _, mk := range marks {
		if err := r.s.q.markSucceeded(ctx, r.tx, r.msgs[mk.i].Identity, mk.rowID, *r.s.expiry(dedup.StatusSucceeded)); err != nil {
			return ownFailureClass(err), wrapUnknown(err)
		}
	}
	return dedup.FailureNone, nil
}

// setMark is a record ProcessBatchSet marks SUCCEEDED after its handler:
// msgs[i]'s, row rowID.
type setMark struct {
	i     int
	rowID int64
}

// claimOne claims msgs[i] on its own (claim: a record to retry, being
// processed, or changed or purged since the batch's read), for
// ProcessBatchSet. It returns the id of the record h must run for (new,
// PROCESSING; or FAILED_RETRYABLE taken again, attempts counted) with its
// attempts, or 0 and the message's answer (duplicate, conflict, retry).
// The record then stands, in the claim's view, as SUCCEEDED: what it is at
// COMMIT if h succeeds (a later copy in the batch is its duplicate).
func (r *setRun) claimOne(ctx context.Context, i int) (dedup.Result, int64, error) {
	m, sum, keyID := r.msgs[i], r.fps[i].sum, r.fps[i].keyID
	rowID, rec, err := r.s.claim(ctx, r.tx, claimRun{msg: m, sum: sum, keyID: keyID, mode: claimProcessing, release: r.held})
	r.held, r.fresh = true, false
	if err != nil {
		return dedup.Result{}, 0, err
	}
	res := dedup.Result{Attempts: 1}
	view := setRecord{record: record{id: rowID, messageID: m.Identity.MessageID, businessKey: m.Identity.BusinessKey, fingerprint: sum, keyID: keyID}, scope: m.Identity.Scope}
	if rec != nil {
		var run bool
		if res, run, err = r.s.decide(ctx, r.tx, m, sum, rec); err != nil || !run {
			return res, 0, err
		}
		if res.Attempts, err = r.s.q.reclaim(ctx, r.tx, rec.id, m); err != nil {
			return dedup.Result{}, 0, err
		}
		rowID = rec.id
		view.record = *rec
		if len(view.fingerprint) == 0 {
			view.fingerprint, view.keyID = sum, r.s.fp.CurrentKeyID() // decide set it
		}
	}
	view.status, view.attempts = dedup.StatusSucceeded, res.Attempts
	r.claim.put(&view)
	return res, rowID, nil
}

// runBatchHandler calls h, recovering a panic as a *dedup.PanicError.
func runBatchHandler(ctx context.Context, tx pgx.Tx, msgs []*dedup.Message, h BatchHandler) (err error) {
	ct := watchCause(tx)
	defer func() {
		if v := recover(); v != nil {
			err = &dedup.PanicError{Value: v}
		}
		err = ct.explain(err, tx)
	}()
	return h(ctx, ct, msgs)
}

// unclaimAfterStop deletes the records this try inserted for messages after
// the one that stopped the batch: they were not attempted, and the next
// delivery of each must find no record.
func (r *setRun) unclaimAfterStop(ctx context.Context) error {
	var ids []int64
	for j := range r.claim.recs {
		if rec := &r.claim.recs[j]; rec.inserted && rec.owner > r.stop {
			ids = append(ids, rec.id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	if _, err := r.tx.Exec(ctx, r.s.q.recordsUnclaimSetSQL, ids); err != nil {
		return fmt.Errorf("idemq: unclaim %d records after the batch stopped: %w", len(ids), err)
	}
	return nil
}
