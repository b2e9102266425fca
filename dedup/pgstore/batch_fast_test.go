package pgstore

import (
	"testing"

	"github.com/idemq/idemq/dedup"
)

// Fast-path hits and Postgres's answers are put back in order, and a hit
// after a message that must be retried (or was not attempted) is left zero,
// as in a batch without a fast path: a later message never overtakes one
// that still has to be retried.
func TestMergeFastHitsKeepsOrder(t *testing.T) {
	dup := dedup.Result{Outcome: dedup.OutcomeDuplicate, Status: dedup.StatusSucceeded}
	processed := dedup.Result{Outcome: dedup.OutcomeProcessed}
	retry := dedup.Result{Outcome: dedup.OutcomeRetry}
	hit := []bool{true, false, true, false, true, false}
	fast := []dedup.Result{dup, {}, dup, {}, dup, {}}
	for _, c := range []struct {
		name string
		sub  []dedup.Result
		want []dedup.Outcome
	}{
		{"all answered", []dedup.Result{processed, processed, processed}, []dedup.Outcome{"duplicate", "processed", "duplicate", "processed", "duplicate", "processed"}},
		{"retry stops", []dedup.Result{processed, retry, {}}, []dedup.Outcome{"duplicate", "processed", "duplicate", "retry", "", ""}},
		{"unattempted stops", []dedup.Result{{}, {}, {}}, []dedup.Outcome{"duplicate", "", "", "", "", ""}},
	} {
		got := mergeFastHits(fast, hit, c.sub)
		for i, w := range c.want {
			if got[i].Outcome != w {
				t.Fatalf("%s: result %d = %q, want %q", c.name, i, got[i].Outcome, w)
			}
		}
	}
}
