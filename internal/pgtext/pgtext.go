package pgtext

import (
	"strings"
	"unicode/utf8"
)

// Clip returns s as valid UTF-8 without NUL bytes (Postgres text rejects
// both; each offending byte becomes U+FFFD) and at most n bytes long, cut on
// a rune boundary and ended with "…" when shortened. n must be at least 3.
func Clip(s string, n int) string {
	s = strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", "\uFFFD"), "\uFFFD")
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
