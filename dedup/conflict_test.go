package dedup

import (
	"errors"
	"strings"
	"testing"
)

func TestConflictReason(t *testing.T) {
	cases := []struct {
		by              MatchedBy
		delivery, recBK string
		want            string
	}{
		{ByMessageID, "order-2", "order-1", ReasonMessageIDCollision}, // two messages, one ID
		{ByMessageID, "order-1", "", ReasonMessageIDCollision},        // one has a key, the other none
		{ByMessageID, "", "order-1", ReasonMessageIDCollision},
		{ByMessageID, "order-1", "order-1", ReasonPayloadConflict}, // same intent, other payload
		{ByMessageID, "", "", ReasonPayloadConflict},               // no key to tell: the message changed
		{ByBusinessKey, "order-1", "order-1", ReasonPayloadConflict},
	}
	for _, c := range cases {
		if got := ConflictReason(c.by, c.delivery, c.recBK); got != c.want {
			t.Errorf("ConflictReason(%s, %q, %q) = %s, want %s", c.by, c.delivery, c.recBK, got, c.want)
		}
	}
}

func TestConflictError(t *testing.T) {
	rec := Identity{Scope: "payments", MessageID: "m-1", BusinessKey: "order-1"}
	collision := &ConflictError{Reason: ReasonMessageIDCollision, Identity: Identity{Scope: "payments", MessageID: "m-1", BusinessKey: "order-2"},
		Record: rec, MatchedBy: ByMessageID}
	if !errors.Is(collision, ErrMessageIDCollision) || !errors.Is(collision, ErrFingerprintConflict) || errors.Is(collision, ErrPayloadConflict) {
		t.Fatal("a collision must be ErrMessageIDCollision and ErrFingerprintConflict, not ErrPayloadConflict")
	}
	if got := ErrorClass(collision); got != ReasonMessageIDCollision {
		t.Fatalf("ErrorClass = %q", got)
	}
	if want := "idemq: message ID collision: payments/m-1/order-2 matches record payments/m-1/order-1 by message_id with a different payload"; collision.Error() != want {
		t.Fatalf("Error() = %q", collision.Error())
	}
	payload := &ConflictError{Reason: ReasonPayloadConflict, Identity: rec, Record: rec, MatchedBy: ByMessageID,
		Cause: ErrUnknownFingerprintKey}
	if !errors.Is(payload, ErrPayloadConflict) || !errors.Is(payload, ErrUnknownFingerprintKey) || errors.Is(payload, ErrMessageIDCollision) {
		t.Fatal("a payload conflict with a cause must wrap ErrPayloadConflict and the cause")
	}
	if got := ErrorClass(payload); got != ReasonPayloadConflict || !strings.Contains(payload.Error(), "cannot be compared") {
		t.Fatalf("ErrorClass = %q, Error() = %q", got, payload.Error())
	}
	if got := ErrorClass(ErrFingerprintConflict); got != "fingerprint_conflict" {
		t.Fatalf("a bare ErrFingerprintConflict: ErrorClass = %q", got)
	}
}
