package httpidem

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func key(b byte, n int) []byte { return bytes.Repeat([]byte{b}, n) }

func TestNewAESGCMValidation(t *testing.T) {
	for _, n := range []int{16, 24, 32} {
		if _, err := NewAESGCM("k", map[string][]byte{"k": key(1, n)}); err != nil {
			t.Errorf("%d-byte key: %v", n, err)
		}
	}
	cases := []struct {
		name    string
		current string
		keys    map[string][]byte
		want    []string // substrings of the error
	}{
		{"no keys", "k", nil, []string{"no keys"}},
		{"short key", "k1", map[string][]byte{"k1": key(1, 32), "short": key(1, 15)}, []string{`"short"`, "15 bytes"}},
		{"long key", "big", map[string][]byte{"big": key(1, 33)}, []string{`"big"`, "33 bytes"}},
		{"empty key ID", "", map[string][]byte{"": key(1, 16)}, []string{`key ID ""`}},
		{"space in key ID", "a b", map[string][]byte{"a b": key(1, 16)}, []string{`key ID "a b"`}},
		{"non-ASCII key ID", "kä", map[string][]byte{"kä": key(1, 16)}, []string{`key ID "kä"`}},
		{"long key ID", strings.Repeat("k", MaxKeyIDLen+1), map[string][]byte{strings.Repeat("k", MaxKeyIDLen+1): key(1, 16)}, []string{"length 65"}},
		{"unknown current", "k3", map[string][]byte{"k1": key(1, 16), "k2": key(2, 16)}, []string{`current key ID "k3"`, `"k1"`, `"k2"`}},
	}
	for _, c := range cases {
		_, err := NewAESGCM(c.current, c.keys)
		if err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not contain %q", c.name, err, w)
			}
		}
	}
}

func TestAESGCMRoundTripAndNonce(t *testing.T) {
	s, err := NewAESGCM("k1", map[string][]byte{"k1": key(7, 32)})
	if err != nil {
		t.Fatal(err)
	}
	pt, aad := []byte("card token tok_123"), []byte("scope|key")
	id, ct1, err := s.Seal(pt, aad)
	if err != nil || id != "k1" {
		t.Fatalf("Seal = %q, %v", id, err)
	}
	if bytes.Contains(ct1, pt) {
		t.Fatal("ciphertext contains the plaintext")
	}
	if len(ct1) != len(pt)+28 {
		t.Errorf("ciphertext is %d bytes, want plaintext+28 = %d", len(ct1), len(pt)+28)
	}
	_, ct2, _ := s.Seal(pt, aad)
	if bytes.Equal(ct1, ct2) || bytes.Equal(ct1[:12], ct2[:12]) {
		t.Error("two seals of the same plaintext share a nonce")
	}
	for _, ct := range [][]byte{ct1, ct2} {
		got, err := s.Open("k1", ct, aad)
		if err != nil || !bytes.Equal(got, pt) {
			t.Errorf("Open = %q, %v", got, err)
		}
	}
}

func TestAESGCMRotation(t *testing.T) {
	k1, k2 := key(1, 32), key(2, 16)
	before, err := NewAESGCM("k1", map[string][]byte{"k1": k1})
	if err != nil {
		t.Fatal(err)
	}
	aad := []byte("tenant|alice|POST /orders|key-1")
	oldID, oldCT, _ := before.Seal([]byte("old"), aad)

	// Rotate: k2 becomes current, k1 stays for the blobs it sealed.
	after, err := NewAESGCM("k2", map[string][]byte{"k1": k1, "k2": k2})
	if err != nil {
		t.Fatal(err)
	}
	if after.CurrentKeyID() != "k2" {
		t.Errorf("CurrentKeyID = %q", after.CurrentKeyID())
	}
	if got, err := after.Open(oldID, oldCT, aad); err != nil || string(got) != "old" {
		t.Errorf("old blob after rotation: %q, %v", got, err)
	}
	newID, newCT, _ := after.Seal([]byte("new"), aad)
	if newID != "k2" {
		t.Errorf("new blob sealed with %q, want k2", newID)
	}
	// The pre-rotation instance does not know k2.
	if _, err := before.Open(newID, newCT, aad); !errors.Is(err, ErrUnknownKeyID) || !strings.Contains(err.Error(), `"k2"`) {
		t.Errorf("unknown key: err = %v, want ErrUnknownKeyID naming k2", err)
	}
	// Retiring k1 leaves its blobs unreadable, with a clear error.
	retired, _ := NewAESGCM("k2", map[string][]byte{"k2": k2})
	if _, err := retired.Open(oldID, oldCT, aad); !errors.Is(err, ErrUnknownKeyID) {
		t.Errorf("retired key: err = %v, want ErrUnknownKeyID", err)
	}
}

func TestAESGCMTamper(t *testing.T) {
	s, _ := NewAESGCM("k1", map[string][]byte{"k1": key(1, 16), "k2": key(2, 16)})
	aad := []byte("record-A")
	_, ct, _ := s.Seal([]byte("payload"), aad)
	for i := range ct {
		bad := append([]byte(nil), ct...)
		bad[i] ^= 0x01
		if _, err := s.Open("k1", bad, aad); !errors.Is(err, ErrOpenFailed) {
			t.Fatalf("flipped byte %d: err = %v, want ErrOpenFailed", i, err)
		}
	}
	checks := map[string]func() error{
		"other record": func() error { _, err := s.Open("k1", ct, []byte("record-B")); return err },
		"no aad":       func() error { _, err := s.Open("k1", ct, nil); return err },
		"relabelled":   func() error { _, err := s.Open("k2", ct, aad); return err },
		"truncated":    func() error { _, err := s.Open("k1", ct[:len(ct)-1], aad); return err },
		"too short":    func() error { _, err := s.Open("k1", ct[:5], aad); return err },
	}
	for name, f := range checks {
		if err := f(); !errors.Is(err, ErrOpenFailed) {
			t.Errorf("%s: err = %v, want ErrOpenFailed", name, err)
		}
	}
	// The key ID is length-prefixed in the authenticated data: key "k1" with
	// aad "x" is not key "k1x" with no aad.
	s2, _ := NewAESGCM("k1", map[string][]byte{"k1": key(1, 16), "k1x": key(1, 16)})
	_, ct2, _ := s2.Seal([]byte("p"), []byte("x"))
	if _, err := s2.Open("k1x", ct2, nil); !errors.Is(err, ErrOpenFailed) {
		t.Errorf("key ID / aad boundary: err = %v, want ErrOpenFailed", err)
	}
}
