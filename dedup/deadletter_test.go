package dedup

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestDeadLetterFilterValidate(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		f     DeadLetterFilter
		field string // "" = valid
	}{
		{DeadLetterFilter{}, ""},
		{DeadLetterFilter{Scope: "s", Reason: ReasonBadInput, Since: now, Until: now.Add(time.Second), AfterID: 7, Limit: MaxDeadLetterLimit}, ""},
		{DeadLetterFilter{AfterID: -1}, "AfterID"},
		{DeadLetterFilter{Limit: -1}, "Limit"},
		{DeadLetterFilter{Limit: MaxDeadLetterLimit + 1}, "Limit"},
		{DeadLetterFilter{Since: now, Until: now.Add(-time.Second)}, "Until"},
		{DeadLetterFilter{Since: now, Until: now}, "Until"},
		{DeadLetterFilter{Scope: "a", ScopePrefix: "b"}, "ScopePrefix"},
		{DeadLetterFilter{Scope: "a\x00"}, "Scope"},
		{DeadLetterFilter{ScopePrefix: strings.Repeat("p", MaxKeyBytes+1)}, "ScopePrefix"},
		{DeadLetterFilter{Reason: "\xff"}, "Reason"},
	} {
		err := c.f.Validate()
		if c.field == "" {
			if err != nil {
				t.Errorf("%+v: %v, want valid", c.f, err)
			}
			continue
		}
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "DeadLetterFilter."+c.field) {
			t.Errorf("%+v: %v, want ErrInvalidConfig naming %s", c.f, err, c.field)
		}
	}
}

func TestDeadLetterFilterMatch(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	redriven := at.Add(time.Hour)
	d := DeadLetter{Scope: "http|orders", Reason: ReasonPermanentError, CreatedAt: at}
	r := d
	r.RedrivenAt = &redriven
	yes, no := true, false
	for _, c := range []struct {
		f    DeadLetterFilter
		d    DeadLetter
		want bool
	}{
		{DeadLetterFilter{}, d, true},
		{DeadLetterFilter{Scope: "http|orders"}, d, true},
		{DeadLetterFilter{Scope: "http|"}, d, false},
		{DeadLetterFilter{ScopePrefix: "http|"}, d, true},
		{DeadLetterFilter{ScopePrefix: "kafka|"}, d, false},
		{DeadLetterFilter{Reason: ReasonPermanentError}, d, true},
		{DeadLetterFilter{Reason: ReasonBadInput}, d, false},
		{DeadLetterFilter{Since: at}, d, true},                             // inclusive
		{DeadLetterFilter{Since: at.Add(time.Nanosecond)}, d, false},       //
		{DeadLetterFilter{Until: at}, d, false},                            // exclusive
		{DeadLetterFilter{Until: at.Add(time.Nanosecond)}, d, true},        //
		{DeadLetterFilter{Redriven: &yes}, d, false},                       //
		{DeadLetterFilter{Redriven: &no}, d, true},                         //
		{DeadLetterFilter{Redriven: &yes}, r, true},                        //
		{DeadLetterFilter{Redriven: &no}, r, false},                        //
		{DeadLetterFilter{AfterID: 99, Limit: 1}, DeadLetter{ID: 1}, true}, // cursor and page are not Match's
	} {
		if got := c.f.Match(c.d); got != c.want {
			t.Errorf("%+v.Match(%+v) = %v, want %v", c.f, c.d, got, c.want)
		}
	}
}

func TestRedriveOptionsValidate(t *testing.T) {
	for _, o := range []RedriveOptions{{Batch: -1}, {Batch: MaxRedriveBatch + 1}, {Operator: strings.Repeat("o", MaxKeyBytes+1)}, {Operator: "a\x00b"}} {
		if err := o.Validate(); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "RedriveOptions.") {
			t.Errorf("%+v: %v, want ErrInvalidConfig naming the field", o, err)
		}
	}
	if err := (RedriveOptions{Batch: MaxRedriveBatch, Operator: "ops@example"}).Validate(); err != nil {
		t.Fatal(err)
	}
	if (RedriveOptions{}).BatchSize() != DefaultRedriveBatch || (RedriveOptions{Batch: 3}).BatchSize() != 3 {
		t.Fatal("BatchSize")
	}
	for reason, want := range map[string]bool{ReasonAttemptsExhausted: true, ReasonPermanentError: true, ReasonBadInput: true,
		ReasonPayloadConflict: false, ReasonFingerprintConflict: false, ReasonMessageIDCollision: false, "": false} {
		if RedrivableInPlace(reason) != want {
			t.Errorf("RedrivableInPlace(%q) != %v", reason, want)
		}
	}
}
