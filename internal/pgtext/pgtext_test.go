package pgtext

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClip(t *testing.T) {
	for _, in := range []string{"", "plain", "a\x00b", "bad\xff", strings.Repeat("é", 100), strings.Repeat("x", 500)} {
		got := Clip(in, 64)
		if len(got) > 64 || !utf8.ValidString(got) || strings.IndexByte(got, 0) >= 0 {
			t.Errorf("Clip(%q) = %q", in, got)
		}
	}
	if Clip("short", 64) != "short" {
		t.Error("short string changed")
	}
}
