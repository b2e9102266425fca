package httpidem

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// canonicalTarget is the request target a retry is compared on (part of the
// fingerprint from CanonicalVersion 2): the canonical path, then "?" and the
// canonical query when there is one. It tells apart two requests on one
// route pattern that act on different resources (/invoices/inv-901/credits
// and /invoices/inv-902/credits) or with different parameters (?cents=7 and
// ?cents=700), and leaves equal the spellings a handler cannot tell apart:
//
//   - The path is the escaped path (URL.EscapedPath) normalized per RFC 3986
//     section 6.2.2: a percent-encoded unreserved character (a letter, a
//     digit, "-", ".", "_" or "~") is decoded ("/o%2D1" is "/o-1"), every other escape keeps its
//     encoding with upper-case hex digits ("%2f" is "%2F", never "/": a
//     slash inside a path value is not a path separator). The host is not
//     part of it (give Config.Tenant the host when tenants are hosts).
//   - The query is parsed as the handler's URL.Query() reads it and
//     re-encoded with its parameters sorted by name (url.Values.Encode): the
//     order of parameters does not matter, the order of the values of one
//     repeated parameter does (?tag=a&tag=b is a list, ?tag=b&tag=a
//     another), and so does letter case. Equivalent escapes are equal
//     ("%41" and "A", "+" and "%20"), "?a" equals "?a=", and an empty query
//     ("?" alone) equals none. The parameters named in ignore
//     (Config.IgnoreQuery) are left out.
//   - A query that does not parse (a bad percent escape, a semicolon) is
//     compared byte for byte, marked so that it equals no parsed one.
func canonicalTarget(u *url.URL, ignore []string) string {
	t := normalizePath(u.EscapedPath())
	if q := canonicalQuery(u.RawQuery, ignore); q != "" {
		t += "?" + q
	}
	return t
}

// canonicalQuery is the canonical form of a raw query (see canonicalTarget).
func canonicalQuery(raw string, ignore []string) string {
	if raw == "" {
		return ""
	}
	v, err := url.ParseQuery(raw)
	if err != nil {
		return "\x00" + raw // url.Values.Encode never writes a NUL
	}
	for _, name := range ignore {
		delete(v, name)
	}
	return v.Encode()
}

// normalizePath decodes percent-encoded unreserved characters and writes
// the hex digits of every other escape in upper case (RFC 3986 6.2.2.1 and
// 6.2.2.2).
func normalizePath(p string) string {
	if !strings.Contains(p, "%") {
		return p
	}
	var b strings.Builder
	b.Grow(len(p))
	for i := 0; i < len(p); i++ {
		if p[i] == '%' && i+2 < len(p) && isHex(p[i+1]) && isHex(p[i+2]) {
			c := unhex(p[i+1])<<4 | unhex(p[i+2])
			if isUnreserved(c) {
				b.WriteByte(c)
			} else {
				b.WriteByte('%')
				b.WriteByte(upperHex(p[i+1]))
				b.WriteByte(upperHex(p[i+2]))
			}
			i += 2
			continue
		}
		b.WriteByte(p[i])
	}
	return b.String()
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

func upperHex(c byte) byte {
	if 'a' <= c && c <= 'f' {
		return c - 'a' + 'A'
	}
	return c
}

func isUnreserved(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

// validateIgnoreQuery checks Config.IgnoreQuery: no empty name.
func validateIgnoreQuery(names []string) error {
	for i, n := range names {
		if n == "" {
			return fmt.Errorf("entry %d is empty (want a query parameter name)", i)
		}
	}
	return nil
}

// errBlank is the cause of a refused blank tenant or principal.
var errBlank = errors.New("empty or blank (nothing identifies the caller)")
