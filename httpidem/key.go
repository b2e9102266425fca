package httpidem

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
)

// KeyHeader is the request header carrying the idempotency key
// (draft-ietf-httpapi-idempotency-key-header).
const KeyHeader = "Idempotency-Key"

// ReplayHeader marks a replayed response: "Idempotent-Replayed: true".
const ReplayHeader = "Idempotent-Replayed"

// BodyOmittedHeader marks a replay whose body was not stored because it
// exceeded Config.MaxResponseBytes: "Idempotent-Replay-Body-Omitted: true".
const BodyOmittedHeader = "Idempotent-Replay-Body-Omitted"

// MaxKeyBytes is the longest accepted Idempotency-Key, in bytes.
const MaxKeyBytes = 255

// ErrInvalidKey is returned by ValidateKey.
var ErrInvalidKey = errors.New("httpidem: the Idempotency-Key must be 1 to 255 bytes of printable ASCII (0x20-0x7E)")

// ValidateKey reports whether key is a valid Idempotency-Key: 1 to
// MaxKeyBytes bytes, each printable ASCII (0x20 to 0x7E; no control
// characters, no bytes above 0x7E). Such a key is stored as the record's
// message ID unchanged. Surrounding spaces are part of the key (net/http
// already trims the header value's optional white space).
func ValidateKey(key string) error {
	if key == "" || len(key) > MaxKeyBytes {
		return ErrInvalidKey
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return ErrInvalidKey
		}
	}
	return nil
}

// scopePrefix starts every scope the middleware writes, so HTTP records
// never collide with a consumer group's.
const scopePrefix = "http|"

// Scope returns the consumption-record scope of a request:
// "http|<tenant>|<principal>|<method>|<route>", each part escaped so that
// '|' appears only as the separator ('%' → "%25", '|' → "%7C"), which
// makes the mapping injective: two different (tenant, principal, method,
// route) never share a scope. A scope longer than 255 bytes (or not valid
// UTF-8) becomes "http|sha256:<64 hex digits>" of the long form. The CLI
// composes it from its parts to find a request's record: `idemq inspect
// -http-tenant T -http-principal P -http-method M -http-route R
// -message-id <key>` (or -scope with its result). The route is the
// pattern: the concrete target (path values, query) is part of the
// fingerprint, not of the scope.
func Scope(tenant, principal, method, route string) string {
	return scopeOf(tenant, escapePart(principal), method, route)
}

// AnonymousScope is the scope of a request from an anonymous caller
// (Config.Anonymous) identified by owner, what it owns (a session ID): its
// principal part is "%anonymous:" and the escaped owner, a form no escaped
// principal takes (an escaped part has '%' only in "%25" and "%7C"), so an
// anonymous caller never shares a key space with a principal. The CLI
// composes it with -http-anonymous OWNER instead of -http-principal.
func AnonymousScope(tenant, owner, method, route string) string {
	return scopeOf(tenant, anonymousPart(owner), method, route)
}

// anonymousMarker starts the principal part of an anonymous caller.
const anonymousMarker = "%anonymous:"

func anonymousPart(owner string) string { return anonymousMarker + escapePart(owner) }

// scopeOf builds a scope from a principal part already escaped (Scope) or
// marked anonymous (AnonymousScope).
func scopeOf(tenant, principalPart, method, route string) string {
	s := scopePrefix + escapePart(tenant) + "|" + principalPart + "|" + escapePart(method) + "|" + escapePart(route)
	if len(s) > MaxKeyBytes || !validUTF8NoNUL(s) {
		sum := sha256.Sum256([]byte(s))
		return scopePrefix + "sha256:" + hex.EncodeToString(sum[:])
	}
	return s
}

// principalKey is the key of the MaxUnfinished cap: tenant and principal
// part (escaped or marked anonymous, as in the scope; not length-bounded:
// it is compared, not indexed as a scope).
func principalKey(tenant, principalPart string) string {
	return escapePart(tenant) + "|" + principalPart
}

func escapePart(s string) string {
	if !strings.ContainsAny(s, "%|") {
		return s
	}
	return strings.NewReplacer("%", "%25", "|", "%7C").Replace(s)
}

func validUTF8NoNUL(s string) bool {
	return strings.IndexByte(s, 0) < 0 && strings.ToValidUTF8(s, "\uFFFD") == s
}
