package httpidem_test

import (
	"encoding/base64"
	"errors"
	"fmt"
	"log"

	"github.com/idemq/idemq/httpidem"
)

// Keys come from a secret store as base64 (32 bytes: AES-256); the key IDs
// are stored with every sealed response and name the key that opens it.
func ExampleNewAESGCM() {
	// In production: base64.StdEncoding.DecodeString(os.Getenv("IDEMQ_RESPONSE_KEY_2026_11")).
	key, err := base64.StdEncoding.DecodeString("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=")
	if err != nil {
		log.Fatal(err)
	}
	sealer, err := httpidem.NewAESGCM("2026-11", map[string][]byte{"2026-11": key})
	if err != nil {
		log.Fatal(err)
	}

	record := []byte("tenant-1|alice|POST /payments|key-123") // the record the blob belongs to
	keyID, blob, err := sealer.Seal([]byte(`{"card_token":"tok_live_abc"}`), record)
	if err != nil {
		log.Fatal(err)
	}
	plain, err := sealer.Open(keyID, blob, record)
	fmt.Println(keyID, string(plain), err)

	// The same blob under another record's identity does not open.
	_, err = sealer.Open(keyID, blob, []byte("tenant-1|mallory|POST /payments|key-123"))
	fmt.Println(errors.Is(err, httpidem.ErrOpenFailed))

	// A key of the wrong size is refused, naming the key ID.
	_, err = httpidem.NewAESGCM("short", map[string][]byte{"short": []byte("too short")})
	fmt.Println(err)
	// Output:
	// 2026-11 {"card_token":"tok_live_abc"} <nil>
	// true
	// httpidem: NewAESGCM: key "short" is 9 bytes, want 16, 24 or 32 (AES-128, -192, -256)
}

// Rotation: the new key becomes current and seals every new response; the
// old key stays configured until the responses it sealed have passed
// retention, then it is dropped.
func ExampleAESGCM_rotation() {
	oldKey := []byte("0123456789abcdef0123456789abcdef")
	newKey := []byte("fedcba9876543210fedcba9876543210")
	record := []byte("tenant-1|alice|POST /payments|key-123")

	before, err := httpidem.NewAESGCM("k1", map[string][]byte{"k1": oldKey})
	if err != nil {
		log.Fatal(err)
	}
	oldID, oldBlob, _ := before.Seal([]byte("sealed before the rotation"), record)

	// Step 1: add k2 and make it current; k1 stays for the old blobs.
	after, err := httpidem.NewAESGCM("k2", map[string][]byte{"k1": oldKey, "k2": newKey})
	if err != nil {
		log.Fatal(err)
	}
	plain, err := after.Open(oldID, oldBlob, record)
	fmt.Println(oldID, string(plain), err)
	newID, _, _ := after.Seal([]byte("sealed after"), record)
	fmt.Println("new responses use", newID)

	// Step 2, after retention: drop k1. A blob still naming it fails clearly.
	retired, _ := httpidem.NewAESGCM("k2", map[string][]byte{"k2": newKey})
	_, err = retired.Open(oldID, oldBlob, record)
	fmt.Println(errors.Is(err, httpidem.ErrUnknownKeyID))
	// Output:
	// k1 sealed before the rotation <nil>
	// new responses use k2
	// true
}
