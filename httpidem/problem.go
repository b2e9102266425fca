package httpidem

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// Problem types (RFC 9457 "type" members) of the answers the middleware
// gives without running the handler, or instead of its response. They are
// URNs: stable identifiers, not links.
const (
	// TypeKeyMissing: the method requires an Idempotency-Key and the
	// request has none. Status 400.
	TypeKeyMissing = "urn:idemq:problem:idempotency-key-missing"
	// TypeKeyInvalid: the Idempotency-Key is not 1 to 255 bytes of
	// printable ASCII (0x20–0x7E), or the header is repeated. Status 400.
	TypeKeyInvalid = "urn:idemq:problem:idempotency-key-invalid"
	// TypeKeyReused: the key was used before with a different request (its
	// fingerprint differs: body, target path or query, content type, API
	// version, route or principal). Status Config.ConflictStatus (422 by default). The
	// handler was not called; the record is unchanged; a dead letter with
	// reason payload_conflict keeps the request.
	TypeKeyReused = "urn:idemq:problem:idempotency-key-reused"
	// TypeInFlight: a request with the same key is still running. Status
	// 409, with Retry-After.
	TypeInFlight = "urn:idemq:problem:idempotency-key-in-flight"
	// TypeTooManyUnfinished: the principal has Config.MaxUnfinished
	// unfinished keys. Status 429, with Retry-After.
	TypeTooManyUnfinished = "urn:idemq:problem:too-many-unfinished-keys"
	// TypeKeyExhausted: the key's handler failed the store's MaxAttempts
	// times; the record is FAILED_FINAL with a dead letter. Status 409,
	// no Retry-After: use a new key, or have an operator re-drive it
	// (`idemq redrive`).
	TypeKeyExhausted = "urn:idemq:problem:idempotency-key-exhausted"
	// TypeBodyTooLarge: the request body exceeds Config.MaxBodyBytes.
	// Status 413.
	TypeBodyTooLarge = "urn:idemq:problem:request-body-too-large"
	// TypeBodyMalformed: the body could not be canonicalized (malformed
	// JSON under a JSON content type). Status 400.
	TypeBodyMalformed = "urn:idemq:problem:request-body-malformed"
	// TypeUnidentified: an Extractor (tenant, principal, route, API
	// version) failed without a Problem of its own, or a configured Tenant
	// is empty or blank. Status 400.
	TypeUnidentified = "urn:idemq:problem:request-unidentified"
	// TypeUnauthenticated: the request has no caller identity: Principal
	// returned an empty or blank value and the route is not open to
	// anonymous callers (Config.Anonymous), or Anonymous returned a blank
	// value too. Status 401, without WWW-Authenticate (the middleware knows
	// no authentication scheme: refuse such requests in the authentication
	// middleware before this one to send a challenge). Nothing is written.
	TypeUnauthenticated = "urn:idemq:problem:caller-unauthenticated"
	// TypeUnavailable: the record store could not be reached or the
	// outcome could not be recorded; nothing is known to have committed
	// and the request may be retried with the same key. Status 503, with
	// Retry-After.
	TypeUnavailable = "urn:idemq:problem:idempotency-store-unavailable"
)

// ProblemContentType is the media type of problem bodies (RFC 9457).
const ProblemContentType = "application/problem+json"

// Problem is an RFC 9457 problem detail, the body of every answer the
// middleware writes itself. It is also an error: an Extractor returning
// one (wrapped or not) has it written as the answer.
type Problem struct {
	// Type identifies the kind of problem (one of the Type* constants, or
	// an extractor's own URI).
	Type string `json:"type"`
	// Title is a short summary of the kind, the same for every instance.
	Title string `json:"title"`
	// Status is the HTTP status code.
	Status int `json:"status"`
	// Detail explains this occurrence.
	Detail string `json:"detail,omitempty"`
	// RetryAfter, when positive, is sent as the Retry-After header (whole
	// seconds, rounded up). Not part of the body.
	RetryAfter time.Duration `json:"-"`
}

// Error returns the title and detail.
func (p *Problem) Error() string {
	if p.Detail == "" {
		return p.Title
	}
	return p.Title + ": " + p.Detail
}

// WriteProblem writes p as an application/problem+json response, with
// Retry-After when p.RetryAfter is positive and Cache-Control: no-store.
func WriteProblem(w http.ResponseWriter, p *Problem) {
	h := w.Header()
	h.Set("Content-Type", ProblemContentType)
	h.Set("Cache-Control", "no-store")
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(retryAfterSeconds(p.RetryAfter), 10))
	}
	body, _ := json.Marshal(p) // strings and an int: cannot fail
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(body, '\n'))
}

// retryAfterSeconds rounds d up to whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, 1)
}
