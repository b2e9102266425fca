package dedup

import (
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"sync"
)

// FingerprintKey is one HMAC secret with the ID stored beside each
// fingerprint it made, so that secrets can rotate.
type FingerprintKey struct {
	// ID names the key in the consumption record (fingerprint_key_id),
	// 1 to 64 bytes. IDs must be unique within a Fingerprinter.
	ID string
	// Secret is the HMAC-SHA256 key; at least 16 bytes.
	Secret []byte
}

// Canonicalizer turns a payload into the bytes that are fingerprinted, for
// example canonical JSON without trace IDs. An error makes the delivery bad
// input (dead-lettered with ReasonBadInput).
type Canonicalizer func(payload []byte) ([]byte, error)

// Fingerprinter computes HMAC-SHA256 fingerprints of payloads. The first key
// is current (used for new records); the others are previous keys, still used
// to verify records written with them. The zero value is not usable; build one
// with NewFingerprinter.
//
// A Fingerprinter is safe for concurrent use. It keeps the HMAC state of each
// key in a sync.Pool, so a fingerprint costs one allocation (the 32-byte
// sum) instead of the six of a fresh hmac.New.
type Fingerprinter struct {
	keys  []FingerprintKey
	canon Canonicalizer
	macs  []*sync.Pool // macs[i]: HMAC-SHA256 states keyed with keys[i].Secret
}

// ErrUnknownFingerprintKey is returned by Fingerprinter.Matches when a record's
// key ID is not among the configured keys (it was rotated out too early).
var ErrUnknownFingerprintKey = errors.New("idemq: fingerprint key ID not configured")

// NewFingerprinter returns a Fingerprinter over keys (current first, then
// previous ones). canon may be nil: raw payload bytes are fingerprinted. It
// returns an error naming the bad key when a key ID is empty, longer than 64
// bytes or repeated, or a secret is shorter than 16 bytes.
func NewFingerprinter(canon Canonicalizer, keys ...FingerprintKey) (*Fingerprinter, error) {
	if len(keys) == 0 {
		return nil, errors.New("idemq: fingerprint: at least one key is required")
	}
	seen := map[string]bool{}
	for i, k := range keys {
		switch {
		case k.ID == "" || len(k.ID) > 64:
			return nil, fmt.Errorf("idemq: fingerprint key %d: ID must be 1 to 64 bytes", i)
		case seen[k.ID]:
			return nil, fmt.Errorf("idemq: fingerprint key %d: duplicate ID %q", i, k.ID)
		case len(k.Secret) < 16:
			return nil, fmt.Errorf("idemq: fingerprint key %q: secret must be at least 16 bytes, got %d", k.ID, len(k.Secret))
		}
		seen[k.ID] = true
	}
	f := &Fingerprinter{keys: append([]FingerprintKey(nil), keys...), canon: canon, macs: make([]*sync.Pool, len(keys))}
	for i := range f.keys {
		secret := append([]byte(nil), f.keys[i].Secret...) // the caller may reuse its slice
		f.keys[i].Secret = secret
		f.macs[i] = &sync.Pool{New: func() any { return hmac.New(sha256.New, secret) }}
	}
	return f, nil
}

// CurrentKeyID is the ID of the key new fingerprints are made with.
func (f *Fingerprinter) CurrentKeyID() string { return f.keys[0].ID }

// Sum returns the fingerprint of payload under the current key and that key's
// ID. It fails only when the canonicalizer fails.
func (f *Fingerprinter) Sum(payload []byte) (sum []byte, keyID string, err error) {
	b, err := f.canonical(payload)
	if err != nil {
		return nil, "", err
	}
	return f.mac(0, b), f.keys[0].ID, nil
}

// Sums returns the fingerprint of payload under every configured key, by
// key ID (FingerprintKey.ID → 32-byte HMAC-SHA256), canonicalizing the
// payload once. Stores that compare fingerprints where Matches cannot run
// (inside a Redis script) send all of them; CurrentKeyID says which one new
// records get. It fails only when the canonicalizer fails.
func (f *Fingerprinter) Sums(payload []byte) (map[string][]byte, error) {
	b, err := f.canonical(payload)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]byte, len(f.keys))
	for i, k := range f.keys {
		out[k.ID] = f.mac(i, b)
	}
	return out, nil
}

// KeyIDs returns the configured key IDs, current key first.
func (f *Fingerprinter) KeyIDs() []string {
	out := make([]string, len(f.keys))
	for i, k := range f.keys {
		out[i] = k.ID
	}
	return out
}

// Matches reports whether payload has fingerprint sum under the key keyID
// (current or previous). It returns ErrUnknownFingerprintKey when keyID is not
// configured, or the canonicalizer's error.
func (f *Fingerprinter) Matches(payload, sum []byte, keyID string) (bool, error) {
	for i, k := range f.keys {
		if k.ID != keyID {
			continue
		}
		b, err := f.canonical(payload)
		if err != nil {
			return false, err
		}
		return hmac.Equal(f.mac(i, b), sum), nil
	}
	return false, fmt.Errorf("%w: %q", ErrUnknownFingerprintKey, keyID)
}

func (f *Fingerprinter) canonical(payload []byte) ([]byte, error) {
	if f.canon == nil {
		return payload, nil
	}
	b, err := f.canon(payload)
	if err != nil {
		return nil, fmt.Errorf("idemq: canonicalize payload: %w", err)
	}
	return b, nil
}

// mac is the HMAC-SHA256 of b under keys[i], on a pooled HMAC state.
func (f *Fingerprinter) mac(i int, b []byte) []byte {
	pool := f.macs[i]
	h, _ := pool.Get().(hash.Hash)
	h.Reset()
	h.Write(b)
	sum := h.Sum(make([]byte, 0, sha256.Size))
	pool.Put(h)
	return sum
}
