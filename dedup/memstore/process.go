package memstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/lease"
)

// claim is what the claim of one delivery decided.
type claim struct {
	res   dedup.Result    // the outcome, when run is false
	run   bool            // the handler runs on rec
	wait  <-chan struct{} // atomic mode: an execution holds the record; claim again once closed
	rec   *record
	prev  dedup.Record // rec before the claim (an atomic run rolls back to it)
	isNew bool         // rec was created by this claim
}

// claimLocked decides msg: a duplicate, a conflict, a live lease, a dead
// letter for executions that never reported, or a run (the attempt counted).
// leaseTTL > 0 is lease mode: the run holds a lease with a new owner token
// and the fence plus one. s.mu is held.
func (s *Store) claimLocked(msg *dedup.Message, sum []byte, keyID string, leaseTTL time.Duration) claim {
	now := s.now()
	r, by := s.match(msg.Identity)
	c := claim{rec: r}
	if r == nil {
		c.rec, c.isNew = s.insert(msg, sum, keyID), true
		r = c.rec
	} else if res, ok := s.conflict(msg, r, by); ok {
		return claim{res: res}
	}
	switch {
	case r.running != nil && leaseTTL == 0:
		return claim{wait: r.running}
	case r.running != nil || r.Status == dedup.StatusProcessing && now.Before(r.leaseUntil):
		return claim{res: dedup.Result{Outcome: dedup.OutcomeRetry, Status: r.Status, Attempts: r.Attempts, Err: dedup.ErrLeaseHeld}}
	case r.Status == dedup.StatusSucceeded || r.Status == dedup.StatusFailedFinal:
		return claim{res: dedup.Result{Outcome: dedup.OutcomeDuplicate, MatchedBy: by, Status: r.Status, Attempts: r.Attempts}}
	case r.Status == dedup.StatusProcessing && r.Attempts >= s.cfg.MaxAttempts:
		// Every execution so far died holding its lease: no more runs.
		cause := fmt.Errorf("%w: attempts exhausted after %d handler starts whose lease expired", dedup.ErrExecutionLost, r.Attempts)
		r.owner = uuid.New()
		s.finish(r, msg, dedup.StatusFailedFinal, cause)
		r.LastErrorClass = dedup.ReasonAttemptsExhausted
		id := s.deadLetter(msg, dedup.ReasonAttemptsExhausted, cause, r.Attempts)
		return claim{res: dedup.Result{Outcome: dedup.OutcomeDeadLetter, Status: r.Status, Attempts: r.Attempts, Err: cause,
			Reason: dedup.ReasonAttemptsExhausted, DeadLetterID: id}}
	}
	// New, FAILED_RETRYABLE, or PROCESSING with an expired lease (a
	// takeover): run, counting the attempt.
	c.prev = r.Record
	c.run = true
	r.Attempts++
	r.Status, r.UpdatedAt, r.Source, r.ReconsumeTimes = dedup.StatusProcessing, now, msg.Source, msg.ReconsumeTimes
	r.owner = uuid.New()
	if leaseTTL > 0 {
		r.Fence++
		r.leaseUntil = now.Add(leaseTTL)
	} else {
		r.running = make(chan struct{})
	}
	return c
}

// Process runs h for msg in atomic mode: the claim, then h with a fresh Tx,
// then, when h returned nil, its writes applied and the record SUCCEEDED,
// all or nothing. A copy that arrives while another execution holds the
// record waits for it (as for a Postgres row lock), then reports the
// outcome. A failure is marked like the Postgres store marks it
// (FAILED_RETRYABLE; FAILED_FINAL and a dead letter when Permanent or at
// MaxAttempts), and the Tx's writes are dropped. A payload the
// Fingerprinter's canonicalizer refuses is rejected as bad input.
//
// The error is non-nil only when nothing was recorded: ctx ended while h
// ran (or while waiting), or msg has no identity. The record is then as
// before the call, and the error wraps dedup.ErrOutcomeUnknown when h ran.
func (s *Store) Process(ctx context.Context, msg *dedup.Message, h dedup.TxHandler[*Tx]) (dedup.Result, error) {
	if err := checkMsg(msg); err != nil {
		return dedup.Result{}, err
	}
	sum, keyID, err := s.cfg.Fingerprinter.Sum(msg.Payload)
	if err != nil {
		return s.Reject(ctx, msg, dedup.ReasonBadInput, err)
	}
	var c claim
	for {
		if err := ctx.Err(); err != nil {
			return dedup.Result{}, err
		}
		s.mu.Lock()
		c = s.claimLocked(msg, sum, keyID, 0)
		s.mu.Unlock()
		if c.wait == nil {
			break
		}
		select {
		case <-c.wait:
		case <-ctx.Done():
			return dedup.Result{}, ctx.Err()
		}
	}
	if !c.run {
		return c.res, nil
	}
	r := c.rec
	msg.Attempt = r.Attempts
	tx := &Tx{s: s, writes: map[string][]byte{}}
	herr := runTx(ctx, h, tx, msg)

	s.mu.Lock()
	res := dedup.Result{HandlerCalled: true, Attempts: r.Attempts}
	close(r.running)
	r.running = nil
	if herr != nil && ctx.Err() != nil {
		// Interrupted: roll back as a transaction would, nothing counted.
		if c.isNew {
			s.remove(r)
		} else {
			r.Record = c.prev
		}
		s.mu.Unlock()
		return res, fmt.Errorf("%w: memstore: handler interrupted: %w", dedup.ErrOutcomeUnknown, errors.Join(ctx.Err(), herr))
	}
	var onCommit []func()
	if herr == nil {
		for k, v := range tx.writes {
			s.values[k] = v
		}
		onCommit = tx.onCommit
		s.finish(r, msg, dedup.StatusSucceeded, nil)
		res.Outcome, res.Status = dedup.OutcomeProcessed, dedup.StatusSucceeded
	} else {
		res = s.failLocked(r, msg, herr, res)
	}
	s.mu.Unlock()
	for _, f := range onCommit {
		f()
	}
	return res, nil
}

// failLocked marks a failed execution of r: FAILED_FINAL with a dead letter
// when herr is Permanent or the attempt was the last, else
// FAILED_RETRYABLE. s.mu is held.
func (s *Store) failLocked(r *record, msg *dedup.Message, herr error, res dedup.Result) dedup.Result {
	status, reason := dedup.StatusFailedRetryable, ""
	switch {
	case dedup.IsPermanent(herr):
		status, reason = dedup.StatusFailedFinal, dedup.ReasonPermanentError
	case r.Attempts >= s.cfg.MaxAttempts:
		status, reason = dedup.StatusFailedFinal, dedup.ReasonAttemptsExhausted
	}
	s.finish(r, msg, status, herr)
	res.Err, res.Status, res.Outcome = herr, status, dedup.OutcomeRetry
	if status == dedup.StatusFailedFinal {
		res.Outcome, res.Reason = dedup.OutcomeDeadLetter, reason
		res.DeadLetterID = s.deadLetter(msg, reason, herr, r.Attempts)
	}
	return res
}

func runTx(ctx context.Context, h dedup.TxHandler[*Tx], tx *Tx, msg *dedup.Message) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &dedup.PanicError{Value: v}
		}
	}()
	return h(ctx, tx, msg)
}

// ProcessBatch runs h for msgs in order, each as Process does (in memory a
// commit costs nothing, so each message commits on its own, its Tx's writes
// with it). It stops at the first OutcomeRetry, leaving the results after
// it zero (Outcome "": not attempted), as the Postgres store does, so a
// later message never overtakes one that must be retried. A non-nil error
// (ctx ended) comes with the results of the messages before it, which are
// recorded.
func (s *Store) ProcessBatch(ctx context.Context, msgs []*dedup.Message, h dedup.TxHandler[*Tx]) ([]dedup.Result, error) {
	out := make([]dedup.Result, len(msgs))
	for i, m := range msgs {
		res, err := s.Process(ctx, m, h)
		out[i] = res
		if err != nil {
			return out, err
		}
		if res.Outcome == dedup.OutcomeRetry {
			break
		}
	}
	return out, nil
}

// ProcessLeased runs h for msg in lease mode (see dedup.Lease): the claim
// gives the record a fresh owner token, the fence plus one and a lease of
// opt.TTL (default 30 s) on the store's clock; h runs outside any
// transaction, its context carrying the Lease, with heartbeats every
// opt.Heartbeat; completion and failure marks are refused (OutcomeFenced,
// not acked) once another copy took the record over after the lease
// expired. A copy during a live lease answers OutcomeRetry with
// dedup.ErrLeaseHeld. Once MaxAttempts executions died holding their lease,
// the next copy is dead-lettered (Result.Err wraps dedup.ErrExecutionLost)
// without running h. A handler interrupted by ctx gives the lease back
// without counting the attempt and returns an error (do not ack).
func (s *Store) ProcessLeased(ctx context.Context, msg *dedup.Message, h dedup.LeaseHandler, opt dedup.LeaseOptions) (dedup.Result, error) {
	if err := checkMsg(msg); err != nil {
		return dedup.Result{}, err
	}
	opt = opt.WithDefaults()
	if opt.TTL <= 0 {
		return dedup.Result{}, fmt.Errorf("%w: lease TTL %s must be positive", ErrInvalidConfig, opt.TTL)
	}
	sum, keyID, err := s.cfg.Fingerprinter.Sum(msg.Payload)
	if err != nil {
		return s.Reject(ctx, msg, dedup.ReasonBadInput, err)
	}
	if err := ctx.Err(); err != nil {
		return dedup.Result{}, err
	}
	s.mu.Lock()
	c := s.claimLocked(msg, sum, keyID, opt.TTL)
	var l dedup.Lease
	if c.run {
		r := c.rec
		l = dedup.Lease{Identity: msg.Identity, Record: dedup.Identity{Scope: r.Scope, MessageID: r.MessageID, BusinessKey: r.BusinessKey},
			OwnerToken: r.owner, Fence: r.Fence, Attempt: r.Attempts}
	}
	s.mu.Unlock()
	if !c.run {
		return c.res, nil
	}
	return lease.Run(ctx, lease.Params{Message: msg, Lease: l, Handler: h, Options: opt, MaxAttempts: s.cfg.MaxAttempts,
		Marks: &marks{s: s, r: c.rec, msg: msg, owner: l.OwnerToken, fence: l.Fence, ttl: opt.TTL}})
}

// marks are the lease engine's marks of one execution: each a
// compare-and-set on the owner token and fence.
type marks struct {
	s     *Store
	r     *record
	msg   *dedup.Message
	owner uuid.UUID
	fence int64
	ttl   time.Duration
}

// heldLocked reports whether the execution still owns the record. s.mu is
// held.
func (m *marks) heldLocked() bool {
	return m.r.owner == m.owner && m.r.Fence == m.fence && m.r.Status == dedup.StatusProcessing
}

func (m *marks) Renew(context.Context) (bool, error) {
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	if !m.heldLocked() {
		return false, nil
	}
	m.r.leaseUntil = m.s.now().Add(m.ttl)
	return true, nil
}

func (m *marks) Succeed(context.Context) (bool, error) {
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	if !m.heldLocked() {
		return true, nil
	}
	m.s.finish(m.r, m.msg, dedup.StatusSucceeded, nil)
	return false, nil
}

func (m *marks) Fail(_ context.Context, status dedup.Status, reason string, herr error) (int64, bool, error) {
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	if !m.heldLocked() {
		return 0, true, nil
	}
	m.s.finish(m.r, m.msg, status, herr)
	if status != dedup.StatusFailedFinal {
		return 0, false, nil
	}
	return m.s.deadLetter(m.msg, reason, herr, m.r.Attempts), false, nil
}

func (m *marks) Release(context.Context) error {
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	if !m.heldLocked() {
		return dedup.ErrFenced
	}
	m.r.Status, m.r.leaseUntil, m.r.UpdatedAt = dedup.StatusFailedRetryable, time.Time{}, m.s.now()
	m.r.Attempts--
	return nil
}

// Tx is the transaction of one atomic-mode execution (Process,
// ProcessBatch): its writes are applied to the Store only when the handler
// returns nil, together with the SUCCEEDED record; a failure or an
// interrupted run drops them. A Tx is used by one handler run, from one
// goroutine.
type Tx struct {
	s        *Store
	writes   map[string][]byte
	onCommit []func()
}

// Set writes value under key, visible to this Tx at once and to
// Store.Get once committed. value is copied.
func (tx *Tx) Set(key string, value []byte) { tx.writes[key] = clone(value) }

// Get returns the value under key: this Tx's own write, else the committed
// one, and whether there is one.
func (tx *Tx) Get(key string) ([]byte, bool) {
	if v, ok := tx.writes[key]; ok {
		return clone(v), true
	}
	return tx.s.Get(key)
}

// OnCommit registers f to run after the Tx committed (the handler returned
// nil and the record is SUCCEEDED), outside the store's lock: a stand-in
// for effects a test wants to observe. Never run for a failed execution.
func (tx *Tx) OnCommit(f func()) { tx.onCommit = append(tx.onCommit, f) }
