package httpidem

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/gowebpki/jcs"
)

// CanonicalVersion is the version of the request-body canonicalization rules
// that new fingerprints are computed with. The middleware stores it next to
// each fingerprint and recomputes a retry's fingerprint with the stored
// version, so a rule change (a new version) never turns a retry of a request
// that was recorded under the old rules into a fingerprint conflict.
//
// Version 2 (the current version) has version 1's body rules and adds the
// request target to the fingerprint: the path and the query, canonical
// (see canonicalTarget: RFC 3986 path normalization, parameters sorted by
// name, Config.IgnoreQuery left out), so one key sent to two resources of
// one route pattern (/invoices/inv-901/credits, /invoices/inv-902/credits)
// or with other parameters (?cents=7, ?cents=700) is a conflict, never a
// replay of the other's response. Records stored under version 1 are
// compared on version 1's input, without the target: their retries after
// an upgrade still replay (a retry is sent to the same target), and the
// target check covers them once they leave Config.RetryWindow.
//
// Version 1:
//   - JSON bodies (media type application/json, or any subtype ending in
//     "+json", parameters such as charset ignored, case-insensitive) are
//     canonicalized per RFC 8785 (JCS) with github.com/gowebpki/jcs: members
//     sorted by UTF-16 code units, insignificant whitespace dropped, strings
//     and numbers serialized as ECMAScript's JSON.stringify does (1.0, 1e0 and
//     1 are all "1"). JCS numbers are IEEE-754 doubles, so integers beyond
//     2^53 that differ only past double precision canonicalize equal; send
//     such values (IDs, minor-unit amounts of that size) as strings.
//   - Malformed JSON, invalid UTF-8, duplicate member names and nesting
//     deeper than the library's limit are errors (the middleware answers 400).
//   - A JSON body that is empty or only whitespace canonicalizes to an empty
//     body, the same as no body.
//   - The ignore list removes members before canonicalization (see
//     [canonicalBody]).
//   - Any other body is taken byte for byte.
//
// Changing any rule above requires a new version; the frozen outputs in
// canonical_test.go and target_test.go fail when a version's output
// changes.
const CanonicalVersion = 2

// errMalformedJSON wraps every error about a JSON request body that cannot be
// canonicalized; the middleware maps it to 400 with a problem body.
var errMalformedJSON = errors.New("httpidem: malformed JSON request body")

// errUnknownCanonicalVersion is returned for a stored canonicalization
// version this build does not know (a record written by a newer build).
var errUnknownCanonicalVersion = errors.New("httpidem: unknown body canonicalization version")

// canonicalizers maps each known version to its rules. A version, once
// released, is never changed: a new rule set gets a new entry and
// CanonicalVersion moves to it.
var canonicalizers = map[int]func(contentType string, body []byte, ignore []string) ([]byte, error){
	1: canonicalV1,
	2: canonicalV1, // same body rules; the fingerprint adds the target
}

// canonicalBody returns the canonical form of a request body under the
// current rules ([CanonicalVersion]) and that version, for the fingerprint.
//
// ignore lists JSON members to remove before canonicalizing (JSON bodies
// only; other bodies ignore it). Each entry is either
//   - a JSON Pointer (RFC 6901) when it starts with "/": it removes exactly
//     that member ("/meta/traceId", "/items/0/note"; "~1" stands for "/" and
//     "~0" for "~" in a name), and does nothing when the path does not exist
//     or ends in an array index;
//   - otherwise a member name: every member with exactly that name is removed
//     at any depth, also inside arrays ("traceId").
//
// The returned slice may alias body for non-JSON bodies. Errors wrap
// errMalformedJSON (bad body) or describe a bad ignore entry (see
// validateIgnore; the middleware validates its configuration up front).
func canonicalBody(contentType string, body []byte, ignore []string) (version int, canon []byte, err error) {
	canon, err = canonicalBodyVersion(CanonicalVersion, contentType, body, ignore)
	return CanonicalVersion, canon, err
}

// canonicalBodyVersion canonicalizes body under the rules of version v, the
// version stored with a record, so that a retry is compared under the rules
// its first request was recorded with. An unknown v returns an error wrapping
// errUnknownCanonicalVersion.
func canonicalBodyVersion(v int, contentType string, body []byte, ignore []string) ([]byte, error) {
	c, ok := canonicalizers[v]
	if !ok {
		return nil, fmt.Errorf("%w: %d (this build knows 1..%d)", errUnknownCanonicalVersion, v, CanonicalVersion)
	}
	return c(contentType, body, ignore)
}

// isJSONMediaType reports whether a Content-Type value names JSON:
// application/json or a structured-syntax "+json" subtype, any parameters and
// letter case ignored.
func isJSONMediaType(contentType string) bool {
	mt, _, _ := strings.Cut(contentType, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	typ, sub, ok := strings.Cut(mt, "/")
	if !ok || typ != "application" {
		return false
	}
	return sub == "json" || (len(sub) > len("+json") && strings.HasSuffix(sub, "+json"))
}

// validateIgnore checks an ignore list for canonicalBody: no empty entry and
// every JSON Pointer well formed ("~" only in "~0" or "~1"). The error names
// the offending entry and its index.
func validateIgnore(ignore []string) error {
	for i, e := range ignore {
		if e == "" {
			return fmt.Errorf("httpidem: ignore entry %d is empty (want a member name or a JSON Pointer starting with \"/\")", i)
		}
		if strings.HasPrefix(e, "/") {
			if _, err := parsePointer(e); err != nil {
				return fmt.Errorf("httpidem: ignore entry %d %q: %w", i, e, err)
			}
		}
	}
	return nil
}

// parsePointer splits an RFC 6901 JSON Pointer (starting with "/") into its
// unescaped reference tokens.
func parsePointer(p string) ([]string, error) {
	toks := strings.Split(p[1:], "/")
	for i, t := range toks {
		for j := 0; j < len(t); j++ {
			if t[j] == '~' && (j+1 == len(t) || (t[j+1] != '0' && t[j+1] != '1')) {
				return nil, errors.New("bad JSON Pointer escape: \"~\" must be followed by 0 or 1")
			}
		}
		toks[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return toks, nil
}

func canonicalV1(contentType string, body []byte, ignore []string) ([]byte, error) {
	if !isJSONMediaType(contentType) {
		return body, nil
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return []byte{}, nil
	}
	// JCS first: it rejects what I-JSON forbids (duplicate names, invalid
	// UTF-8, trailing data), so the lenient encoding/json below only ever
	// sees a valid, canonical document.
	canon, err := jcs.Transform(body)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errMalformedJSON, err)
	}
	if len(ignore) == 0 {
		return canon, nil
	}
	if err := validateIgnore(ignore); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(canon))
	dec.UseNumber() // keep each number's JCS text, no float round trip
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%w: %w", errMalformedJSON, err)
	}
	removed := false
	for _, e := range ignore {
		if strings.HasPrefix(e, "/") {
			toks, _ := parsePointer(e) // validated above
			removed = removePointer(doc, toks) || removed
		} else {
			removed = removeName(doc, e) || removed
		}
	}
	if !removed {
		return canon, nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("httpidem: re-encoding JSON body after removing ignored members: %w", err)
	}
	// encoding/json writes members in sorted UTF-8 order, not JCS's UTF-16
	// order, and escapes strings its own way: canonicalize once more.
	out, err := jcs.Transform(buf.Bytes())
	if err != nil {
		return nil, fmt.Errorf("httpidem: canonicalizing JSON body after removing ignored members: %w", err)
	}
	return out, nil
}

// removeName deletes every member called name in every object of doc.
func removeName(doc any, name string) bool {
	removed := false
	switch v := doc.(type) {
	case map[string]any:
		if _, ok := v[name]; ok {
			delete(v, name)
			removed = true
		}
		for _, child := range v {
			removed = removeName(child, name) || removed
		}
	case []any:
		for _, child := range v {
			removed = removeName(child, name) || removed
		}
	}
	return removed
}

// removePointer deletes the object member that toks points to. Array
// elements are traversed by index but never removed (that would shift the
// others).
func removePointer(doc any, toks []string) bool {
	cur := doc
	for i, t := range toks {
		last := i == len(toks)-1
		switch v := cur.(type) {
		case map[string]any:
			child, ok := v[t]
			if !ok {
				return false
			}
			if last {
				delete(v, t)
				return true
			}
			cur = child
		case []any:
			if last {
				return false
			}
			n, err := strconv.Atoi(t)
			if err != nil || n < 0 || n >= len(v) || (len(t) > 1 && t[0] == '0') {
				return false
			}
			cur = v[n]
		default:
			return false
		}
	}
	return false
}
