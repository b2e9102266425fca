package wire_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemq/idemq/wire"
)

func TestCheckMessageID(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"m-1", true},
		{" m-1 ", true},
		{"0190a5c4-5d2e-7b3a-8c1d-2e3f4a5b6c7d", true},
		{strings.Repeat("x", wire.MaxMessageIDBytes), true},
		{"", false},
		{" \t\u00a0", false},
		{strings.Repeat("x", wire.MaxMessageIDBytes+1), false},
		{"a\xffb", false},
		{"a\x00b", false},
		{wire.HashedIDPrefix + "abc", false},
	} {
		err := wire.CheckMessageID(tc.id)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, wire.ErrInvalidMessageID)) {
			t.Errorf("CheckMessageID(%q) = %v, want ok=%v", tc.id, err, tc.ok)
		}
	}
}

func TestIsBlank(t *testing.T) {
	for s, want := range map[string]bool{"": true, " ": true, "\t\n\u3000": true, "x": false, " x ": false, "\xff": false} {
		if got := wire.IsBlank(s); got != want {
			t.Errorf("IsBlank(%q) = %v, want %v", s, got, want)
		}
	}
}
