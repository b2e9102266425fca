package httpidem

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
)

// Sealer encrypts stored responses at rest, so that what a handler answered
// (payment tokens, personal data) never sits in plain text in the records
// table. [AESGCM] is the implementation this package ships; another (a KMS
// envelope, an HSM) can be plugged in with the same contract.
type Sealer interface {
	// Seal encrypts plaintext bound to aad (additional authenticated data:
	// authenticated, not stored, needed again to open) with the current key
	// and returns that key's ID, to be stored next to the ciphertext.
	Seal(plaintext, aad []byte) (keyID string, ciphertext []byte, err error)
	// Open decrypts a ciphertext that Seal returned under keyID, with the
	// same aad. It fails with an error wrapping [ErrUnknownKeyID] when keyID
	// is not configured, and with one wrapping [ErrOpenFailed] when the
	// ciphertext was altered, or aad differs from the one it was sealed with.
	Open(keyID string, ciphertext, aad []byte) ([]byte, error)
}

// ErrUnknownKeyID is wrapped by [AESGCM.Open] when a blob names a key ID that
// is not among the configured keys (for example a key retired too early: keep
// every key that sealed a response still inside retention).
var ErrUnknownKeyID = errors.New("httpidem: unknown response encryption key ID")

// ErrOpenFailed is wrapped by [AESGCM.Open] when authentication fails: the
// ciphertext was altered or truncated, the key under that ID is not the one
// that sealed it, or the blob was copied from another record (the record's
// identity is part of the authenticated data).
var ErrOpenFailed = errors.New("httpidem: stored response failed authentication")

// gcmNonceSize is the standard 96-bit GCM nonce, drawn from crypto/rand for
// every blob and stored in front of it.
const gcmNonceSize = 12

// MaxKeyIDLen is the longest key ID [NewAESGCM] accepts, in bytes. Key IDs
// are stored with every sealed response.
const MaxKeyIDLen = 64

// AESGCM is a [Sealer] using AES-GCM (crypto/aes, crypto/cipher) with a
// fresh random 96-bit nonce for every blob and key IDs for rotation: Seal
// always uses the current key; Open uses whichever configured key the blob
// names. A ciphertext is nonce (12 bytes) || encrypted data || tag (16
// bytes), so it is 28 bytes longer than its plaintext.
//
// Rotation: add the new key to the map and make it current; keep the old
// key in the map until every response it sealed has passed retention, then
// drop it. With random nonces, NIST SP 800-38D bounds one key to 2^32
// sealed blobs; rotate well before that.
//
// An AESGCM is safe for concurrent use.
type AESGCM struct {
	current string
	aeads   map[string]cipher.AEAD
}

// NewAESGCM builds an [AESGCM] from keys, a map of key ID to raw key, and
// current, the ID of the key that seals new responses.
//
// Each key must be 16, 24 or 32 bytes (AES-128, -192, -256); each key ID
// 1 to [MaxKeyIDLen] bytes of printable ASCII without space (0x21–0x7e);
// current must be one of the IDs. Errors name the offending key ID. The key
// bytes are not retained (the cipher keeps its own expanded key), so the
// caller may zero them afterwards.
func NewAESGCM(current string, keys map[string][]byte) (*AESGCM, error) {
	if len(keys) == 0 {
		return nil, errors.New("httpidem: NewAESGCM: no keys")
	}
	ids := make([]string, 0, len(keys))
	for id := range keys {
		ids = append(ids, id)
	}
	sort.Strings(ids) // deterministic error order
	a := &AESGCM{current: current, aeads: make(map[string]cipher.AEAD, len(keys))}
	for _, id := range ids {
		if err := validKeyID(id); err != nil {
			return nil, fmt.Errorf("httpidem: NewAESGCM: key ID %q: %w", id, err)
		}
		k := keys[id]
		switch len(k) {
		case 16, 24, 32:
		default:
			return nil, fmt.Errorf("httpidem: NewAESGCM: key %q is %d bytes, want 16, 24 or 32 (AES-128, -192, -256)", id, len(k))
		}
		block, err := aes.NewCipher(k)
		if err != nil {
			return nil, fmt.Errorf("httpidem: NewAESGCM: key %q: %w", id, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("httpidem: NewAESGCM: key %q: %w", id, err)
		}
		a.aeads[id] = aead
	}
	if _, ok := a.aeads[current]; !ok {
		return nil, fmt.Errorf("httpidem: NewAESGCM: current key ID %q is not among the keys %q", current, ids)
	}
	return a, nil
}

func validKeyID(id string) error {
	if id == "" || len(id) > MaxKeyIDLen {
		return fmt.Errorf("length %d, want 1..%d bytes", len(id), MaxKeyIDLen)
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return fmt.Errorf("byte %d is %#x, want printable ASCII without space", i, id[i])
		}
	}
	return nil
}

// CurrentKeyID returns the ID of the key that [AESGCM.Seal] uses.
func (a *AESGCM) CurrentKeyID() string { return a.current }

// Seal encrypts plaintext with the current key, bound to aad, and returns the
// current key ID and nonce || ciphertext || tag. The key ID is authenticated
// too, so relabelling a blob with another ID fails to open.
func (a *AESGCM) Seal(plaintext, aad []byte) (keyID string, ciphertext []byte, err error) {
	aead := a.aeads[a.current]
	out := make([]byte, gcmNonceSize, gcmNonceSize+len(plaintext)+aead.Overhead())
	// crypto/rand.Read never fails (it crashes the program instead).
	_, _ = rand.Read(out)
	return a.current, aead.Seal(out, out, plaintext, sealAAD(a.current, aad)), nil
}

// Open decrypts a ciphertext from [AESGCM.Seal] with the key called keyID and
// the aad it was sealed with. Errors wrap [ErrUnknownKeyID] or
// [ErrOpenFailed] and name the key ID.
func (a *AESGCM) Open(keyID string, ciphertext, aad []byte) ([]byte, error) {
	aead, ok := a.aeads[keyID]
	if !ok {
		return nil, fmt.Errorf("%w %q (configured: %q)", ErrUnknownKeyID, keyID, a.keyIDs())
	}
	if len(ciphertext) < gcmNonceSize {
		return nil, fmt.Errorf("%w (key %q): %d bytes, shorter than the nonce", ErrOpenFailed, keyID, len(ciphertext))
	}
	nonce, sealed := ciphertext[:gcmNonceSize], ciphertext[gcmNonceSize:]
	pt, err := aead.Open(nil, nonce, sealed, sealAAD(keyID, aad))
	if err != nil {
		return nil, fmt.Errorf("%w (key %q): %w", ErrOpenFailed, keyID, err)
	}
	return pt, nil
}

func (a *AESGCM) keyIDs() []string {
	ids := make([]string, 0, len(a.aeads))
	for id := range a.aeads {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// sealAAD is the data GCM authenticates: the key ID, length-prefixed so that
// no (keyID, aad) pair can be read as another, then the caller's aad.
func sealAAD(keyID string, aad []byte) []byte {
	out := make([]byte, 0, binary.MaxVarintLen64+len(keyID)+len(aad))
	out = binary.AppendUvarint(out, uint64(len(keyID)))
	out = append(out, keyID...)
	return append(out, aad...)
}
