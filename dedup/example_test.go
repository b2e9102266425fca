package dedup_test

import (
	"errors"
	"fmt"
	"strings"

	"github.com/idemq/idemq/dedup"
)

// A delivery's identity: a message without a message-id header falls back to
// its broker position; oversized or invalid keys are stored hashed.
func ExampleNewIdentity() {
	id, _ := dedup.NewIdentity("payments", "", "kafka:payments/2/1041", "order-1001:capture")
	fmt.Println(id.MessageID, id.BusinessKey)

	long, _ := dedup.NewIdentity("payments", "m-1", "", strings.Repeat("x", 10_000))
	fmt.Println(long.BusinessKey[:7], len(long.BusinessKey))
	// Output:
	// kafka:payments/2/1041 order-1001:capture
	// sha256: 71
}

// Rotating the fingerprint secret: the new key comes first; records written
// under the previous key still verify.
func ExampleNewFingerprinter() {
	old, _ := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "2026-01", Secret: []byte("first-secret-0123456789")})
	sum, keyID, _ := old.Sum([]byte(`{"amount":40}`))

	rotated, _ := dedup.NewFingerprinter(nil,
		dedup.FingerprintKey{ID: "2026-07", Secret: []byte("second-secret-0123456789")},
		dedup.FingerprintKey{ID: "2026-01", Secret: []byte("first-secret-0123456789")})
	same, _ := rotated.Matches([]byte(`{"amount":40}`), sum, keyID)
	conflict, _ := rotated.Matches([]byte(`{"amount":45}`), sum, keyID)
	fmt.Println(keyID, same, conflict, rotated.CurrentKeyID())
	// Output: 2026-01 true false 2026-07
}

// Handlers return Permanent for errors a retry cannot fix: the record goes
// straight to FAILED_FINAL with a dead letter.
func ExamplePermanent() {
	err := fmt.Errorf("decode payment: %w", dedup.Permanent(errors.New("amount must be positive")))
	fmt.Println(dedup.IsPermanent(err), dedup.ErrorClass(err))
	// Output: true permanent:error
}
