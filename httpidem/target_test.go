package httpidem

import (
	"net/url"
	"strings"
	"testing"
)

func target(t *testing.T, rawURL string, ignore ...string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return canonicalTarget(u, ignore)
}

// Spellings a handler cannot tell apart have one canonical target:
// parameter order, equivalent escapes, "?a" and "?a=", an empty query,
// percent-encoded unreserved characters in the path, lower-case hex.
func TestCanonicalTargetEquivalentSpellingsEqual(t *testing.T) {
	for _, group := range [][]string{
		{"/invoices/inv-903/credits?cents=7&reason=late", "/invoices/inv-903/credits?reason=late&cents=7", "/invoices/inv-903/credits?reason=l%61te&cents=%37"},
		{"/x?q=a+b", "/x?q=a%20b"},
		{"/x?flag", "/x?flag="},
		{"/x", "/x?"},
		{"/orders/o-1", "/orders/o%2D1", "/orders/o%2d1", "/%6Frders/o-1"},
		{"/files/a%2fb", "/files/a%2Fb"},
		{"/x?tag=a&tag=b&n=1", "/x?n=1&tag=a&tag=b", "/x?tag=a&n=1&tag=b"},
	} {
		want := target(t, group[0])
		for _, u := range group[1:] {
			if got := target(t, u); got != want {
				t.Errorf("%s → %q, want %q (as %s)", u, got, want, group[0])
			}
		}
	}
}

// Requests that act on another resource or with other parameters have
// different targets: path values, parameter values, the order of one
// parameter's values, letter case, an encoded slash, a trailing slash, a
// parameter present or not.
func TestCanonicalTargetDifferentRequestsDiffer(t *testing.T) {
	for _, pair := range [][2]string{
		{"/invoices/inv-901/credits", "/invoices/inv-902/credits"},
		{"/invoices/inv-903/credits?cents=7", "/invoices/inv-903/credits?cents=700"},
		{"/invoices/inv-903/credits?cents=7", "/invoices/inv-903/credits"},
		{"/x?tag=a&tag=b", "/x?tag=b&tag=a"},
		{"/x?Cents=7", "/x?cents=7"},
		{"/x?q=A", "/x?q=a"},
		{"/files/a%2Fb", "/files/a/b"},
		{"/x/", "/x"},
		{"/x?a=1", "/x?a=1&a=1"},
		{"/x?a=%zz", "/x?a=%25zz"},
		{"/x?a=1;b=2", "/x?a=1&b=2"},
	} {
		if a, b := target(t, pair[0]), target(t, pair[1]); a == b {
			t.Errorf("%s and %s share the target %q", pair[0], pair[1], a)
		}
	}
}

// Config.IgnoreQuery leaves parameters out; a query that does not parse is
// kept byte for byte, marked, and ignores nothing.
func TestCanonicalTargetIgnoreAndMalformed(t *testing.T) {
	if a, b := target(t, "/x?cents=7&_=1733100000", "_"), target(t, "/x?_=42&cents=7", "_"); a != b || a != "/x?cents=7" {
		t.Errorf("ignored cache buster: %q and %q, want /x?cents=7", a, b)
	}
	if got := target(t, "/x?_=1", "_"); got != "/x" {
		t.Errorf("only ignored parameters: %q, want /x", got)
	}
	if got := target(t, "/x?a=%zz&_=1", "_"); got != "/x?\x00a=%zz&_=1" {
		t.Errorf("malformed query: %q", got)
	}
	if err := validateIgnoreQuery([]string{"ok", ""}); err == nil || !strings.Contains(err.Error(), "entry 1") {
		t.Errorf("empty IgnoreQuery entry: %v", err)
	}
}

// Version 2's canonical targets, frozen: a change here changes the
// fingerprints of stored records, which needs a new CanonicalVersion.
func TestCanonicalTargetVersion2Frozen(t *testing.T) {
	for in, want := range map[string]string{ //nolint:gosec // URL paths and queries, not credentials
		"/invoices/inv-903/credits?reason=late&cents=7": "/invoices/inv-903/credits?cents=7&reason=late",
		"/a%7e/b%2f?z=%C3%A9&y=a+b&y=c":                 "/a~/b%2F?y=a+b&y=c&z=%C3%A9",
		"/x?":                                           "/x",
	} {
		if got := target(t, in); got != want {
			t.Errorf("%s → %q, want %q", in, got, want)
		}
	}
}

// The fingerprint covers the target from version 2 on; version 1's input,
// which stored records of version 1 are compared on, is what it was.
func TestFingerprintInputTargetByVersion(t *testing.T) {
	a := request{route: "POST /invoices/{invoice}/credits", principal: "p-23", target: "/invoices/inv-901/credits"}
	b := a
	b.target = "/invoices/inv-902/credits"
	if string(fingerprintInput(1, "POST", a, nil)) != string(fingerprintInput(1, "POST", b, nil)) {
		t.Error("version 1's input changed: it must not cover the target")
	}
	if string(fingerprintInput(1, "POST", a, nil)) != string(appendParts(nil, "POST", a.route, "", "", "", "p-23", "")) {
		t.Error("version 1's input is not method, route, media type, version, tenant, principal, body")
	}
	if string(fingerprintInput(CanonicalVersion, "POST", a, nil)) == string(fingerprintInput(CanonicalVersion, "POST", b, nil)) {
		t.Error("the current version's input does not cover the target")
	}
}

// An anonymous caller's scope never equals a principal's, whatever the
// principal (the marker cannot come out of escaping).
func TestAnonymousScopeIsItsOwnKeySpace(t *testing.T) {
	for _, p := range []string{"s-1", "%anonymous:s-1", anonymousMarker + "s-1", "%25anonymous:s-1"} {
		if Scope("t", p, "POST", "POST /gifts") == AnonymousScope("t", "s-1", "POST", "POST /gifts") {
			t.Errorf("principal %q shares the anonymous caller s-1's scope", p)
		}
	}
	if AnonymousScope("t", "a|b", "POST", "/x") == AnonymousScope("t", "a%7Cb", "POST", "/x") {
		t.Error("anonymous owners escaped ambiguously")
	}
	if got := AnonymousScope("", "s-1", "POST", "POST /gifts"); got != "http||%anonymous:s-1|POST|POST /gifts" {
		t.Errorf("AnonymousScope = %q", got)
	}
}
