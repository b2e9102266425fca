package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/redis/go-redis/v9"
)

// Dead-letter tooling on the Redis-only store (redisstore.Store):
// filtered keyset scans, counts, bulk re-drive (RedrivenAt shows after it)
// and purge by age, on a real Redis, each test under a key prefix of its own.

// redisDLStream is the dead-letter stream of scope under prefix (the
// store's key layout: "<prefix>:{<sha256(scope)[:8] hex>}:dead_letters").
func redisDLStream(prefix, scope string) string {
	h := sha256.Sum256([]byte(scope))
	return prefix + ":{" + hex.EncodeToString(h[:8]) + "}:dead_letters"
}

// rsDeadLetters makes dead letters through the store: n permanent failures
// (message IDs prefix1..prefixN), each its own record FAILED_FINAL.
func rsDeadLetters(t *testing.T, s *redisstore.Store, scope, prefix string, n int) {
	t.Helper()
	ctx := context.Background()
	fail := func(context.Context, *dedup.Message) error { return dedup.Permanent(errors.New("poison")) }
	for i := 1; i <= n; i++ {
		m := msg(t, scope, fmt.Sprintf("%s%d", prefix, i), "", fmt.Sprintf(`{"n":%d}`, i))
		r, err := s.ProcessLeased(ctx, m, fail, dedup.LeaseOptions{TTL: 10 * time.Second})
		if err != nil || r.Outcome != dedup.OutcomeDeadLetter {
			t.Fatalf("%s/%s: %+v, %v; want a dead letter", scope, m.Identity.MessageID, r, err)
		}
	}
}

func rsScanAll(t *testing.T, s *redisstore.Store, f dedup.DeadLetterFilter) []dedup.DeadLetter {
	t.Helper()
	var out []dedup.DeadLetter
	for {
		page, err := s.ScanDeadLetters(context.Background(), f)
		if err != nil {
			t.Fatalf("ScanDeadLetters(%+v): %v", f, err)
		}
		if len(page) == 0 {
			return out
		}
		for _, d := range page {
			if d.ID <= f.AfterID {
				t.Fatalf("dead letter %d/%s after cursor %d: out of order", d.ID, d.Scope, f.AfterID)
			}
		}
		out = append(out, page...)
		f.AfterID = page[len(page)-1].ID
	}
}

func dlIDs(ds []dedup.DeadLetter) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = fmt.Sprintf("%s/%d", d.Scope, d.ID)
	}
	return out
}

// ScanDeadLetters and CountDeadLetters on Redis select by scope, reason,
// time range and re-drive state, page by ID across every scope's stream,
// never split dead letters of one ID (two scopes' streams may share one)
// across pages, and refuse a ScopePrefix; DeadLetter finds one by ID.
func TestRedisStoreScanDeadLetters(t *testing.T) {
	t.Parallel()
	s := newRedisStore(t, func(c *redisstore.Config) { c.MaxAttempts = 1 })
	ctx := context.Background()
	c := s.Config().Client
	// Entries of one ID in three scopes, an hour old (written first: a
	// stream's IDs only grow).
	old := time.Now().Add(-time.Hour).UnixMilli()
	for _, e := range []struct{ scope, id string }{{"tie-a", "-0"}, {"tie-a", "-1"}, {"tie-b", "-1"}, {"tie-c", "-1"}} {
		if err := c.XAdd(ctx, &redis.XAddArgs{Stream: redisDLStream(s.Config().Prefix, e.scope), ID: fmt.Sprint(old) + e.id,
			Values: []any{"scope", e.scope, "message_id", "old" + e.id, "reason", dedup.ReasonAttemptsExhausted, "created_ms", fmt.Sprint(old)}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	rsDeadLetters(t, s, "pay", "p-", 5)
	rsDeadLetters(t, s, "ship", "s-", 3)
	if r, err := s.Reject(ctx, msg(t, "ship", "bad-1", "", "??"), dedup.ReasonBadInput, errors.New("no order ID")); err != nil || r.Outcome != dedup.OutcomeDeadLetter {
		t.Fatalf("reject: %+v, %v", r, err)
	}

	all := rsScanAll(t, s, dedup.DeadLetterFilter{})
	if len(all) != 13 {
		t.Fatalf("%d dead letters, want 13: %v", len(all), dlIDs(all))
	}
	// Pages of 2 hold the tie whole: tie-a/-0 alone, then the three -1s.
	first, err := s.ScanDeadLetters(ctx, dedup.DeadLetterFilter{Limit: 2})
	if err != nil || len(first) != 1 || first[0].Scope != "tie-a" {
		t.Fatalf("first page of 2: %v, %v; want tie-a's first entry alone (the next two share an ID)", dlIDs(first), err)
	}
	second, err := s.ScanDeadLetters(ctx, dedup.DeadLetterFilter{Limit: 2, AfterID: first[0].ID})
	if err != nil || len(second) != 3 || second[0].ID != second[2].ID {
		t.Fatalf("second page of 2: %v, %v; want the three dead letters of one ID", dlIDs(second), err)
	}
	if got := dlIDs(rsScanAll(t, s, dedup.DeadLetterFilter{Limit: 2})); !slices.Equal(got, dlIDs(all)) {
		t.Fatalf("pages of 2: %v, want %v", got, dlIDs(all))
	}

	since := time.Now().Add(-30 * time.Minute)
	no := false
	for _, c := range []struct {
		f    dedup.DeadLetterFilter
		want int
	}{
		{dedup.DeadLetterFilter{Scope: "pay"}, 5},
		{dedup.DeadLetterFilter{Scope: "ship", Reason: dedup.ReasonBadInput}, 1},
		{dedup.DeadLetterFilter{Reason: dedup.ReasonPermanentError}, 8},
		{dedup.DeadLetterFilter{Until: since}, 4},
		{dedup.DeadLetterFilter{Since: since, Scope: "ship"}, 4},
		{dedup.DeadLetterFilter{Since: since, Redriven: &no}, 9},
	} {
		var want []string
		for _, d := range all {
			if c.f.Match(d) {
				want = append(want, fmt.Sprintf("%s/%d", d.Scope, d.ID))
			}
		}
		if len(want) != c.want {
			t.Fatalf("%+v: Match selects %d, the test expects %d", c.f, len(want), c.want)
		}
		for _, limit := range []int{1, 3, 0} {
			f := c.f
			f.Limit = limit
			if got := dlIDs(rsScanAll(t, s, f)); !slices.Equal(got, want) {
				t.Fatalf("ScanDeadLetters(%+v): %v, want %v", f, got, want)
			}
		}
		if n, err := s.CountDeadLetters(ctx, c.f); err != nil || n != int64(c.want) {
			t.Fatalf("CountDeadLetters(%+v) = %d, %v; want %d", c.f, n, err, c.want)
		}
	}
	if n, err := s.CountDeadLetters(ctx, dedup.DeadLetterFilter{}); err != nil || n != 13 {
		t.Fatalf("CountDeadLetters() = %d, %v; want 13", n, err)
	}

	pay := rsScanAll(t, s, dedup.DeadLetterFilter{Scope: "pay"})
	d, err := s.DeadLetter(ctx, pay[2].ID)
	if err != nil || d.Scope != "pay" || d.MessageID != "p-3" || string(d.Payload) != `{"n":3}` || d.Reason != dedup.ReasonPermanentError || d.RedrivenAt != nil {
		t.Fatalf("DeadLetter(%d) = %+v, %v", pay[2].ID, d, err)
	}
	if _, err := s.DeadLetter(ctx, 12345); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("DeadLetter of a missing ID: %v, want ErrNotFound", err)
	}
	if _, err := s.DeadLetter(ctx, second[0].ID); err == nil || errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("DeadLetter of an ID three scopes share: %v, want an error naming them", err)
	}
	_, err = s.ScanDeadLetters(ctx, dedup.DeadLetterFilter{ScopePrefix: "pa"})
	if !errors.Is(err, redisstore.ErrInvalidConfig) || !errors.Is(err, dedup.ErrInvalidConfig) {
		t.Fatalf("ScopePrefix on Redis: %v, want ErrInvalidConfig", err)
	}
	if _, err := s.RedriveDeadLetters(ctx, dedup.DeadLetterFilter{ScopePrefix: "pa"}, dedup.RedriveOptions{}); !errors.Is(err, dedup.ErrInvalidConfig) {
		t.Fatalf("RedriveDeadLetters with a ScopePrefix on Redis: %v, want ErrInvalidConfig", err)
	}
}

// RedriveDeadLetters on Redis: a dry run changes nothing; a re-drive by
// scope and reason releases exactly the matching records, after which their
// dead letters show RedrivenAt (DeadLetter, ScanDeadLetters, DeadLetters)
// and the message runs again; a second run re-drives nothing; a conflict is
// skipped; four runs at once release each record exactly once in total.
func TestRedisStoreRedriveDeadLetters(t *testing.T) {
	t.Parallel()
	s := newRedisStore(t, func(c *redisstore.Config) { c.MaxAttempts = 1 })
	ctx := context.Background()
	rsDeadLetters(t, s, "pay", "p-", 6)
	rsDeadLetters(t, s, "bulk", "b-", 120)
	if r, err := s.Reject(ctx, msg(t, "pay", "bad-1", "", "??"), dedup.ReasonBadInput, errors.New("no order ID")); err != nil || r.Outcome != dedup.OutcomeDeadLetter {
		t.Fatalf("reject: %+v, %v", r, err)
	}
	ok := func(context.Context, *dedup.Message) error { return nil }
	if r, err := s.ProcessLeased(ctx, msg(t, "pay", "c-1", "", "a"), ok, dedup.LeaseOptions{TTL: 10 * time.Second}); err != nil || r.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("c-1: %+v, %v", r, err)
	}
	if r, err := s.ProcessLeased(ctx, msg(t, "pay", "c-1", "", "b"), ok, dedup.LeaseOptions{TTL: 10 * time.Second}); err != nil || r.Outcome != dedup.OutcomeConflict {
		t.Fatalf("c-1 with another payload: %+v, %v; want a conflict", r, err)
	}
	status := func(scope, mid string) dedup.Status {
		t.Helper()
		r, err := s.Lookup(ctx, scope, mid)
		if err != nil {
			t.Fatal(err)
		}
		return r.Status
	}

	sum, err := s.RedriveDeadLetters(ctx, dedup.DeadLetterFilter{Scope: "pay"}, dedup.RedriveOptions{DryRun: true})
	if err != nil || sum != (dedup.RedriveSummary{Matched: 8, Skipped: 1}) {
		t.Fatalf("dry run: %+v, %v; want 8 matched, the conflict skipped", sum, err)
	}
	if status("pay", "p-1") != dedup.StatusFailedFinal {
		t.Fatal("the dry run changed a record")
	}

	var progress [][2]int64
	sum, err = s.RedriveDeadLetters(ctx, dedup.DeadLetterFilter{Scope: "pay", Reason: dedup.ReasonPermanentError},
		dedup.RedriveOptions{Batch: 4, Progress: func(done, matched int64) { progress = append(progress, [2]int64{done, matched}) }})
	if err != nil || sum != (dedup.RedriveSummary{Matched: 6, Redriven: 6}) {
		t.Fatalf("by reason: %+v, %v; want 6 re-driven", sum, err)
	}
	if !slices.Equal(progress, [][2]int64{{4, 6}, {6, 6}}) {
		t.Fatalf("progress %v", progress)
	}
	if status("pay", "p-4") != dedup.StatusFailedRetryable || status("pay", "bad-1") != dedup.StatusFailedFinal || status("pay", "c-1") != dedup.StatusSucceeded {
		t.Fatal("the re-drive by reason released the wrong records")
	}
	// REDRIVEN shows on Redis now.
	for _, d := range rsScanAll(t, s, dedup.DeadLetterFilter{Scope: "pay"}) {
		if (d.RedrivenAt != nil) != (d.Reason == dedup.ReasonPermanentError) {
			t.Fatalf("dead letter %s (%s): RedrivenAt %v", d.MessageID, d.Reason, d.RedrivenAt)
		}
	}
	dls, err := s.DeadLetters(ctx, "pay", 0, 100)
	if err != nil || len(dls) != 8 || dls[0].RedrivenAt == nil {
		t.Fatalf("DeadLetters after the re-drive: %d, %v; want RedrivenAt on p-1", len(dls), err)
	}
	if d, err := s.DeadLetter(ctx, dls[0].ID); err != nil || d.RedrivenAt == nil || d.RedrivenAt.Before(d.CreatedAt) {
		t.Fatalf("DeadLetter(%d) after the re-drive: %+v, %v", dls[0].ID, d, err)
	}
	yes := true
	if n, err := s.CountDeadLetters(ctx, dedup.DeadLetterFilter{Scope: "pay", Redriven: &yes}); err != nil || n != 6 {
		t.Fatalf("re-driven dead letters counted: %d, %v; want 6", n, err)
	}
	if r, err := s.ProcessLeased(ctx, msg(t, "pay", "p-2", "", `{"n":2}`), ok, dedup.LeaseOptions{TTL: 10 * time.Second}); err != nil || r.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("p-2 after its re-drive: %+v, %v; want processed", r, err)
	}
	// Idempotent.
	sum, err = s.RedriveDeadLetters(ctx, dedup.DeadLetterFilter{Scope: "pay"}, dedup.RedriveOptions{})
	if err != nil || sum != (dedup.RedriveSummary{Matched: 8, Redriven: 1, Skipped: 7}) {
		t.Fatalf("by scope: %+v, %v; want bad-1 re-driven, the rest skipped", sum, err)
	}
	if sum, err = s.RedriveDeadLetters(ctx, dedup.DeadLetterFilter{Scope: "pay"}, dedup.RedriveOptions{}); err != nil || sum.Redriven != 0 || sum.Skipped != 8 {
		t.Fatalf("second run: %+v, %v; want nothing re-driven", sum, err)
	}

	// Four at once, over every scope: 120 records released once in total.
	var wg sync.WaitGroup
	sums := make([]dedup.RedriveSummary, 4)
	errs := make([]error, 4)
	for i := range sums {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sums[i], errs[i] = s.RedriveDeadLetters(ctx, dedup.DeadLetterFilter{}, dedup.RedriveOptions{Batch: 7 + i})
		}()
	}
	wg.Wait()
	var total int64
	for i := range sums {
		if errs[i] != nil {
			t.Fatalf("run %d: %v", i, errs[i])
		}
		total += sums[i].Redriven
	}
	if total != 120 {
		t.Fatalf("four runs at once re-drove %d records in total (%+v), want 120", total, sums)
	}
	for i := 1; i <= 120; i++ {
		if st := status("bulk", fmt.Sprintf("b-%d", i)); st != dedup.StatusFailedRetryable {
			t.Fatalf("bulk/b-%d is %s", i, st)
		}
	}
}

// PurgeDeadLetters on Redis deletes the dead letters older than its
// argument from every scope's stream and keeps the younger ones.
func TestRedisStorePurgeDeadLetters(t *testing.T) {
	t.Parallel()
	s := newRedisStore(t, func(c *redisstore.Config) { c.MaxAttempts = 1 })
	ctx := context.Background()
	c := s.Config().Client
	for i, scope := range []string{"a", "b"} {
		for age := 2; age >= 0; age-- { // oldest first: a stream's IDs only grow
			at := time.Now().Add(-time.Duration(48+age) * time.Hour).UnixMilli()
			if err := c.XAdd(ctx, &redis.XAddArgs{Stream: redisDLStream(s.Config().Prefix, scope), ID: fmt.Sprintf("%d-%d", at, i),
				Values: []any{"scope", scope, "message_id", fmt.Sprint("old-", age), "reason", dedup.ReasonAttemptsExhausted, "created_ms", fmt.Sprint(at)}}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	rsDeadLetters(t, s, "a", "young-", 2)
	rsDeadLetters(t, s, "b", "young-", 1)
	if n, err := s.CountDeadLetters(ctx, dedup.DeadLetterFilter{}); err != nil || n != 9 {
		t.Fatalf("before the purge: %d, %v; want 9", n, err)
	}
	n, err := s.PurgeDeadLetters(ctx, 24*time.Hour)
	if err != nil || n != 6 {
		t.Fatalf("purge: %d, %v; want the 6 older than a day", n, err)
	}
	left := rsScanAll(t, s, dedup.DeadLetterFilter{})
	if len(left) != 3 {
		t.Fatalf("left %v, want the 3 young ones", dlIDs(left))
	}
	for _, d := range left {
		if d.MessageID[:6] != "young-" {
			t.Fatalf("purge kept %s", d.MessageID)
		}
	}
	if n, err := s.PurgeDeadLetters(ctx, 24*time.Hour); err != nil || n != 0 {
		t.Fatalf("second purge: %d, %v", n, err)
	}
	if _, err := s.PurgeDeadLetters(ctx, time.Second); !errors.Is(err, dedup.ErrInvalidConfig) {
		t.Fatalf("purge of under 1m: %v, want ErrInvalidConfig", err)
	}
}

// On Redis Cluster, a filter without a scope finds every scope's stream on
// every primary (SCAN per primary), and the bulk re-drive and purge work
// there too.
func TestRedisStoreClusterDeadLetterTooling(t *testing.T) {
	t.Parallel()
	c := startRedisCluster(t)
	s, err := redisstore.New(redisstore.Config{Client: c, Prefix: randomName("rsc-"), Fingerprinter: testFingerprinter(t), MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rsDeadLetters(t, s, "billing {eu}", "e-", 3)
	rsDeadLetters(t, s, "billing {us}", "u-", 2)
	if got := rsScanAll(t, s, dedup.DeadLetterFilter{Limit: 2}); len(got) != 5 {
		t.Fatalf("cluster scan: %v, want 5 dead letters of two scopes", dlIDs(got))
	}
	sum, err := s.RedriveDeadLetters(ctx, dedup.DeadLetterFilter{}, dedup.RedriveOptions{Batch: 2})
	if err != nil || sum != (dedup.RedriveSummary{Matched: 5, Redriven: 5}) {
		t.Fatalf("cluster re-drive: %+v, %v", sum, err)
	}
	yes := true
	if n, err := s.CountDeadLetters(ctx, dedup.DeadLetterFilter{Redriven: &yes}); err != nil || n != 5 {
		t.Fatalf("re-driven on the cluster: %d, %v; want 5", n, err)
	}
	if n, err := s.PurgeDeadLetters(ctx, time.Hour); err != nil || n != 0 {
		t.Fatalf("cluster purge of young dead letters: %d, %v; want 0", n, err)
	}
}
