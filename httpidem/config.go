package httpidem

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"go.opentelemetry.io/otel/trace"
)

// ErrInvalidConfig is wrapped by every error New returns for a bad Config;
// it is dedup.ErrInvalidConfig.
var ErrInvalidConfig = dedup.ErrInvalidConfig

// Extractor takes one part of a request's identity or fingerprint from the
// request: the tenant, the principal, the route pattern or the API version.
// It must be deterministic for retries of one request. An error answers the
// request without running the handler: with the error's *Problem when it
// wraps one (errors.As; e.g. a 401 from a Principal extractor), else 400
// with a problem body of type TypeUnidentified.
type Extractor func(r *http.Request) (string, error)

// Header returns an Extractor of the value of request header name ("" when
// absent), e.g. Config.APIVersion = Header("Api-Version"). As Principal, an
// absent or blank header is answered 401 (see Config.Principal).
func Header(name string) Extractor {
	return func(r *http.Request) (string, error) { return r.Header.Get(name), nil }
}

// Cookie returns an Extractor of the value of the request's cookie name
// ("" when absent), e.g. Config.Anonymous = Cookie("session") for a form
// whose callers are known by their session only.
func Cookie(name string) Extractor {
	return func(r *http.Request) (string, error) {
		if c, err := r.Cookie(name); err == nil {
			return c.Value, nil
		}
		return "", nil // absent: blank, refused by the middleware
	}
}

// Pattern is the default route Extractor: the pattern of the net/http
// ServeMux route that matched the request (http.Request.Pattern, Go 1.23+;
// e.g. "POST /payments"). It fails when the pattern is empty (the handler
// was not reached through a ServeMux route): give routers that do not set
// Request.Pattern (chi, echo, gin) their own Route extractor (see the
// package documentation).
func Pattern(r *http.Request) (string, error) {
	if r.Pattern == "" {
		return "", errors.New("httpidem: the request has no route pattern (Request.Pattern is empty): set Config.Route for this router")
	}
	return r.Pattern, nil
}

// DefaultFinalStatus is the default Config.FinalStatus: every status below
// 500 is final (stored and replayed) except 408 Request Timeout, 409
// Conflict, 425 Too Early and 429 Too Many Requests, which say "try again"
// and leave the record retryable, like every 5xx.
func DefaultFinalStatus(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status < 500
}

// Config configures a Middleware. The zero value of every field but Store,
// Fingerprinter and Principal (or Anonymous) means "use the default" given
// in the field's comment.
type Config struct {
	// Store keeps the consumption records, dead letters and stored
	// responses (the same tables as the MQ side; run Store.Migrate, which
	// includes the stored-response table). Required. Its MaxAttempts bounds
	// how often one key's handler may fail retryably before the record is
	// FAILED_FINAL (answered 409 TypeKeyExhausted); its TxOptions are the
	// handler transaction's; its SucceededRetention must cover RetryWindow.
	Store *pgstore.Store
	// Fingerprinter makes the request fingerprints (HMAC-SHA256, key
	// rotation with current and previous keys). Required; build it with
	// dedup.NewFingerprinter(nil, keys...): the middleware canonicalizes
	// the request itself, so a Canonicalizer would only break it.
	Fingerprinter *dedup.Fingerprinter
	// Principal extracts who sends the request (a user or API client ID,
	// from the verified credentials). Required unless Anonymous is set.
	// Part of the scope, so two principals' keys never collide, and the key
	// of the MaxUnfinished cap. An empty or blank value (no credentials,
	// an authentication middleware that did not run) is no identity: the
	// request is answered 401 TypeUnauthenticated before anything is
	// written, unless Anonymous is set.
	Principal Extractor
	// Anonymous, when set, opens the routes to callers without a
	// principal, explicitly: a request whose Principal is empty or blank
	// (or every request, when Principal is nil) is scoped by what
	// Anonymous extracts instead, something the caller owns and others
	// cannot send (a session cookie, a device ID), in a key space of its
	// own (AnonymousScope), so an anonymous caller never shares keys with a
	// principal or with another anonymous caller. A blank value is
	// answered 401 TypeUnauthenticated. Default nil: no anonymous callers.
	Anonymous Extractor
	// Tenant extracts the tenant. Default nil: "" (one tenant). Part of the
	// scope. When set, an empty or blank tenant is answered 400
	// TypeUnidentified before anything is written.
	Tenant Extractor
	// Route extracts the route pattern, part of the scope and of the
	// fingerprint. Default Pattern (net/http ServeMux's
	// Request.Pattern). Keys are per route: the same key on two routes is
	// two requests. Within a route, the concrete target (the path, with
	// its path values, and the query, canonical: parameter order does not
	// matter) is part of the fingerprint: the same key sent to another
	// resource or with other parameters is a conflict (ConflictStatus),
	// never a replay.
	Route Extractor
	// IgnoreQuery are query parameter names (exact, case-sensitive) left
	// out of the fingerprint's target, so a retry that differs only in
	// them (a cache buster, a tracking parameter) is a replay. Default
	// none: every parameter counts.
	IgnoreQuery []string
	// APIVersion extracts the API version, part of the fingerprint (a
	// retry under another version is a conflict). Default nil: no version.
	// Header("Api-Version") takes it from a header.
	APIVersion Extractor
	// Methods are the request methods that require an Idempotency-Key;
	// requests with other methods pass through to the handler untouched.
	// Default ["POST", "PATCH"] (the methods that are not idempotent by
	// definition). Names are upper case.
	Methods []string
	// IgnoreFields are JSON members left out of the request fingerprint
	// (e.g. "traceId", or a JSON Pointer "/meta/sentAt"), so a retry that
	// differs only in them is a replay. Default none.
	IgnoreFields []string
	// MaxBodyBytes bounds the request body, read whole before the
	// handler runs (for the fingerprint). A larger body is answered 413
	// with a problem body of type TypeBodyTooLarge, the handler not
	// called and nothing recorded. Default 1 MiB; 1 byte to 1 GiB.
	MaxBodyBytes int64
	// InFlightWait is how long a request waits for another request with
	// the same key that is still running (its transaction holds the
	// record) before it is answered 409 with Retry-After (TypeInFlight).
	// When the first finishes within the wait, the copy is answered from
	// its outcome (a replay, or a run of its own after a retryable
	// failure). Default 0: answer at once, without waiting. Rounded up to
	// whole milliseconds; at most 1 minute.
	InFlightWait time.Duration
	// AsyncStatus, when set, makes the routes asynchronous for copies: a
	// request whose key is in flight is answered 202 Accepted with
	// Location: the URL it returns (the operation's status resource, which
	// the service serves, e.g. "/operations/" + info.DownstreamKey()),
	// Retry-After and an empty body, instead of 409. An empty URL falls
	// back to 409. The first request is answered as usual, and so is every
	// retry once it finished (a replay). Default nil: 409.
	AsyncStatus func(r *http.Request, info Info) string
	// RetryAfter is the Retry-After of 409 in-flight and 429 answers,
	// rounded up to whole seconds. Default 1s; at most 1 hour.
	RetryAfter time.Duration
	// ConflictStatus answers a request whose key was used with another
	// request (different fingerprint): 422 (the IETF
	// Idempotency-Key draft) or 409. Default 422.
	ConflictStatus int
	// FinalStatus reports whether a handler's response status ends the
	// request: a final response is stored and replayed to every retry; any
	// other leaves the record retryable (its attempt counted) and the
	// next retry runs the handler again. 2xx and 3xx are always final.
	// Default DefaultFinalStatus (4xx except 408, 409, 425 and 429).
	FinalStatus func(status int) bool
	// MaxUnfinished caps the keys per tenant and principal whose record
	// is unfinished (its handler failed retryably, not yet retried to an
	// end) and was touched within RetryWindow: a request with a new key
	// beyond it is answered 429 with Retry-After (TypeTooManyUnfinished),
	// so random keys cannot fill the table with retryable records. The
	// check is one index scan of at most MaxUnfinished rows, sent in the
	// round trip of the key's lock (it costs no round trip of its own);
	// concurrent new keys may pass it together (a soft cap). Default 100;
	// 1 to 1,000,000.
	MaxUnfinished int
	// RetryWindow is how long clients may retry a request with the same
	// key. The Store's SucceededRetention must be at least this long
	// (else New fails naming both): a retry after the record was purged
	// would run the handler again. Unfinished records older than this
	// no longer count against MaxUnfinished. Default 24h.
	RetryWindow time.Duration
	// Timeout bounds the handler and the recording of its outcome. Both
	// run on a context detached from the client connection
	// (context.WithoutCancel of the request's context): a client that
	// hangs up never interrupts a handler that may have written, nor the
	// COMMIT that records it. Default 30s; 1s to 1h.
	Timeout time.Duration
	// StoredHeaders are the response headers stored and replayed
	// (canonical names; Content-Length and hop-by-hop headers are never
	// stored). Default DefaultStoredHeaders(): Content-Type,
	// Content-Language, Content-Location, Location, Etag, Last-Modified.
	// The Resource-Id header (ResourceIDHeader) is always stored.
	StoredHeaders []string
	// MaxResponseBytes bounds a stored response body (after Redact). A
	// larger body is not stored: its replays have the status, the stored
	// headers, the Resource-Id and an empty body, marked with
	// Idempotent-Replay-Body-Omitted: true (BodyOmittedHeader). Default
	// DefaultMaxResponseBytes (64 KiB); 1 byte to 16 MiB.
	MaxResponseBytes int
	// Sealer, when set, encrypts stored responses at rest (e.g.
	// NewAESGCM with key IDs for rotation), bound to their record: a blob
	// copied to another record fails to open. Keep every key that sealed
	// a response within the Store's SucceededRetention. Default nil:
	// stored in plain text.
	Sealer Sealer
	// Redact, when set, returns the body to store for a final response
	// (e.g. with card numbers masked); the client of the first request
	// gets the body unchanged, replays get the redacted one. Default nil:
	// stored as sent.
	Redact func(status int, header http.Header, body []byte) []byte
	// Lease, when set, runs the handler in lease mode, for handlers whose
	// side effects cannot join a transaction (a payment provider's API):
	// the claim commits first (PROCESSING, owner token, fence, a lease of
	// Lease.TTL in database time, extended by heartbeats), the handler
	// runs without a transaction (FromContext returns nil) and passes
	// KeyFromContext downstream, its final response is stored under the
	// lease's token and fence, then the record is marked SUCCEEDED. A copy
	// that finds a live lease gets 409 + Retry-After; one that finds an
	// expired lease takes over (fence + 1) and runs the handler again
	// with the same downstream key; a stale owner's response and marks
	// are refused (fenced). The Store's own Fingerprinter must be
	// Config.Fingerprinter (lease mode fingerprints through the store).
	// Default nil: atomic mode. TTL at least 1s (see dedup.LeaseOptions).
	Lease *dedup.LeaseOptions
	// Metrics, when set, counts outcomes (see NewMetrics). Default nil.
	Metrics *Metrics
	// TracerProvider makes the server span the middleware creates, or
	// enriches when the request context already holds a recording span
	// (from otelhttp), with HTTP semantic-convention attributes. Default
	// nil: the span in the request context, if any, is enriched and none
	// is created.
	TracerProvider trace.TracerProvider
	// Logger receives failures to record an outcome. Default
	// slog.Default().
	Logger *slog.Logger
}

const (
	defaultMaxBodyBytes  = 1 << 20
	defaultRetryAfter    = time.Second
	defaultMaxUnfinished = 100
	defaultRetryWindow   = 24 * time.Hour
	defaultTimeout       = 30 * time.Second
)

func (c Config) withDefaults() Config {
	if c.Route == nil {
		c.Route = Pattern
	}
	if c.Methods == nil {
		c.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = defaultMaxBodyBytes
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = defaultRetryAfter
	}
	if c.ConflictStatus == 0 {
		c.ConflictStatus = http.StatusUnprocessableEntity
	}
	if c.FinalStatus == nil {
		c.FinalStatus = DefaultFinalStatus
	}
	if c.MaxUnfinished == 0 {
		c.MaxUnfinished = defaultMaxUnfinished
	}
	if c.RetryWindow == 0 {
		c.RetryWindow = defaultRetryWindow
	}
	if c.Timeout == 0 {
		c.Timeout = defaultTimeout
	}
	if c.StoredHeaders == nil {
		c.StoredHeaders = DefaultStoredHeaders()
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate applies the defaults to a copy of c and checks it: the errors New
// would return, wrapping ErrInvalidConfig (ErrRetentionTooShort for
// RetryWindow) and naming the field.
func (c Config) Validate() error {
	return c.withDefaults().validate()
}

func (c Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: httpidem: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case c.Store == nil:
		return bad("Store is required")
	case c.Fingerprinter == nil:
		return bad("Fingerprinter is required (dedup.NewFingerprinter(nil, keys...))")
	case c.Principal == nil && c.Anonymous == nil:
		return bad("Principal is required (or Anonymous, for routes open to anonymous callers)")
	case len(c.Methods) == 0:
		return bad("Methods is empty: give at least one method, or leave it nil for the default")
	case c.MaxBodyBytes < 1 || c.MaxBodyBytes > 1<<30:
		return bad("MaxBodyBytes %d must be 1 to %d", c.MaxBodyBytes, 1<<30)
	case c.InFlightWait < 0 || c.InFlightWait > time.Minute:
		return bad("InFlightWait %s must be 0 to 1m", c.InFlightWait)
	case c.RetryAfter < 0 || c.RetryAfter > time.Hour:
		return bad("RetryAfter %s must be 0 to 1h", c.RetryAfter)
	case c.ConflictStatus != http.StatusUnprocessableEntity && c.ConflictStatus != http.StatusConflict:
		return bad("ConflictStatus %d must be 422 or 409", c.ConflictStatus)
	case c.MaxUnfinished < 1 || c.MaxUnfinished > 1_000_000:
		return bad("MaxUnfinished %d must be 1 to 1000000", c.MaxUnfinished)
	case c.RetryWindow < time.Minute:
		return bad("RetryWindow %s must be at least 1m", c.RetryWindow)
	case c.Timeout < time.Second || c.Timeout > time.Hour:
		return bad("Timeout %s must be 1s to 1h", c.Timeout)
	case c.MaxResponseBytes < 1 || c.MaxResponseBytes > 16<<20:
		return bad("MaxResponseBytes %d must be 1 to %d", c.MaxResponseBytes, 16<<20)
	}
	for _, m := range c.Methods {
		if m == "" || !slices.Contains([]string{http.MethodPost, http.MethodPatch, http.MethodPut, http.MethodDelete, http.MethodGet}, m) {
			return bad("Methods: %q must be one of POST, PATCH, PUT, DELETE, GET", m)
		}
	}
	if c.Lease != nil {
		if err := c.Lease.ValidateUnder(0); err != nil {
			return bad("Lease: %v", err)
		}
		if c.Store.Config().Fingerprinter != c.Fingerprinter {
			return bad("Lease: the Store's Fingerprinter must be Config.Fingerprinter (lease mode fingerprints through the store)")
		}
	}
	if err := validateIgnoreQuery(c.IgnoreQuery); err != nil {
		return bad("IgnoreQuery: %v", err)
	}
	if err := validateIgnore(c.IgnoreFields); err != nil {
		return bad("IgnoreFields: %v", err)
	}
	for i, h := range c.StoredHeaders {
		if h == "" || http.CanonicalHeaderKey(h) != h {
			return bad("StoredHeaders[%d] %q must be a canonical header name (%q)", i, h, http.CanonicalHeaderKey(h))
		}
	}
	if got := c.Store.SucceededRetention(); got < c.RetryWindow {
		return fmt.Errorf("%w: httpidem: Store SucceededRetention %s < RetryWindow %s: a retry after the record was purged would run the handler again",
			dedup.ErrRetentionTooShort, got, c.RetryWindow)
	}
	return nil
}
