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
	for _, s := range []string{"", "pay-1", strings.Repeat("x", 300), "a\xff", "a\x00", "sha256:00", "заказ", " ", "\t", " a "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := NormalizeKey(s)
		if IsBlank(s) {
			if got != "" {
				t.Fatalf("blank key %q became %q", s, got)
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

// blanks are keys that hold nothing but white space (unicode.IsSpace).
var blanks = []string{"", " ", "\t", "\n", "\r\n", " \t \v\f", "\u0085", "\u00a0", "\u1680", "\u2003", "\u2028", "\u202f", "\u3000"}

func TestIsBlank(t *testing.T) {
	for _, b := range blanks {
		if !IsBlank(b) {
			t.Errorf("IsBlank(%q) = false", b)
		}
	}
	// Not white space: zero-width characters, NUL, invalid UTF-8, anything
	// with a visible character.
	for _, s := range []string{"a", " a ", "\u200b", "\ufeff", "\x00", "\xff", "\t-\t"} {
		if IsBlank(s) {
			t.Errorf("IsBlank(%q) = true", s)
		}
	}
}

// S20: a blank message ID is absent (the position applies) and a blank
// business key is none, so blank keys never make messages share an identity.
func TestNewIdentityBlankKeys(t *testing.T) {
	seen := map[string]bool{}
	for i, b := range blanks {
		pos := "kafka:orders/0/" + string(rune('a'+i))
		id, err := NewIdentity("orders-svc", b, pos, b)
		if err != nil || id.MessageID != pos || id.BusinessKey != "" || seen[id.MessageID] {
			t.Fatalf("blank %q: identity %+v, %v; want message ID %q and no business key", b, id, err, pos)
		}
		seen[id.MessageID] = true
		if got := NormalizeKey(b); got != "" {
			t.Fatalf("NormalizeKey(%q) = %q, want \"\"", b, got)
		}
		if _, err := NewIdentity("orders-svc", "", b, ""); !errors.Is(err, ErrEmptyMessageID) {
			t.Fatalf("blank fallback %q: err = %v", b, err)
		}
	}
	// Keys that are not blank are kept exactly, surrounding spaces included.
	id, err := NewIdentity("orders-svc", " m-1 ", "kafka:orders/0/1", " ord-1")
	if err != nil || id.MessageID != " m-1 " || id.BusinessKey != " ord-1" {
		t.Fatalf("identity %+v, %v", id, err)
	}
}
