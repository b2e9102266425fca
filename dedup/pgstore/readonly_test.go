package pgstore

// Read-only duplicates: a copy of a message whose record is terminal
// (SUCCEEDED, FAILED_FINAL) is answered from a read in every Postgres mode;
// it never locks the record (so it never waits for, nor blocks, anyone) and
// its transaction writes nothing. A row lock taken with FOR UPDATE is
// stored in the row itself (its xmax becomes the locker's transaction ID,
// and taking it writes WAL), so "the record's xmin, xmax and ctid are
// unchanged after the copy" is what proves it took no lock and wrote no new
// version.

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// copyModes deliver one copy of msg through each Postgres mode, counting
// handler runs in ran.
var copyModes = []struct {
	name    string
	deliver func(ctx context.Context, s *Store, msg *dedup.Message, ran *atomic.Int32) (dedup.Result, error)
}{
	{"atomic", func(ctx context.Context, s *Store, msg *dedup.Message, ran *atomic.Int32) (dedup.Result, error) {
		return s.Process(ctx, msg, func(context.Context, pgx.Tx, *dedup.Message) error { ran.Add(1); return nil })
	}},
	{"batched", func(ctx context.Context, s *Store, msg *dedup.Message, ran *atomic.Int32) (dedup.Result, error) {
		res, err := s.ProcessBatch(ctx, []*dedup.Message{msg}, func(context.Context, pgx.Tx, *dedup.Message) error { ran.Add(1); return nil })
		if err != nil {
			return dedup.Result{}, err
		}
		return res[0], nil
	}},
	{"lease", func(ctx context.Context, s *Store, msg *dedup.Message, ran *atomic.Int32) (dedup.Result, error) {
		return s.ProcessLeased(ctx, msg, func(context.Context, *dedup.Message) error { ran.Add(1); return nil }, dedup.LeaseOptions{})
	}},
	{"reject", func(ctx context.Context, s *Store, msg *dedup.Message, _ *atomic.Int32) (dedup.Result, error) {
		return s.Reject(ctx, msg, dedup.ReasonBadInput, errors.New("bad input"))
	}},
}

// version is where a record's row stands: the transaction that wrote it
// (xmin), the one that last locked or deleted it (xmax, 0 for none) and the
// place of the version (ctid).
func (e *storeEnv) version(messageID string) string {
	e.t.Helper()
	var v string
	if err := e.pool.QueryRow(e.ctx, `select xmin::text || '/' || xmax::text || '/' || ctid::text from `+e.records()+`
where scope = $1 and message_id = $2`, e.scope, messageID).Scan(&v); err != nil {
		e.t.Fatalf("version of %s: %v", messageID, err)
	}
	return v
}

// finish gives the test's record of messageID the terminal status st.
func (e *storeEnv) finish(messageID, payload string, st dedup.Status) {
	e.t.Helper()
	res, err := e.store.Process(e.ctx, e.msg(messageID, "", payload), func(context.Context, pgx.Tx, *dedup.Message) error {
		if st == dedup.StatusFailedFinal {
			return dedup.Permanent(errors.New("poison"))
		}
		return nil
	})
	if err != nil || res.Status != st {
		e.t.Fatalf("finish %s as %s: %+v, %v", messageID, st, res, err)
	}
}

// TestDuplicateOfTerminalRecordTakesNoLock: in every mode, a duplicate of a
// SUCCEEDED or FAILED_FINAL record leaves the record's row exactly as it was
// (no FOR UPDATE lock, no new version), and a conflicting copy is
// dead-lettered without locking it either.
func TestDuplicateOfTerminalRecordTakesNoLock(t *testing.T) {
	e := newEnv(t, nil)
	for _, st := range []dedup.Status{dedup.StatusSucceeded, dedup.StatusFailedFinal} {
		for _, mode := range copyModes {
			id := "m-" + string(st) + "-" + mode.name
			e.finish(id, `{"n":1}`, st)
			before := e.version(id)

			var ran atomic.Int32
			res, err := mode.deliver(e.ctx, e.store, e.msg(id, "", `{"n":1}`), &ran)
			if err != nil || res.Outcome != dedup.OutcomeDuplicate || res.Status != st || ran.Load() != 0 {
				t.Fatalf("%s copy of a %s record: %+v, %v, handler ran %d times; want a duplicate", mode.name, st, res, err, ran.Load())
			}
			if after := e.version(id); after != before {
				t.Errorf("%s copy of a %s record changed its row (xmin/xmax/ctid %s → %s): it locked or wrote the record", mode.name, st, before, after)
			}

			if mode.name == "reject" {
				continue // a rejected copy is bad input, never compared
			}
			res, err = mode.deliver(e.ctx, e.store, e.msg(id, "", `{"n":2}`), &ran)
			if err != nil || res.Outcome != dedup.OutcomeConflict || res.DeadLetterID == 0 || ran.Load() != 0 {
				t.Fatalf("%s conflicting copy of a %s record: %+v, %v, handler ran %d times; want a dead-lettered conflict", mode.name, st, res, err, ran.Load())
			}
			if after := e.version(id); after != before {
				t.Errorf("%s conflicting copy of a %s record changed its row (%s → %s)", mode.name, st, before, after)
			}
		}
	}
}

// TestDuplicateDoesNotWaitForARedrive: a re-drive (FAILED_FINAL →
// FAILED_RETRYABLE) holds the record's row lock until it commits. A copy
// arriving meanwhile, in every mode, is answered from the committed
// FAILED_FINAL record as a duplicate without waiting for the re-drive (the
// copy came first); once the re-drive commits, the next copy runs the
// handler. A copy that locked the record would wait for the re-drive's
// commit, which comes only after the copy returns: it would run into its
// deadline instead.
func TestDuplicateDoesNotWaitForARedrive(t *testing.T) {
	e := newEnv(t, nil)
	for _, mode := range copyModes {
		id := "m-redrive-" + mode.name
		e.finish(id, `{"n":1}`, dedup.StatusFailedFinal)

		redrive, err := e.pool.Begin(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if tag, err := redrive.Exec(e.ctx, e.store.q.redriveRecordSQL, e.scope, id); err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("re-drive %s: %v, %v", id, tag, err)
		}

		var ran atomic.Int32
		ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
		res, err := mode.deliver(ctx, e.store, e.msg(id, "", `{"n":1}`), &ran)
		cancel()
		if err != nil || res.Outcome != dedup.OutcomeDuplicate || res.Status != dedup.StatusFailedFinal || ran.Load() != 0 {
			_ = redrive.Rollback(e.ctx)
			t.Fatalf("%s copy during a re-drive: %+v, %v, handler ran %d times; want a duplicate of the FAILED_FINAL record, at once", mode.name, res, err, ran.Load())
		}
		if _, err := redrive.Exec(e.ctx, e.store.q.redriveDeadLettersSQL, e.scope, id); err != nil {
			t.Fatal(err)
		}
		if err := redrive.Commit(e.ctx); err != nil {
			t.Fatal(err)
		}

		if mode.name == "reject" {
			continue
		}
		res, err = mode.deliver(e.ctx, e.store, e.msg(id, "", `{"n":1}`), &ran)
		if err != nil || res.Outcome != dedup.OutcomeProcessed || ran.Load() != 1 {
			t.Fatalf("%s copy after the re-drive: %+v, %v, handler ran %d times; want it processed", mode.name, res, err, ran.Load())
		}
	}
}

// TestCopyWaitingOnALockSeesTheFinishedRecord: a copy that finds a
// FAILED_RETRYABLE record waits for the row lock of the copy running it.
// When that one finishes the record (SUCCEEDED), the waiting copy does not
// run the handler again: it reads the record again and answers a duplicate
// (its locking read skips a record that became terminal, and the claim
// looks once more).
func TestCopyWaitingOnALockSeesTheFinishedRecord(t *testing.T) {
	e := newEnv(t, nil)
	for _, mode := range copyModes[:3] { // reject: a bad-input copy of a FAILED_RETRYABLE record is marked, by design
		id := "m-wait-" + mode.name
		res, err := e.store.Process(e.ctx, e.msg(id, "", `{"n":1}`), func(context.Context, pgx.Tx, *dedup.Message) error {
			return errors.New("retry me")
		})
		if err != nil || res.Status != dedup.StatusFailedRetryable {
			t.Fatalf("first run of %s: %+v, %v", id, res, err)
		}

		owner, err := e.pool.Begin(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := owner.Exec(e.ctx, `update `+e.records()+` set status = 'SUCCEEDED', expires_at = now() + interval '1 hour'
where scope = $1 and message_id = $2`, e.scope, id); err != nil {
			t.Fatal(err)
		}

		app := "idemq_wait_" + randomHex(4)
		waiting := e.newStore(e.newPool(func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["application_name"] = app }), nil)
		var ran atomic.Int32
		type answer struct {
			res dedup.Result
			err error
		}
		done := make(chan answer, 1)
		go func() {
			res, err := mode.deliver(e.ctx, waiting, e.msg(id, "", `{"n":1}`), &ran)
			done <- answer{res, err}
		}()
		e.eventually("the "+mode.name+" copy to wait on the record's lock", func() bool { return e.lockWaiters(app) > 0 })
		if err := owner.Commit(e.ctx); err != nil {
			t.Fatal(err)
		}
		a := <-done
		if a.err != nil || a.res.Outcome != dedup.OutcomeDuplicate || a.res.Status != dedup.StatusSucceeded || ran.Load() != 0 {
			t.Fatalf("%s copy that waited for the finishing copy: %+v, %v, handler ran %d times; want a duplicate", mode.name, a.res, a.err, ran.Load())
		}
	}
}
