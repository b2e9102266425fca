package dedup

import (
	"errors"
	"strings"
	"testing"
)

func TestRedrivableAsNew(t *testing.T) {
	if err := RedrivableAsNew(ReasonMessageIDCollision, false); err != nil {
		t.Fatalf("collision: %v", err)
	}
	for _, r := range []string{ReasonPayloadConflict, ReasonFingerprintConflict} {
		if err := RedrivableAsNew(r, false); !errors.Is(err, ErrPayloadConflict) {
			t.Fatalf("%s without force: %v, want ErrPayloadConflict", r, err)
		}
		if err := RedrivableAsNew(r, true); err != nil {
			t.Fatalf("%s forced: %v", r, err)
		}
	}
	for _, r := range []string{ReasonAttemptsExhausted, ReasonPermanentError, ReasonBadInput} {
		if err := RedrivableAsNew(r, true); !errors.Is(err, ErrNotAConflict) {
			t.Fatalf("%s: %v, want ErrNotAConflict", r, err)
		}
	}
	if got := RedriveAsNewID("m-1", 42); got != "m-1#redrive-42" {
		t.Fatalf("RedriveAsNewID = %q", got)
	}
	if err := (RedriveAsNewOptions{}).Validate(); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "Publish") {
		t.Fatalf("no Publish: %v", err)
	}
}
