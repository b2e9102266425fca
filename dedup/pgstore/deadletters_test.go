package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/outbox"
	"github.com/jackc/pgx/v5"
)

// dl is the quoted dead-letter table of the test's schema.
func (e *storeEnv) dl() string { return pgx.Identifier{e.schema, "dead_letters"}.Sanitize() }

// seedDeadLetters writes n dead letters of scope with reason, created age
// ago (a Postgres interval), message IDs prefix1..prefixN, and, when status
// is not "", a record of each in that status.
func (e *storeEnv) seedDeadLetters(scope, prefix, reason, age string, n int, status dedup.Status) {
	e.t.Helper()
	if status != "" {
		e.exec(`insert into `+e.records()+` (scope, message_id, fingerprint, fingerprint_key_id, status, attempts, expires_at, created_at)
			select $1, $2 || g, '\x01'::bytea, 'k1', $3, 3, case when $3 in ('SUCCEEDED', 'FAILED_FINAL') then now() + interval '7 days' end,
			  now() - $5::interval
			from generate_series(1, $4::int) g`, scope, prefix, string(status), n, age)
	}
	e.exec(`insert into `+e.dl()+` (scope, message_id, reason, error, attempts, topic, message_key, payload, headers, source, created_at)
		select $1, $2 || g, $3, 'boom ' || g, 3, 'orders', convert_to('key-' || g, 'UTF8'), convert_to('payload-' || g, 'UTF8'),
		  jsonb_build_object('message-id', $2 || g, 'trace', 't' || g), 'kafka:orders/0/' || g, now() - $5::interval
		from generate_series(1, $4::int) g`, scope, prefix, reason, n, age)
}

// scanAll walks f page by page (f.Limit per page), failing on a page out of
// order or over the limit.
func (e *storeEnv) scanAll(f dedup.DeadLetterFilter) []dedup.DeadLetter {
	e.t.Helper()
	var out []dedup.DeadLetter
	for {
		page, err := e.store.ScanDeadLetters(e.ctx, f)
		if err != nil {
			e.t.Fatalf("ScanDeadLetters(%+v): %v", f, err)
		}
		if len(page) > f.PageSize() {
			e.t.Fatalf("page of %d, limit %d", len(page), f.PageSize())
		}
		if len(page) == 0 {
			return out
		}
		for _, d := range page {
			if d.ID <= f.AfterID {
				e.t.Fatalf("dead letter %d after cursor %d: not in ID order", d.ID, f.AfterID)
			}
			f.AfterID = d.ID
		}
		out = append(out, page...)
	}
}

func ids(ds []dedup.DeadLetter) []int64 {
	out := make([]int64, len(ds))
	for i, d := range ds {
		out[i] = d.ID
	}
	return out
}

// ScanDeadLetters pages (keyset by ID) through exactly the dead letters each
// filter selects, by scope, scope prefix, reason, time range and re-drive
// state, alone and combined; CountDeadLetters counts the same; DeadLetter
// reads one by ID, whole, and ErrNotFound names a missing one.
func TestScanDeadLettersFilters(t *testing.T) {
	e := newOwnSchemaEnv(t, nil)
	e.seedDeadLetters("kafka|pay", "old-", dedup.ReasonAttemptsExhausted, "3 days", 7, dedup.StatusFailedFinal)
	e.seedDeadLetters("kafka|pay", "new-", dedup.ReasonPermanentError, "1 hour", 5, dedup.StatusFailedFinal)
	e.seedDeadLetters("kafka|pay", "cf-", dedup.ReasonPayloadConflict, "2 hours", 3, "")
	e.seedDeadLetters("kafka|ship", "bad-", dedup.ReasonBadInput, "2 days", 4, dedup.StatusFailedFinal)
	e.seedDeadLetters("http|orders", "h-", dedup.ReasonPermanentError, "5 hours", 6, dedup.StatusFailedFinal)
	e.exec(`update ` + e.dl() + ` set redriven_at = now() where message_id in ('old-1', 'old-2', 'h-3')`)

	all := e.scanAll(dedup.DeadLetterFilter{Limit: 4})
	if len(all) != 25 {
		t.Fatalf("%d dead letters in all, want 25", len(all))
	}
	var now time.Time
	if err := e.pool.QueryRow(e.ctx, "select now()").Scan(&now); err != nil {
		t.Fatal(err)
	}
	yes, no := true, false
	for _, c := range []struct {
		f    dedup.DeadLetterFilter
		want int
	}{
		{dedup.DeadLetterFilter{Scope: "kafka|pay"}, 15},
		{dedup.DeadLetterFilter{Scope: "kafka|"}, 0},
		{dedup.DeadLetterFilter{ScopePrefix: "kafka|"}, 19},
		{dedup.DeadLetterFilter{ScopePrefix: "http|", Redriven: &no}, 5},
		{dedup.DeadLetterFilter{Reason: dedup.ReasonPermanentError}, 11},
		{dedup.DeadLetterFilter{Scope: "kafka|pay", Reason: dedup.ReasonAttemptsExhausted, Redriven: &no}, 5},
		{dedup.DeadLetterFilter{Redriven: &yes}, 3},
		{dedup.DeadLetterFilter{Since: now.Add(-6 * time.Hour)}, 14},
		{dedup.DeadLetterFilter{Until: now.Add(-24 * time.Hour)}, 11},
		{dedup.DeadLetterFilter{Since: now.Add(-4 * 24 * time.Hour), Until: now.Add(-36 * time.Hour), Scope: "kafka|ship"}, 4},
		{dedup.DeadLetterFilter{ScopePrefix: "kafka|", Reason: dedup.ReasonPermanentError, Since: now.Add(-90 * time.Minute)}, 5},
	} {
		var want []int64
		for _, d := range all {
			if c.f.Match(d) {
				want = append(want, d.ID)
			}
		}
		if len(want) != c.want {
			t.Fatalf("%+v: Match selects %d of the seeded dead letters, the test expects %d", c.f, len(want), c.want)
		}
		for _, limit := range []int{1, 3, 0} {
			f := c.f
			f.Limit = limit
			if got := ids(e.scanAll(f)); !slices.Equal(got, want) {
				t.Fatalf("ScanDeadLetters(%+v) pages: %v, want %v", f, got, want)
			}
		}
		f := c.f
		f.AfterID, f.Limit = 999999, 1 // ignored by CountDeadLetters
		if n, err := e.store.CountDeadLetters(e.ctx, f); err != nil || n != int64(c.want) {
			t.Fatalf("CountDeadLetters(%+v) = %d, %v; want %d", c.f, n, err, c.want)
		}
	}
	// A cursor in the middle continues after it.
	if got := ids(e.scanAll(dedup.DeadLetterFilter{AfterID: all[9].ID, Limit: 7})); !slices.Equal(got, ids(all[10:])) {
		t.Fatalf("from cursor %d: %v, want %v", all[9].ID, got, ids(all[10:]))
	}

	d, err := e.store.DeadLetter(e.ctx, all[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if d.Scope != "kafka|pay" || d.MessageID != "old-1" || string(d.Payload) != "payload-1" || string(d.Key) != "key-1" ||
		d.Headers["trace"] != "t1" || d.Error != "boom 1" || d.Attempts != 3 || d.Topic != "orders" || d.RedrivenAt == nil || d.CreatedAt.IsZero() {
		t.Fatalf("DeadLetter(%d) = %+v", all[0].ID, d)
	}
	if _, err := e.store.DeadLetter(e.ctx, all[len(all)-1].ID+100); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("DeadLetter of a missing ID: %v, want ErrNotFound", err)
	}
	for _, f := range []dedup.DeadLetterFilter{{AfterID: -1}, {Limit: 10001}, {Since: now, Until: now.Add(-time.Hour)}, {Scope: "a", ScopePrefix: "b"}} {
		if _, err := e.store.ScanDeadLetters(e.ctx, f); !errors.Is(err, dedup.ErrInvalidConfig) {
			t.Fatalf("ScanDeadLetters(%+v): %v, want ErrInvalidConfig", f, err)
		}
	}
}

// recordStatuses counts the records of scope by status.
func (e *storeEnv) recordStatuses(scope string) map[dedup.Status]int {
	e.t.Helper()
	rows, err := e.pool.Query(e.ctx, `select status, count(*)::int from `+e.records()+` where scope = $1 group by status`, scope)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[dedup.Status]int{}
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			e.t.Fatal(err)
		}
		out[dedup.Status(st)] = n
	}
	return out
}

// RedriveDeadLetters re-drives in bulk by scope, by reason and by time range:
// exactly the FAILED_FINAL records of the matching dead letters become
// FAILED_RETRYABLE and their dead letters are stamped; a dry run changes
// nothing; a second run re-drives nothing; conflicts, records gone and
// records no longer FAILED_FINAL are skipped; progress is reported per
// batch.
func TestRedriveDeadLetters(t *testing.T) {
	e := newOwnSchemaEnv(t, nil)
	e.seedDeadLetters("a", "ex-", dedup.ReasonAttemptsExhausted, "3 days", 30, dedup.StatusFailedFinal)
	e.seedDeadLetters("a", "pe-", dedup.ReasonPermanentError, "1 hour", 20, dedup.StatusFailedFinal)
	e.seedDeadLetters("a", "cf-", dedup.ReasonPayloadConflict, "1 hour", 4, dedup.StatusFailedFinal) // records of another message: never touched
	e.seedDeadLetters("a", "gone-", dedup.ReasonAttemptsExhausted, "1 hour", 3, "")
	e.seedDeadLetters("a", "ok-", dedup.ReasonAttemptsExhausted, "1 hour", 2, dedup.StatusSucceeded)
	e.seedDeadLetters("b", "ex-", dedup.ReasonAttemptsExhausted, "2 days", 10, dedup.StatusFailedFinal)
	// A record with two dead letters (permanent error, then bad input) is
	// released once.
	e.exec(`insert into ` + e.dl() + ` (scope, message_id, reason, created_at) values ('b', 'ex-1', 'bad_input', now() - interval '2 days')`)

	var now time.Time
	if err := e.pool.QueryRow(e.ctx, "select now()").Scan(&now); err != nil {
		t.Fatal(err)
	}
	stamped := func(scope string) int {
		return e.count(`select count(*) from `+e.dl()+` where scope = $1 and redriven_at is not null`, scope)
	}

	// Dry run: counts, changes nothing.
	sum, err := e.store.RedriveDeadLetters(e.ctx, dedup.DeadLetterFilter{Scope: "a"}, dedup.RedriveOptions{DryRun: true, Batch: 7})
	if err != nil || sum != (dedup.RedriveSummary{Matched: 59, Redriven: 0, Skipped: 9}) {
		t.Fatalf("dry run: %+v, %v; want 59 matched, 9 skipped (50 would be re-driven)", sum, err)
	}
	if st := e.recordStatuses("a"); st[dedup.StatusFailedFinal] != 54 || st[dedup.StatusFailedRetryable] != 0 || stamped("a") != 0 {
		t.Fatalf("after the dry run: %v, %d stamped; want nothing changed", st, stamped("a"))
	}

	// By reason and time range: the permanent errors of the last 2 hours.
	var progress [][2]int64
	sum, err = e.store.RedriveDeadLetters(e.ctx, dedup.DeadLetterFilter{Scope: "a", Reason: dedup.ReasonPermanentError, Since: now.Add(-2 * time.Hour)},
		dedup.RedriveOptions{Batch: 6, Operator: "ops", Progress: func(done, matched int64) { progress = append(progress, [2]int64{done, matched}) }})
	if err != nil || sum != (dedup.RedriveSummary{Matched: 20, Redriven: 20}) {
		t.Fatalf("by reason: %+v, %v; want 20 re-driven", sum, err)
	}
	if want := [][2]int64{{6, 20}, {12, 20}, {18, 20}, {20, 20}}; !slices.Equal(progress, want) {
		t.Fatalf("progress %v, want %v", progress, want)
	}
	if n := e.count(`select count(*) from ` + e.records() + ` where scope = 'a' and status = 'FAILED_RETRYABLE' and starts_with(message_id, 'pe-') and expires_at is null`); n != 20 {
		t.Fatalf("%d permanent-error records released, want 20", n)
	}
	if stamped("a") != 20 {
		t.Fatalf("%d dead letters stamped, want 20", stamped("a"))
	}

	// By time range alone, older than a day, across scopes: a's exhausted
	// ones and b's.
	sum, err = e.store.RedriveDeadLetters(e.ctx, dedup.DeadLetterFilter{Until: now.Add(-24 * time.Hour)}, dedup.RedriveOptions{Batch: 4})
	if err != nil || sum != (dedup.RedriveSummary{Matched: 41, Redriven: 40, Skipped: 1}) {
		t.Fatalf("by time range: %+v, %v; want 41 matched, 40 re-driven, b/ex-1's second dead letter skipped", sum, err)
	}
	if st := e.recordStatuses("b"); st[dedup.StatusFailedRetryable] != 10 || stamped("b") != 11 {
		t.Fatalf("scope b: %v, %d stamped; want 10 released, 11 stamped", st, stamped("b"))
	}

	// By scope: what is left in a is skipped (conflicts, no record, not
	// FAILED_FINAL, already re-driven); nothing new is re-driven.
	sum, err = e.store.RedriveDeadLetters(e.ctx, dedup.DeadLetterFilter{Scope: "a"}, dedup.RedriveOptions{})
	if err != nil || sum != (dedup.RedriveSummary{Matched: 59, Redriven: 0, Skipped: 59}) {
		t.Fatalf("second run over a: %+v, %v; want 59 matched, 0 re-driven", sum, err)
	}
	if n := e.count(`select count(*) from ` + e.records() + ` where scope = 'a' and starts_with(message_id, 'cf-') and status = 'FAILED_FINAL'`); n != 4 {
		t.Fatalf("a payload conflict's record was re-driven (%d of 4 left FAILED_FINAL)", n)
	}
	if n := e.count(`select count(*) from ` + e.records() + ` where scope = 'a' and starts_with(message_id, 'ok-') and status = 'SUCCEEDED'`); n != 2 {
		t.Fatal("a SUCCEEDED record was changed")
	}
	// Idempotent: the whole table again re-drives nothing.
	if sum, err := e.store.RedriveDeadLetters(e.ctx, dedup.DeadLetterFilter{}, dedup.RedriveOptions{}); err != nil || sum.Redriven != 0 || sum.Matched != 70 || sum.Skipped != 70 {
		t.Fatalf("third run: %+v, %v; want 70 matched, 0 re-driven", sum, err)
	}
	// A record that failed again has a new live dead letter: the next run
	// re-drives it, once.
	e.exec(`update ` + e.records() + ` set status = 'FAILED_FINAL' where scope = 'a' and message_id = 'pe-3'`)
	e.exec(`insert into ` + e.dl() + ` (scope, message_id, reason) values ('a', 'pe-3', 'permanent_error')`)
	if sum, err := e.store.RedriveDeadLetters(e.ctx, dedup.DeadLetterFilter{Scope: "a", Redriven: new(bool)}, dedup.RedriveOptions{}); err != nil || sum.Redriven != 1 {
		t.Fatalf("after a new failure: %+v, %v; want 1 re-driven", sum, err)
	}

	// A copy under another message ID that failed the record it matched by
	// business key: its dead letter re-drives that record; a payload
	// conflict of the same business key is neither re-driven nor stamped.
	e.exec(`insert into ` + e.records() + ` (scope, message_id, business_key, fingerprint, fingerprint_key_id, status, attempts)
		values ('bk', 'orig-1', 'pay-1', '\x01'::bytea, 'k1', 'FAILED_FINAL', 3)`)
	e.exec(`insert into ` + e.dl() + ` (scope, message_id, business_key, reason) values
		('bk', 'copy-1', 'pay-1', 'attempts_exhausted'), ('bk', 'copy-2', 'pay-1', 'payload_conflict')`)
	if sum, err := e.store.RedriveDeadLetters(e.ctx, dedup.DeadLetterFilter{Scope: "bk"}, dedup.RedriveOptions{DryRun: true}); err != nil || sum.Skipped != 1 {
		t.Fatalf("dry run by business key: %+v, %v; want 1 would be re-driven", sum, err)
	}
	if sum, err := e.store.RedriveDeadLetters(e.ctx, dedup.DeadLetterFilter{Scope: "bk"}, dedup.RedriveOptions{}); err != nil || sum != (dedup.RedriveSummary{Matched: 2, Redriven: 1, Skipped: 1}) {
		t.Fatalf("by business key: %+v, %v; want the record of orig-1 re-driven", sum, err)
	}
	if st := e.recordStatuses("bk"); st[dedup.StatusFailedRetryable] != 1 {
		t.Fatalf("record orig-1: %v, want FAILED_RETRYABLE", st)
	}
	if n := e.count(`select count(*) from ` + e.dl() + ` where scope = 'bk' and redriven_at is not null and message_id = 'copy-1'`); n != 1 {
		t.Fatal("the business-key copy's dead letter was not stamped")
	}
	if n := e.count(`select count(*) from ` + e.dl() + ` where scope = 'bk' and redriven_at is not null and message_id = 'copy-2'`); n != 0 {
		t.Fatal("the payload conflict of the business key was stamped re-driven")
	}

	for _, o := range []dedup.RedriveOptions{{Batch: -1}, {Batch: 10001}, {Operator: "a\x00"}} {
		if _, err := e.store.RedriveDeadLetters(e.ctx, dedup.DeadLetterFilter{}, o); !errors.Is(err, dedup.ErrInvalidConfig) {
			t.Fatalf("RedriveDeadLetters(%+v): %v, want ErrInvalidConfig", o, err)
		}
	}
	if _, err := e.store.RedriveDeadLetters(e.ctx, dedup.DeadLetterFilter{AfterID: -1}, dedup.RedriveOptions{}); err != nil {
		t.Fatalf("RedriveDeadLetters ignores AfterID: %v", err)
	}
}

// Four RedriveDeadLetters over the same dead letters at once release every
// record exactly once in total: the Redriven counts add up to the records,
// each dead letter is stamped, and no run fails (no deadlock, no wait).
func TestRedriveDeadLettersConcurrent(t *testing.T) {
	e := newOwnSchemaEnv(t, nil)
	const n = 1500
	e.seedDeadLetters("c", "m-", dedup.ReasonAttemptsExhausted, "1 hour", n, dedup.StatusFailedFinal)
	// A second dead letter for every tenth record: one record, two rows.
	e.exec(`insert into ` + e.dl() + ` (scope, message_id, reason) select 'c', 'm-' || g, 'permanent_error' from generate_series(10, ` + fmt.Sprint(n) + `, 10) g`)
	var wg sync.WaitGroup
	sums := make([]dedup.RedriveSummary, 4)
	errs := make([]error, 4)
	for i := range sums {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f := dedup.DeadLetterFilter{Scope: "c"}
			if i%2 == 1 {
				f = dedup.DeadLetterFilter{} // a different walk over the same rows
			}
			sums[i], errs[i] = e.store.RedriveDeadLetters(e.ctx, f, dedup.RedriveOptions{Batch: 25 + 10*i})
		}()
	}
	wg.Wait()
	var redriven int64
	for i := range sums {
		if errs[i] != nil {
			t.Fatalf("run %d: %v", i, errs[i])
		}
		if sums[i].Matched != sums[i].Redriven+sums[i].Skipped {
			t.Fatalf("run %d: %+v does not add up", i, sums[i])
		}
		redriven += sums[i].Redriven
	}
	if redriven != n {
		t.Fatalf("runs re-drove %d records in total (%+v), want exactly %d", redriven, sums, n)
	}
	if st := e.recordStatuses("c"); st[dedup.StatusFailedRetryable] != n {
		t.Fatalf("records %v, want %d FAILED_RETRYABLE", st, n)
	}
	if left := e.count(`select count(*) from ` + e.dl() + ` where redriven_at is null`); left != 0 {
		t.Fatalf("%d dead letters not stamped", left)
	}
	if sum, err := e.store.RedriveDeadLetters(e.ctx, dedup.DeadLetterFilter{}, dedup.RedriveOptions{}); err != nil || sum.Redriven != 0 {
		t.Fatalf("a run after them: %+v, %v; want 0 re-driven", sum, err)
	}
}

// capturePub is an outbox.Publisher keeping what it acknowledges.
type capturePub struct {
	mu   sync.Mutex
	envs []outbox.Envelope
}

func (c *capturePub) Publish(_ context.Context, envs []outbox.Envelope) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.envs = append(c.envs, envs...)
	return nil
}

// RepublishDeadLetter writes one outbox row per dead letter, destination and
// message-ID choice, sequentially and concurrently (a repeat returns
// Already and the first row, adding none); the row carries the dead letter's
// message ID or the derived one, its payload, key and headers (the old
// message-ID header dropped), and the relay publishes it under that message
// ID. A purge deletes a republished dead letter with its audit rows.
func TestRepublishDeadLetter(t *testing.T) {
	e := newOwnSchemaEnv(t, nil)
	ob, err := outbox.New(e.pool, outbox.Config{Schema: e.schema, Table: "events_out"})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.seedDeadLetters("r", "m-", dedup.ReasonAttemptsExhausted, "40 days", 2, dedup.StatusFailedFinal)
	all := e.scanAll(dedup.DeadLetterFilter{Scope: "r"})
	outboxRows := func() int {
		return e.count(`select count(*) from ` + pgx.Identifier{e.schema, "events_out"}.Sanitize())
	}

	first, err := e.store.RepublishDeadLetter(e.ctx, all[0].ID, RepublishOptions{Outbox: ob, Operator: "ops"})
	if err != nil || first.Already || first.MessageID != "m-1" || first.OutboxID == "" {
		t.Fatalf("first republish: %+v, %v", first, err)
	}
	again, err := e.store.RepublishDeadLetter(e.ctx, all[0].ID, RepublishOptions{Outbox: ob})
	if err != nil || !again.Already || again != (RepublishResult{OutboxID: first.OutboxID, MessageID: "m-1", Already: true}) {
		t.Fatalf("second republish: %+v, %v; want Already with the first row", again, err)
	}
	if n := outboxRows(); n != 1 {
		t.Fatalf("%d outbox rows after two republishes, want 1", n)
	}
	asNew, err := e.store.RepublishDeadLetter(e.ctx, all[0].ID, RepublishOptions{Outbox: ob, NewMessageID: true})
	if err != nil || asNew.Already || asNew.MessageID != dedup.RedriveAsNewID("m-1", all[0].ID) || asNew.OutboxID == first.OutboxID {
		t.Fatalf("republish with a new message ID: %+v, %v", asNew, err)
	}
	other, err := e.store.RepublishDeadLetter(e.ctx, all[0].ID, RepublishOptions{Outbox: ob, Topic: "orders-replay"})
	if err != nil || other.Already || other.MessageID != "m-1" {
		t.Fatalf("republish to another topic: %+v, %v", other, err)
	}
	if n := outboxRows(); n != 3 {
		t.Fatalf("%d outbox rows, want 3 (same ID, new ID, other topic)", n)
	}

	// Concurrent: eight calls for the second dead letter, one row.
	var wg sync.WaitGroup
	res := make([]RepublishResult, 8)
	errs := make([]error, 8)
	for i := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = e.store.RepublishDeadLetter(e.ctx, all[1].ID, RepublishOptions{Outbox: ob, NewMessageID: true})
		}()
	}
	wg.Wait()
	created := 0
	for i := range res {
		if errs[i] != nil {
			t.Fatalf("concurrent republish %d: %v", i, errs[i])
		}
		if !res[i].Already {
			created++
		}
		if res[i].OutboxID != res[0].OutboxID || res[i].MessageID != dedup.RedriveAsNewID("m-2", all[1].ID) {
			t.Fatalf("concurrent republish %d: %+v, others %+v", i, res[i], res[0])
		}
	}
	if created != 1 || outboxRows() != 4 {
		t.Fatalf("%d of 8 concurrent republishes wrote a row, %d outbox rows; want 1 and 4", created, outboxRows())
	}

	// The relay publishes each row under its chosen message ID.
	pub := &capturePub{}
	relay, err := outbox.NewRelay(ob, pub, outbox.RelayConfig{Name: "republish-test", DisablePurge: true})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := relay.RunOnce(e.ctx); err != nil || r.Published != 4 {
		t.Fatalf("relay: %+v, %v; want 4 published", r, err)
	}
	want := map[string]string{first.OutboxID: "m-1", asNew.OutboxID: asNew.MessageID, other.OutboxID: "m-1", res[0].OutboxID: res[0].MessageID}
	wantTopic := map[string]string{first.OutboxID: "orders", asNew.OutboxID: "orders", other.OutboxID: "orders-replay", res[0].OutboxID: "orders"}
	for _, env := range pub.envs {
		id := env.ID.String()
		if env.Headers["message-id"] != want[id] || env.Topic != wantTopic[id] || env.Headers["trace"] == "" || string(env.Payload[:8]) != "payload-" || string(env.Key[:4]) != "key-" {
			t.Fatalf("published %s: topic %s headers %v payload %q key %q; want message-id %q on %s", id, env.Topic, env.Headers, env.Payload, env.Key, want[id], wantTopic[id])
		}
	}

	// Errors.
	if _, err := e.store.RepublishDeadLetter(e.ctx, all[1].ID+1000, RepublishOptions{Outbox: ob}); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("republish of a missing dead letter: %v, want ErrNotFound", err)
	}
	if _, err := e.store.RepublishDeadLetter(e.ctx, all[1].ID, RepublishOptions{}); !errors.Is(err, dedup.ErrInvalidConfig) {
		t.Fatalf("republish without an outbox: %v, want ErrInvalidConfig", err)
	}
	if _, err := e.store.RepublishDeadLetter(e.ctx, all[1].ID, RepublishOptions{Outbox: ob, Topic: "bad\x00topic"}); !errors.Is(err, dedup.ErrInvalidConfig) || !strings.Contains(err.Error(), "RepublishOptions.Topic") {
		t.Fatalf("republish to an invalid topic: %v, want ErrInvalidConfig naming RepublishOptions.Topic", err)
	}

	// Purge deletes the (old) republished dead letters with their audit rows.
	n, err := e.store.PurgeDeadLetters(e.ctx, PurgeOptions{OlderThan: 30 * 24 * time.Hour})
	if err != nil || n != 2 {
		t.Fatalf("purge: %d, %v; want 2", n, err)
	}
	if left := e.count(`select count(*) from ` + pgx.Identifier{e.schema, "dead_letters_republishes"}.Sanitize()); left != 0 {
		t.Fatalf("%d republish audit rows left after the purge", left)
	}
}
