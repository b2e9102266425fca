package dedup

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestNormalizeKey(t *testing.T) {
	long := strings.Repeat("k", 10*1024)
	cases := []struct {
		name, in string
		hashed   bool
	}{
		{"empty stays empty", "", false},
		{"plain", "pay-1", false},
		{"255 bytes kept", strings.Repeat("a", 255), false},
		{"256 bytes hashed", strings.Repeat("a", 256), true},
		{"10 KB hashed", long, true},
		{"invalid UTF-8 hashed", "ab\xffcd", true},
		{"NUL hashed", "a\x00b", true},
		{"prefix spoof hashed", "sha256:abc", true},
		{"multibyte kept", "заказ-№7", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := NormalizeKey(c.in)
			if c.hashed {
				if !strings.HasPrefix(got, HashedKeyPrefix) || len(got) != len(HashedKeyPrefix)+64 {
					t.Fatalf("NormalizeKey(%.20q) = %q, want hashed form", c.in, got)
				}
				if got != NormalizeKey(c.in) {
					t.Fatal("hashed form is not deterministic")
				}
				return
			}
			if got != c.in {
				t.Fatalf("NormalizeKey(%q) = %q, want unchanged", c.in, got)
			}
		})
	}
	if NormalizeKey(long) == NormalizeKey(long+"x") {
		t.Fatal("different long keys collide")
	}
}

func TestNewIdentity(t *testing.T) {
	id, err := NewIdentity("payments", "", "kafka:t/1/7", "order-1001:capture")
	if err != nil || id.MessageID != "kafka:t/1/7" || id.BusinessKey != "order-1001:capture" {
		t.Fatalf("fallback identity = %+v, %v", id, err)
	}
	id, err = NewIdentity("payments", "m-1", "kafka:t/1/7", "")
	if err != nil || id.MessageID != "m-1" || id.BusinessKey != "" {
		t.Fatalf("header identity = %+v, %v", id, err)
	}
	if _, err := NewIdentity("payments", "", "", ""); !errors.Is(err, ErrEmptyMessageID) {
		t.Fatalf("empty IDs: err = %v", err)
	}
	for _, bad := range []string{"", strings.Repeat("s", 256), "a\xff", "a\x00"} {
		if _, err := NewIdentity(bad, "m", "", ""); !errors.Is(err, ErrInvalidScope) {
			t.Fatalf("scope %q: err = %v", bad, err)
		}
	}
}

func FuzzNormalizeKey(f *testing.F) {
	for _, s := range []string{"", "pay-1", strings.Repeat("x", 300), "a\xff", "a\x00", "sha256:00", "заказ"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := NormalizeKey(s)
		if s == "" {
			if got != "" {
				t.Fatalf("empty key became %q", got)
			}
			return
		}
		if len(got) == 0 || len(got) > MaxKeyBytes || !utf8.ValidString(got) || strings.IndexByte(got, 0) >= 0 {
			t.Fatalf("NormalizeKey(%q) = %q: not a storable key", s, got)
		}
		if got != NormalizeKey(s) {
			t.Fatal("not deterministic")
		}
		if got != s && !strings.HasPrefix(got, HashedKeyPrefix) {
			t.Fatalf("changed without hashing: %q -> %q", s, got)
		}
		// Idempotent: a stored key normalizes to a stored key; a kept key to itself.
		if got == s && NormalizeKey(got) != got {
			t.Fatal("kept key is not a fixed point")
		}
	})
}

func TestLeaseIdempotencyKey(t *testing.T) {
	first := Identity{Scope: "billing", MessageID: "m-1", BusinessKey: "pay-1"}
	resend := Identity{Scope: "billing", MessageID: "m-2", BusinessKey: "pay-1"}
	if k := (Lease{Identity: resend, Record: first}).IdempotencyKey(); k != "billing/m-1/pay-1" {
		t.Fatalf("takeover by business key: %q, want the record's identity", k)
	}
	if k := (Lease{Identity: resend}).IdempotencyKey(); k != "billing/m-2/pay-1" {
		t.Fatalf("no record identity: %q, want the delivery's", k)
	}
}
