package dedup_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/dedup"
)

// A filter for a bulk re-drive: the attempts-exhausted dead letters of one
// scope from one day, not yet re-driven. Validate names the field of a bad
// filter before any store is asked.
func ExampleDeadLetterFilter() {
	day := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	no := false
	f := dedup.DeadLetterFilter{
		Scope:    "payments",
		Reason:   dedup.ReasonAttemptsExhausted,
		Since:    day,
		Until:    day.Add(24 * time.Hour),
		Redriven: &no,
	}
	fmt.Println(f.Validate(), f.PageSize())
	fmt.Println(f.Match(dedup.DeadLetter{Scope: "payments", Reason: dedup.ReasonAttemptsExhausted, CreatedAt: day.Add(time.Hour)}))
	fmt.Println(f.Match(dedup.DeadLetter{Scope: "payments", Reason: dedup.ReasonPayloadConflict, CreatedAt: day.Add(time.Hour)}))

	bad := dedup.DeadLetterFilter{Limit: 20000}
	err := bad.Validate()
	fmt.Println(errors.Is(err, dedup.ErrInvalidConfig), err)
	// Output:
	// <nil> 100
	// true
	// false
	// true idemq: invalid config: DeadLetterFilter.Limit 20000 must be 0 (default 100) to 10000
}
