package pgstore

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

var testSum = []byte("0123456789abcdef0123456789abcdef")

func TestSQLClaimInsertOnConflict(t *testing.T) {
	b := setup(t)
	m1 := b.msg("m-1", "bk-1")
	id := b.insert(t, newRecord{msg: m1, sum: testSum, keyID: "k1", status: dedup.StatusProcessing, attempts: 1})
	if r := b.row(t, id); r.status != dedup.StatusProcessing || r.attempts != 1 || r.expiresIn != nil {
		t.Fatalf("new record %+v", r)
	}

	// A second copy by message ID inserts nothing and locks the record.
	again, rec, err := b.q.claimInsert(b.ctx, b.tx, newRecord{msg: m1, sum: testSum, keyID: "k1", status: dedup.StatusProcessing, attempts: 1}, false)
	if err != nil || again != 0 || rec == nil || rec.id != id || rec.status != dedup.StatusProcessing || rec.matchedBy(m1.Identity) != dedup.ByMessageID {
		t.Fatalf("duplicate by message ID: id %d, record %+v, %v", again, rec, err)
	}
	// claimInsert set the handler's savepoint: rolling back to it works.
	if _, err := b.tx.Exec(b.ctx, b.q.handlerRollbackSQL); err != nil {
		t.Fatalf("rollback to the handler's savepoint: %v", err)
	}

	// Another message ID with the same business key: a duplicate by
	// business key, and the record it matches is m-1's.
	m2 := b.msg("m-2", "bk-1")
	again, rec, err = b.q.claimInsert(b.ctx, b.tx, newRecord{msg: m2, sum: testSum, keyID: "k1", status: dedup.StatusProcessing, attempts: 1}, false)
	if err != nil || again != 0 || rec == nil || rec.id != id || rec.messageID != "m-1" || rec.matchedBy(m2.Identity) != dedup.ByBusinessKey {
		t.Fatalf("duplicate by business key: id %d, record %+v, %v", again, rec, err)
	}

	// An empty business key never conflicts.
	b.insert(t, newRecord{msg: b.msg("m-3", ""), sum: testSum, keyID: "k1", status: dedup.StatusProcessing, attempts: 1})
	b.insert(t, newRecord{msg: b.msg("m-4", ""), sum: testSum, keyID: "k1", status: dedup.StatusProcessing, attempts: 1})

	// The record matching the message ID wins over one matching only the
	// business key.
	other := b.insert(t, newRecord{msg: b.msg("m-5", "bk-5"), sum: testSum, keyID: "k1", status: dedup.StatusProcessing, attempts: 1})
	rec, err = b.q.lock(b.ctx, b.tx, dedup.Identity{Scope: b.scope, MessageID: "m-5", BusinessKey: "bk-1"})
	if err != nil || rec == nil || rec.id != other {
		t.Fatalf("lock (m-5, bk-1) = %+v, %v; want m-5's record %d", rec, err, other)
	}
	// No record: nil, no error.
	if rec, err := b.q.lock(b.ctx, b.tx, dedup.Identity{Scope: b.scope, MessageID: "none"}); rec != nil || err != nil {
		t.Fatalf("lock of nothing = %+v, %v", rec, err)
	}

	// A SUCCEEDED insert (atomic mode's claim) carries its expiry, and an
	// error text is stored as given.
	okID := b.insert(t, newRecord{msg: b.msg("m-6", ""), sum: testSum, keyID: "k1", status: dedup.StatusSucceeded, attempts: 1, expirySecs: secs(time.Hour)})
	if r := b.row(t, okID); r.status != dedup.StatusSucceeded || r.expiresIn == nil || *r.expiresIn < 3500 || *r.expiresIn > 3600 {
		t.Fatalf("SUCCEEDED insert %+v", r)
	}
}

func TestSQLReclaimAndMarkSucceeded(t *testing.T) {
	b := setup(t)
	m := b.msg("m-1", "")
	id := b.insert(t, newRecord{msg: m, sum: testSum, keyID: "k1", status: dedup.StatusFailedRetryable, attempts: 1, errText: "boom", errClass: "handler"})
	if r := b.row(t, id); r.lastError != "boom" {
		t.Fatalf("record %+v", r)
	}
	// markSucceeded only moves a PROCESSING record.
	if err := b.q.markSucceeded(b.ctx, b.tx, m.Identity, id, 60); err == nil || !strings.Contains(err.Error(), "0 records in PROCESSING") {
		t.Fatalf("markSucceeded of a FAILED_RETRYABLE record: %v", err)
	}
	attempts, err := b.q.reclaim(b.ctx, b.tx, id, m)
	if err != nil || attempts != 2 {
		t.Fatalf("reclaim: attempts %d, %v", attempts, err)
	}
	// Only a FAILED_RETRYABLE record is reclaimed.
	if _, err := b.q.reclaim(b.ctx, b.tx, id, m); err == nil {
		t.Fatal("reclaim of a PROCESSING record succeeded")
	}
}

func TestSQLMarkSucceeded(t *testing.T) {
	b := setup(t)
	m := b.msg("m-1", "")
	id := b.insert(t, newRecord{msg: m, sum: testSum, keyID: "k1", status: dedup.StatusProcessing, attempts: 1})
	if err := b.q.markSucceeded(b.ctx, b.tx, m.Identity, id, 120); err != nil {
		t.Fatal(err)
	}
	if r := b.row(t, id); r.status != dedup.StatusSucceeded || r.expiresIn == nil || *r.expiresIn < 100 || *r.expiresIn > 120 {
		t.Fatalf("after markSucceeded: %+v", r)
	}
	if err := b.q.markSucceeded(b.ctx, b.tx, m.Identity, id, 120); err == nil {
		t.Fatal("a second markSucceeded succeeded")
	}
}

func TestSQLUpdateFailed(t *testing.T) {
	b := setup(t)
	m := b.msg("m-1", "")
	id := b.insert(t, newRecord{msg: m, sum: testSum, keyID: "k1", status: dedup.StatusProcessing, attempts: 1})
	// The claim counted the attempt: the mark does not count it again.
	if err := b.q.updateFailed(b.ctx, b.tx, failureMark{rowID: id, status: dedup.StatusFailedRetryable, attempt: attemptCounted,
		msg: m, errText: "first", errClass: "handler"}); err != nil {
		t.Fatal(err)
	}
	if r := b.row(t, id); r.status != dedup.StatusFailedRetryable || r.attempts != 1 || r.lastError != "first" || r.expiresIn != nil {
		t.Fatalf("after a counted mark: %+v", r)
	}
	// A mark after the handler's transaction rolled back counts a new one.
	if err := b.q.updateFailed(b.ctx, b.tx, failureMark{rowID: id, status: dedup.StatusFailedFinal, attempt: attemptNew,
		msg: m, errText: "second", errClass: "permanent", expirySecs: secs(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if r := b.row(t, id); r.status != dedup.StatusFailedFinal || r.attempts != 2 || r.lastError != "second" || r.expiresIn == nil {
		t.Fatalf("after a new-attempt mark: %+v", r)
	}
}

func TestSQLDeadLetterInsert(t *testing.T) {
	b := setup(t)
	m := b.msg("m-1", "bk-1")
	d := deadLetterRow{msg: m, sum: testSum, reason: dedup.ReasonPermanentError, cause: errors.New(strings.Repeat("x", 5000)), attempts: 3}
	id, err := b.q.insertDeadLetter(b.ctx, b.tx, d)
	if err != nil || id == 0 {
		t.Fatalf("dead letter: %d, %v", id, err)
	}
	// The same message, reason and fingerprint write one live dead letter.
	if again, err := b.q.insertDeadLetter(b.ctx, b.tx, d); err != nil || again != 0 {
		t.Fatalf("repeated dead letter: %d, %v; want 0", again, err)
	}
	if live, err := b.q.liveDeadLetterID(b.ctx, b.tx, m, testSum, dedup.ReasonPermanentError); err != nil || live != id {
		t.Fatalf("live dead letter %d, %v; want %d", live, err, id)
	}
	// Another reason is another dead letter; the class is given or derived.
	d2 := d
	d2.reason, d2.class = dedup.ReasonAttemptsExhausted, classExecutionLost
	id2, err := b.q.insertDeadLetter(b.ctx, b.tx, d2)
	if err != nil || id2 == 0 || id2 == id {
		t.Fatalf("second reason: %d, %v", id2, err)
	}
	var errText, class, topic string
	var attempts int
	var headers map[string]string
	if err := b.tx.QueryRow(b.ctx, `select error, error_class, topic, attempts, headers from `+b.q.tables["dead_letters"].(string)+` where id = $1`, id2).
		Scan(&errText, &class, &topic, &attempts, &headers); err != nil {
		t.Fatal(err)
	}
	if len(errText) > dbStore.cfg.MaxErrorBytes || class != classExecutionLost || topic != "orders" || attempts != 3 || headers["h"] != "v" {
		t.Fatalf("dead letter row: %d bytes of error, class %q, topic %q, attempts %d, headers %v", len(errText), class, topic, attempts, headers)
	}
	// Re-driven dead letters are not live: a new one may be written.
	if _, err := b.tx.Exec(b.ctx, b.q.redriveDeadLettersSQL, b.scope, "m-1"); err != nil {
		t.Fatal(err)
	}
	if live, err := b.q.liveDeadLetterID(b.ctx, b.tx, m, testSum, dedup.ReasonPermanentError); err != nil || live != 0 {
		t.Fatalf("live dead letter after re-drive: %d, %v; want 0", live, err)
	}
	if id3, err := b.q.insertDeadLetter(b.ctx, b.tx, d); err != nil || id3 == 0 {
		t.Fatalf("dead letter after re-drive: %d, %v", id3, err)
	}
}

// leaseMark runs one of the marks that end a lease and returns (marked,
// marked before).
func (b *dbBundle) leaseMark(t *testing.T, sql string, args ...any) (marked, before bool) {
	t.Helper()
	if err := b.tx.QueryRow(b.ctx, sql, args...).Scan(&marked, &before); err != nil {
		t.Fatal(err)
	}
	return marked, before
}

func TestSQLLeaseTakeBeatDone(t *testing.T) {
	b := setup(t)
	m := b.msg("m-1", "")
	owner1, owner2 := uuid.New(), uuid.New()
	var id int64
	if err := b.tx.QueryRow(b.ctx, b.q.leaseClaimSQL, b.scope, "m-1", "", testSum, "k1", "test", 0, owner1, 30.0).Scan(&id, nil, nil, nil, nil, nil, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	rec, live, err := b.q.lockLease(b.ctx, b.tx, m.Identity)
	if err != nil || rec == nil || rec.id != id || !live {
		t.Fatalf("lease lock: %+v, live %v, %v", rec, live, err)
	}
	beat := func(token uuid.UUID, fence int64) int64 {
		tag, err := b.tx.Exec(b.ctx, b.q.leaseBeatSQL, id, token, fence, 60.0)
		if err != nil {
			t.Fatal(err)
		}
		return tag.RowsAffected()
	}
	if beat(owner1, 1) != 1 || beat(owner2, 1) != 0 || beat(owner1, 2) != 0 {
		t.Fatal("a heartbeat is conditional on owner token and fence")
	}
	if r := b.row(t, id); r.leaseLiveIn == nil || *r.leaseLiveIn < 50 {
		t.Fatalf("heartbeat did not extend the lease: %+v", r)
	}

	// A takeover bumps the fence and the attempts and rotates the owner.
	var attempts int
	var fence int64
	if err := b.tx.QueryRow(b.ctx, b.q.leaseTakeSQL, id, owner2, 30.0, "test", 1).Scan(&attempts, &fence); err != nil || attempts != 2 || fence != 2 {
		t.Fatalf("take: attempts %d, fence %d, %v", attempts, fence, err)
	}
	if beat(owner1, 1) != 0 {
		t.Fatal("the old owner's heartbeat landed after a takeover")
	}
	// The old owner's completion is fenced; the new one's lands once, and
	// its repeat recognises the first run.
	if marked, before := b.leaseMark(t, b.q.leaseDoneSQL, id, owner1, 1, 60.0); marked || before {
		t.Fatal("the fenced owner's completion was made")
	}
	if marked, before := b.leaseMark(t, b.q.leaseDoneSQL, id, owner2, 2, 60.0); !marked || before {
		t.Fatalf("completion: marked %v, before %v", marked, before)
	}
	if marked, before := b.leaseMark(t, b.q.leaseDoneSQL, id, owner2, 2, 60.0); marked || !before {
		t.Fatalf("repeated completion: marked %v, before %v; want false, true", marked, before)
	}
	if r := b.row(t, id); r.status != dedup.StatusSucceeded || r.leaseLiveIn != nil || r.owner != owner2.String() || r.fence != 2 {
		t.Fatalf("after completion: %+v", r)
	}
}

func TestSQLLeaseFailAndRelease(t *testing.T) {
	b := setup(t)
	owner := uuid.New()
	claim := func(messageID string) int64 {
		var id int64
		if err := b.tx.QueryRow(b.ctx, b.q.leaseClaimSQL, b.scope, messageID, "", testSum, "k1", "test", 0, owner, 30.0).Scan(&id, nil, nil, nil, nil, nil, nil, nil, nil); err != nil {
			t.Fatal(err)
		}
		return id
	}
	failed := claim("m-fail")
	if marked, _ := b.leaseMark(t, b.q.leaseFailSQL, failed, uuid.New(), 1, string(dedup.StatusFailedFinal), "x", "handler", 60.0); marked {
		t.Fatal("a failure mark by another token was made")
	}
	if marked, before := b.leaseMark(t, b.q.leaseFailSQL, failed, owner, 1, string(dedup.StatusFailedFinal), "boom", "handler", 60.0); !marked || before {
		t.Fatalf("fail: marked %v, before %v", marked, before)
	}
	if marked, before := b.leaseMark(t, b.q.leaseFailSQL, failed, owner, 1, string(dedup.StatusFailedFinal), "boom", "handler", 60.0); marked || !before {
		t.Fatalf("repeated fail: marked %v, before %v", marked, before)
	}
	if r := b.row(t, failed); r.status != dedup.StatusFailedFinal || r.lastError != "boom" || r.expiresIn == nil {
		t.Fatalf("after fail: %+v", r)
	}
	// lease_own_exhaust finds a FAILED_FINAL record only under its token.
	var attempts int
	if err := b.tx.QueryRow(b.ctx, b.q.leaseOwnExhaustSQL, b.scope, "m-fail", "", tokenStrings([]uuid.UUID{owner})).Scan(&attempts); err != nil || attempts != 1 {
		t.Fatalf("own exhaust: %d, %v", attempts, err)
	}

	// Release gives the attempt back.
	released := claim("m-release")
	if marked, before := b.leaseMark(t, b.q.leaseReleaseSQL, released, owner, 1); !marked || before {
		t.Fatalf("release: marked %v, before %v", marked, before)
	}
	if r := b.row(t, released); r.status != dedup.StatusFailedRetryable || r.attempts != 0 || r.leaseLiveIn != nil {
		t.Fatalf("after release: %+v", r)
	}

	// lease_own_claim finds a PROCESSING claim by its owner token only.
	own := claim("m-own")
	var rowID int64
	var l dedup.Lease
	err := b.tx.QueryRow(b.ctx, b.q.leaseOwnClaimSQL, b.scope, "m-own", "", tokenStrings([]uuid.UUID{uuid.New(), owner}), 90.0).
		Scan(&rowID, &l.Record.MessageID, &l.Record.BusinessKey, &l.OwnerToken, &l.Attempt, &l.Fence)
	if err != nil || rowID != own || l.OwnerToken != owner || l.Fence != 1 {
		t.Fatalf("own claim: row %d, %+v, %v", rowID, l, err)
	}
	if r := b.row(t, own); r.leaseLiveIn == nil || *r.leaseLiveIn < 80 {
		t.Fatalf("own claim did not extend the lease: %+v", r)
	}
}

func TestSQLCrashLoopMarker(t *testing.T) {
	b := setup(t)
	advance := func(to int64) int64 {
		var prev int64
		if err := b.tx.QueryRow(b.ctx, b.q.laneWatermarkAdvanceSQL, b.scope, "p0", to).Scan(&prev); err != nil {
			t.Fatal(err)
		}
		return prev
	}
	if advance(100) != -1 || advance(50) != 100 || advance(200) != 100 || advance(0) != 200 {
		t.Fatal("a lane watermark starts at -1 and never goes down")
	}

	var id int64
	if err := b.tx.QueryRow(b.ctx, b.q.startMarkInsertSQL, b.scope, "m-1", "", testSum, "k1", "test", 0).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if r := b.row(t, id); r.status != dedup.StatusFailedRetryable || r.attempts != 0 || r.startMark == nil || *r.startMark != 0 {
		t.Fatalf("new start marker: %+v", r)
	}
	var rec record
	var status string
	var mark *int
	if err := b.tx.QueryRow(b.ctx, b.q.startMarkLockSQL, b.scope, "m-1", "").
		Scan(&rec.id, &rec.messageID, &rec.businessKey, &rec.fingerprint, &rec.keyID, &status, &rec.attempts, &mark); err != nil || rec.id != id {
		t.Fatalf("start marker lock: %+v, %v", rec, err)
	}
	// A run found dead: counted, with its error.
	if _, err := b.tx.Exec(b.ctx, b.q.startMarkSetSQL, id, 1, "died", classProcessDied); err != nil {
		t.Fatal(err)
	}
	if r := b.row(t, id); r.attempts != 1 || *r.startMark != 1 || r.lastError != "died" {
		t.Fatalf("after a death: %+v", r)
	}
	// Clear only withdraws the marker it wrote.
	tag, err := b.tx.Exec(b.ctx, b.q.startMarkClearSQL, id, 0)
	if err != nil || tag.RowsAffected() != 0 {
		t.Fatalf("clear of another marker: %d rows, %v", tag.RowsAffected(), err)
	}
	if tag, err = b.tx.Exec(b.ctx, b.q.startMarkClearSQL, id, 1); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("clear: %d rows, %v", tag.RowsAffected(), err)
	}
	// Exhausted by lost executions: FAILED_FINAL under the claim's token.
	owner := uuid.New()
	if _, err := b.tx.Exec(b.ctx, b.q.recordExhaustLostSQL, id, 5, "lost", classExecutionLost, 60.0, "test", 2, &owner); err != nil {
		t.Fatal(err)
	}
	if r := b.row(t, id); r.status != dedup.StatusFailedFinal || r.attempts != 5 || r.owner != owner.String() || r.startMark != nil {
		t.Fatalf("after exhaust: %+v", r)
	}
	// A replay of a final record is answered by one read.
	var mid string
	var fp []byte
	var keyID string
	if err := b.tx.QueryRow(b.ctx, b.q.replayPeekSQL, b.scope, "m-1", "").Scan(&mid, &fp, &keyID, &status, &rec.attempts); err != nil ||
		status != string(dedup.StatusFailedFinal) {
		t.Fatalf("replay peek: %s, %v", status, err)
	}
}

func TestSQLPurge(t *testing.T) {
	b := setup(t)
	expired := b.insert(t, newRecord{msg: b.msg("m-old", ""), sum: testSum, keyID: "k1", status: dedup.StatusSucceeded, attempts: 1, expirySecs: secs(-time.Minute)})
	kept := b.insert(t, newRecord{msg: b.msg("m-new", ""), sum: testSum, keyID: "k1", status: dedup.StatusSucceeded, attempts: 1, expirySecs: secs(time.Hour)})
	open := b.insert(t, newRecord{msg: b.msg("m-open", ""), sum: testSum, keyID: "k1", status: dedup.StatusFailedRetryable, attempts: 1})
	final := b.insert(t, newRecord{msg: b.msg("m-final", ""), sum: testSum, keyID: "k1", status: dedup.StatusFailedFinal, attempts: 1, expirySecs: secs(-time.Second)})
	// A step walks at most $2 records after id $1, up to id $3, and says
	// whether all of them were created less than $4 seconds ago.
	step := func(after int64, limit int, retention time.Duration) (last, deleted int64, young bool) {
		t.Helper()
		var l *int64
		if err := b.tx.QueryRow(b.ctx, b.q.purgeSQL, after, limit, final, retention.Seconds()).Scan(&l, &deleted, &young); err != nil || l == nil {
			t.Fatalf("purge step after %d: %v, %v", after, l, err)
		}
		return *l, deleted, young
	}
	// One record: the expired one, deleted.
	if last, deleted, young := step(expired-1, 1, time.Hour); last != expired || deleted != 1 || !young {
		t.Fatalf("first step: last %d deleted %d young %v; want %d, 1, true", last, deleted, young, expired)
	}
	// The rest (parallel tests' records may lie between ours): the expired
	// final record deleted, the live and the retryable ones kept. Created
	// now, they are young for a retention of an hour, not for none.
	if last, deleted, young := step(expired, 1000, 0); last != final || deleted < 1 || young {
		t.Fatalf("second step: last %d deleted %d young %v; want %d, ≥ 1, false", last, deleted, young, final)
	}
	var left []int64
	rows, err := b.tx.Query(b.ctx, `select id from `+b.q.tables["records"].(string)+` where scope = $1 order by id`, b.scope)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		left = append(left, id)
	}
	if rows.Err() != nil || len(left) != 2 || left[0] != kept || left[1] != open {
		t.Fatalf("left %v (expired %d, %d), want %d and %d: %v", left, expired, final, kept, open, rows.Err())
	}
	if _, deleted, young := step(kept-1, 1, time.Hour); deleted != 0 || !young {
		t.Fatalf("step over the live record: deleted %d young %v; want 0, true (the frontier)", deleted, young)
	}
	// Past the bound: nothing.
	var l *int64
	var deleted int64
	var young bool
	if err := b.tx.QueryRow(b.ctx, b.q.purgeSQL, final, 1000, final, 3600.0).Scan(&l, &deleted, &young); err != nil || l != nil || deleted != 0 {
		t.Fatalf("step past the bound: %v %d %v", l, deleted, err)
	}
}

func TestSQLRedriveAndLookup(t *testing.T) {
	b := setup(t)
	id := b.insert(t, newRecord{msg: b.msg("m-1", "bk-1"), sum: testSum, keyID: "k1", status: dedup.StatusFailedFinal, attempts: 5,
		errText: "boom", errClass: "handler", expirySecs: secs(time.Hour)})
	lookup := func(sql, key string) dedup.Record {
		var r dedup.Record
		var status string
		var lastErr, lastClass *string
		if err := b.tx.QueryRow(b.ctx, sql, b.scope, key).Scan(&r.Scope, &r.MessageID, &r.BusinessKey, &r.Fingerprint, &r.FingerprintKeyID,
			&status, &r.Attempts, &lastErr, &lastClass, &r.Fence, &r.Source, &r.ReconsumeTimes, &r.CreatedAt, &r.UpdatedAt, &r.ExpiresAt); err != nil {
			t.Fatalf("lookup %s: %v", key, err)
		}
		r.Status = dedup.Status(status)
		return r
	}
	for _, r := range []dedup.Record{lookup(b.q.lookupByMessageIDSQL, "m-1"), lookup(b.q.lookupByBusinessKeySQL, "bk-1")} {
		if r.Scope != b.scope || r.MessageID != "m-1" || r.BusinessKey != "bk-1" || r.Status != dedup.StatusFailedFinal || r.Attempts != 5 || r.Source != "test" {
			t.Fatalf("lookup: %+v", r)
		}
	}
	// An empty business key is never looked up.
	if err := b.tx.QueryRow(b.ctx, b.q.lookupByBusinessKeySQL, b.scope, "").Scan(new(string)); !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("lookup of an empty business key: %v", err)
	}
	tag, err := b.tx.Exec(b.ctx, b.q.redriveRecordSQL, b.scope, "m-1")
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("redrive: %d rows, %v", tag.RowsAffected(), err)
	}
	if r := b.row(t, id); r.status != dedup.StatusFailedRetryable || r.expiresIn != nil || r.attempts != 5 {
		t.Fatalf("after redrive: %+v", r)
	}
	if tag, err = b.tx.Exec(b.ctx, b.q.redriveRecordSQL, b.scope, "m-1"); err != nil || tag.RowsAffected() != 0 {
		t.Fatalf("a second redrive: %d rows, %v", tag.RowsAffected(), err)
	}
	var holder string
	if err := b.tx.QueryRow(b.ctx, b.q.businessKeyHolderSQL, b.scope, "bk-1").Scan(&holder); err != nil || holder != "m-1" {
		t.Fatalf("business key holder %q, %v", holder, err)
	}
}
