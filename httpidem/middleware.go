package httpidem

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// ResourceIDHeader is the response header a handler may set to name the
// resource it created (e.g. "pay_123"). It is stored with the response
// even when the body is too large to store (Config.MaxResponseBytes), and
// replayed as this header on every replay.
const ResourceIDHeader = "Resource-Id"

// Middleware enforces Idempotency-Key semantics on the requests it wraps
// (see the package documentation). Build it with New; wrap handlers with
// Handler. Safe for concurrent use.
type Middleware struct {
	cfg     Config
	hs      *pgstore.HTTPStore
	methods map[string]bool
	tracer  trace.Tracer // nil: enrich the context's span only
}

// New validates cfg (see Config.Validate) and returns a Middleware. It does
// not touch the database: run cfg.Store.Migrate at start (it creates the
// stored-response table with the other migrations).
func New(cfg Config) (*Middleware, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	hs, err := pgstore.NewHTTPStore(cfg.Store)
	if err != nil {
		return nil, err
	}
	m := &Middleware{cfg: cfg, hs: hs, methods: map[string]bool{}}
	for _, meth := range cfg.Methods {
		m.methods[meth] = true
	}
	if cfg.TracerProvider != nil {
		m.tracer = cfg.TracerProvider.Tracer("github.com/idemq/idemq/httpidem")
	}
	return m, nil
}

// Config returns the middleware's configuration with defaults applied.
func (m *Middleware) Config() Config { return m.cfg }

// Handler wraps next: requests whose method is in Config.Methods run under
// the Idempotency-Key rules (next sees the record's transaction through
// FromContext and writes a buffered response, sent after COMMIT); other
// requests reach next unchanged.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !m.methods[r.Method] {
			next.ServeHTTP(w, r)
			return
		}
		m.serve(w, r, next)
	})
}

// request is one request's identity and fingerprint inputs.
type request struct {
	key, tenant, principal, route, version, mediaType string
	anonymous                                         bool   // principal is Config.Anonymous's owner
	target                                            string // canonicalTarget: path and query
	body                                              []byte // as received
	canon                                             []byte // canonicalized under CanonicalVersion
}

// principalPart is the principal as the scope and the cap's key hold it:
// escaped, or marked anonymous.
func (q request) principalPart() string {
	if q.anonymous {
		return anonymousPart(q.principal)
	}
	return escapePart(q.principal)
}

// fingerprintPrincipal is the principal as the fingerprint covers it: as
// extracted (version 1 had no anonymous callers), or marked anonymous.
func (q request) fingerprintPrincipal() string {
	if q.anonymous {
		return anonymousPart(q.principal)
	}
	return q.principal
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	ctx, span := m.span(r)
	r = r.WithContext(ctx)
	status, outcome := m.process(w, r, next, span)
	m.cfg.Metrics.inc(outcome)
	if span.IsRecording() {
		span.SetAttributes(attribute.Int("http.response.status_code", status), attribute.String("idemq.http.outcome", string(outcome)))
		if status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(status))
		}
	}
	if m.tracer != nil {
		span.End()
	}
}

// span starts the server span (Config.TracerProvider) or returns the
// context's own, which is enriched when it records.
func (m *Middleware) span(r *http.Request) (context.Context, trace.Span) {
	ctx := r.Context()
	var span trace.Span
	if m.tracer != nil {
		ctx, span = m.tracer.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer))
	} else {
		span = trace.SpanFromContext(ctx)
	}
	if span.IsRecording() {
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		span.SetAttributes(attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path),
			attribute.String("url.scheme", scheme), attribute.String("server.address", r.Host))
		if ua := r.UserAgent(); ua != "" {
			span.SetAttributes(attribute.String("user_agent.original", ua))
		}
	}
	return ctx, span
}

// process answers one request and returns the status sent and the outcome.
func (m *Middleware) process(w http.ResponseWriter, r *http.Request, next http.Handler, span trace.Span) (int, Outcome) {
	req, p := m.identify(r)
	if p != nil {
		WriteProblem(w, p)
		return p.Status, OutcomeRejected
	}
	if span.IsRecording() {
		span.SetAttributes(attribute.String("http.route", req.route))
		if m.tracer != nil {
			span.SetName(r.Method + " " + routePath(req.route))
		}
	}
	payload := fingerprintInput(CanonicalVersion, r.Method, req, req.canon)
	sum, keyID, err := m.cfg.Fingerprinter.Sum(payload)
	if err != nil {
		return m.problem(w, OutcomeUnavailable, &Problem{Type: TypeUnavailable, Title: "Request fingerprint failed", Status: http.StatusInternalServerError,
			Detail: "the Fingerprinter must be built without a Canonicalizer"})
	}
	scope := scopeOf(req.tenant, req.principalPart(), r.Method, req.route)
	info := Info{Scope: scope, Key: req.key}
	record := []byte(scope + "\x00" + req.key)
	msg := &dedup.Message{
		Identity: dedup.Identity{Scope: scope, MessageID: req.key},
		Topic:    req.route,
		Payload:  req.body,
		Headers: map[string]string{"method": r.Method, "route": req.route, "target": req.target, "content-type": req.mediaType,
			"api-version": req.version, "principal": req.fingerprintPrincipal(), "tenant": req.tenant},
		Source: "http:" + r.Method + " " + r.URL.Path,
	}
	hreq := pgstore.HTTPRequest{
		Message: msg, Principal: boundedPrincipal(req.tenant, req.principalPart()),
		Sum: sum, KeyID: keyID, CanonVersion: CanonicalVersion,
		Matches: func(version int, stored []byte, storedKeyID string) (bool, error) {
			canon, err := canonicalBodyVersion(version, req.mediaType, req.body, m.cfg.IgnoreFields)
			if err != nil {
				return false, err
			}
			return m.cfg.Fingerprinter.Matches(fingerprintInput(version, r.Method, req, canon), stored, storedKeyID)
		},
		LockWait: m.cfg.InFlightWait, MaxUnfinished: m.cfg.MaxUnfinished, UnfinishedWindow: m.cfg.RetryWindow,
	}
	// The handler and the recording of its outcome run detached from the
	// client connection: a hang-up neither interrupts a handler that may
	// have written nor the COMMIT that records it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), m.cfg.Timeout)
	defer cancel()
	if m.cfg.Lease != nil {
		return m.processLeased(ctx, w, r, next, leaseCall{req: req, msg: msg, info: info, record: record, principal: hreq.Principal}, span)
	}
	var last *recorder
	res, err := m.hs.Process(ctx, hreq, func(ctx context.Context, tx pgx.Tx, attempt int) (pgstore.HTTPResponse, error) {
		info := info
		info.Attempt = attempt
		rec := newRecorder()
		last = rec
		hr := r.Clone(context.WithValue(ctx, ctxKey{}, &requestState{tx: tx, info: info}))
		hr.Body = io.NopCloser(bytes.NewReader(req.body))
		hr.ContentLength = int64(len(req.body))
		return m.run(next, rec, hr, record)
	})
	if span.IsRecording() {
		span.SetAttributes(attribute.Int("idemq.http.attempt", res.Result.Attempts))
	}
	if err != nil {
		m.cfg.Logger.ErrorContext(ctx, "httpidem: outcome not recorded", "scope", scope, "key", req.key, "handler_called", res.Result.HandlerCalled, "err", err)
		return m.unavailable(w)
	}
	switch res.Outcome {
	case pgstore.HTTPExecuted:
		last.writeTo(w)
		return last.status, OutcomeExecuted
	case pgstore.HTTPReplayed:
		return m.replay(w, res.Response, record, scope, req.key)
	case pgstore.HTTPConflict:
		return m.conflict(w)
	case pgstore.HTTPInFlight:
		return m.inFlight(w, r, info)
	case pgstore.HTTPTooManyUnfinished:
		return m.tooManyUnfinished(w)
	case pgstore.HTTPExhausted:
		return m.exhausted(w, res.Result.Attempts)
	}
	return m.failed(w, last, res.Result)
}

// failed answers a request whose handler failed: with the handler's own
// answer when it chose a non-final failure status, else 500.
func (m *Middleware) failed(w http.ResponseWriter, last *recorder, res dedup.Result) (int, Outcome) {
	if last != nil && !last.panicked && last.status >= 400 && !m.cfg.FinalStatus(last.status) {
		last.writeTo(w)
		return last.status, OutcomeFailed
	}
	detail := "the request failed and may be retried with the same Idempotency-Key"
	if res.Status == dedup.StatusFailedFinal {
		detail = fmt.Sprintf("the request failed %d times and was dead-lettered; use a new key", res.Attempts)
	}
	return m.problem(w, OutcomeFailed, &Problem{Type: "about:blank", Title: http.StatusText(http.StatusInternalServerError), Status: http.StatusInternalServerError, Detail: detail})
}

func (m *Middleware) conflict(w http.ResponseWriter) (int, Outcome) {
	return m.problem(w, OutcomeConflict, &Problem{Type: TypeKeyReused, Title: "Idempotency-Key reused with a different request", Status: m.cfg.ConflictStatus,
		Detail: "this key was used with a different request (body, target path or query, content type, API version, route or principal); send a new key for a new request"})
}

// inFlight answers a copy whose key is in flight: 409 with Retry-After, or
// 202 with the status URL of Config.AsyncStatus.
func (m *Middleware) inFlight(w http.ResponseWriter, r *http.Request, info Info) (int, Outcome) {
	if m.cfg.AsyncStatus != nil {
		if u := m.cfg.AsyncStatus(r, info); u != "" {
			h := w.Header()
			h.Set("Location", u)
			h.Set("Retry-After", strconv.FormatInt(retryAfterSeconds(m.cfg.RetryAfter), 10))
			h.Set("Cache-Control", "no-store")
			h.Set("Content-Length", "0")
			w.WriteHeader(http.StatusAccepted)
			return http.StatusAccepted, OutcomeInFlight
		}
	}
	return m.problem(w, OutcomeInFlight, &Problem{Type: TypeInFlight, Title: "A request with this Idempotency-Key is in progress", Status: http.StatusConflict,
		Detail: "retry after the first request finishes", RetryAfter: m.cfg.RetryAfter})
}

func (m *Middleware) tooManyUnfinished(w http.ResponseWriter) (int, Outcome) {
	return m.problem(w, OutcomeTooManyUnfinished, &Problem{Type: TypeTooManyUnfinished, Title: "Too many unfinished Idempotency-Keys", Status: http.StatusTooManyRequests,
		Detail: fmt.Sprintf("at most %d keys may be unfinished at once; retry the unfinished ones first", m.cfg.MaxUnfinished), RetryAfter: m.cfg.RetryAfter})
}

func (m *Middleware) exhausted(w http.ResponseWriter, attempts int) (int, Outcome) {
	return m.problem(w, OutcomeExhausted, &Problem{Type: TypeKeyExhausted, Title: "Idempotency-Key exhausted", Status: http.StatusConflict,
		Detail: fmt.Sprintf("the request failed %d times and was dead-lettered; use a new key", attempts)})
}

func (m *Middleware) unavailable(w http.ResponseWriter) (int, Outcome) {
	return m.problem(w, OutcomeUnavailable, &Problem{Type: TypeUnavailable, Title: "Idempotency store unavailable", Status: http.StatusServiceUnavailable,
		Detail: "the outcome of this request could not be recorded; retry with the same Idempotency-Key", RetryAfter: m.cfg.RetryAfter})
}

func (m *Middleware) problem(w http.ResponseWriter, o Outcome, p *Problem) (int, Outcome) {
	WriteProblem(w, p)
	return p.Status, o
}

func (m *Middleware) responseOptions(record []byte) responseOptions {
	return responseOptions{AllowHeaders: m.cfg.StoredHeaders, MaxBytes: m.cfg.MaxResponseBytes, Redact: m.cfg.Redact, Sealer: m.cfg.Sealer, Record: record}
}

// replay writes a stored response with the replay marker.
func (m *Middleware) replay(w http.ResponseWriter, stored pgstore.HTTPResponse, record []byte, scope, key string) (int, Outcome) {
	sr, err := decodeResponse(stored.Stored, stored.SealedBy, m.responseOptions(record))
	if err != nil {
		m.cfg.Logger.Error("httpidem: stored response unreadable", "scope", scope, "key", key, "err", err)
		return m.problem(w, OutcomeUnavailable, &Problem{Type: TypeUnavailable, Title: "Stored response unreadable", Status: http.StatusInternalServerError,
			Detail: "the request was done, but its stored response cannot be read (a response encryption key is missing)"})
	}
	h := w.Header()
	for k, vs := range sr.Header {
		h[k] = append([]string(nil), vs...)
	}
	if sr.ResourceID != "" {
		h.Set(ResourceIDHeader, sr.ResourceID)
	}
	h.Set(ReplayHeader, "true")
	if sr.Oversized {
		h.Set(BodyOmittedHeader, "true")
	}
	h.Set("Content-Length", strconv.Itoa(len(sr.Body)))
	w.WriteHeader(sr.Status)
	_, _ = w.Write(sr.Body)
	return sr.Status, OutcomeReplayed
}

// identify validates the key, runs the extractors and reads the body.
func (m *Middleware) identify(r *http.Request) (request, *Problem) {
	var req request
	keys := r.Header.Values(KeyHeader)
	if len(keys) == 0 {
		return req, &Problem{Type: TypeKeyMissing, Title: "Idempotency-Key missing", Status: http.StatusBadRequest,
			Detail: r.Method + " requests on this route require an Idempotency-Key header"}
	}
	key, ok := parseKey(keys)
	if !ok {
		return req, &Problem{Type: TypeKeyInvalid, Title: "Idempotency-Key invalid", Status: http.StatusBadRequest, Detail: ErrInvalidKey.Error()}
	}
	req.key = key
	var p *Problem
	extract := func(name string, e Extractor) string {
		if e == nil || p != nil {
			return ""
		}
		v, err := e(r)
		if err != nil {
			if !errors.As(err, &p) {
				p = &Problem{Type: TypeUnidentified, Title: "Request cannot be identified", Status: http.StatusBadRequest, Detail: name + ": " + err.Error()}
			}
		}
		return v
	}
	req.tenant = extract("tenant", m.cfg.Tenant)
	if p == nil && m.cfg.Tenant != nil && isBlank(req.tenant) {
		p = &Problem{Type: TypeUnidentified, Title: "Request cannot be identified", Status: http.StatusBadRequest, Detail: "tenant: " + errBlank.Error()}
	}
	req.principal = extract("principal", m.cfg.Principal)
	if p == nil && isBlank(req.principal) {
		// No principal is no identity: every such caller would share one
		// key space and be served another's stored response.
		if m.cfg.Anonymous == nil {
			p = unauthenticated("the request carries no principal (Config.Principal returned a blank value) and this route is not open to anonymous callers")
		} else {
			req.principal, req.anonymous = extract("anonymous caller", m.cfg.Anonymous), true
			if p == nil && isBlank(req.principal) {
				p = unauthenticated("the request carries neither a principal nor what an anonymous caller must own (Config.Anonymous returned a blank value)")
			}
		}
	}
	req.route = extract("route", m.cfg.Route)
	req.version = extract("API version", m.cfg.APIVersion)
	if p != nil {
		return req, p
	}
	req.target = canonicalTarget(r.URL, m.cfg.IgnoreQuery)
	req.mediaType = mediaType(r.Header.Get("Content-Type"))
	body, p := m.readBody(r)
	if p != nil {
		return req, p
	}
	_, canon, err := canonicalBody(req.mediaType, body, m.cfg.IgnoreFields)
	if err != nil {
		return req, &Problem{Type: TypeBodyMalformed, Title: "Request body malformed", Status: http.StatusBadRequest, Detail: err.Error()}
	}
	req.body, req.canon = body, canon
	return req, nil
}

// readBody reads the whole body, at most Config.MaxBodyBytes.
func (m *Middleware) readBody(r *http.Request) ([]byte, *Problem) {
	tooLarge := &Problem{Type: TypeBodyTooLarge, Title: "Request body too large", Status: http.StatusRequestEntityTooLarge,
		Detail: fmt.Sprintf("the body may be at most %d bytes", m.cfg.MaxBodyBytes)}
	if r.ContentLength > m.cfg.MaxBodyBytes {
		return nil, tooLarge
	}
	if r.Body == nil {
		return nil, nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, m.cfg.MaxBodyBytes+1))
	if err != nil {
		return nil, &Problem{Type: TypeBodyMalformed, Title: "Request body unreadable", Status: http.StatusBadRequest, Detail: err.Error()}
	}
	if int64(len(body)) > m.cfg.MaxBodyBytes {
		return nil, tooLarge
	}
	return body, nil
}

// parseKey returns the one Idempotency-Key of the request: the header
// value as sent, or, when it is an RFC 8941 sf-string ("…", as the IETF
// draft writes it), its content. Repeated headers are refused.
func parseKey(values []string) (string, bool) {
	if len(values) != 1 {
		return "", false
	}
	key := values[0]
	if len(key) >= 2 && key[0] == '"' && key[len(key)-1] == '"' {
		var b strings.Builder
		in := key[1 : len(key)-1]
		for i := 0; i < len(in); i++ {
			switch c := in[i]; c {
			case '\\':
				if i+1 >= len(in) || (in[i+1] != '"' && in[i+1] != '\\') {
					return "", false
				}
				i++
				b.WriteByte(in[i])
			case '"':
				return "", false
			default:
				b.WriteByte(c)
			}
		}
		key = b.String()
	}
	return key, ValidateKey(key) == nil
}

// mediaType is the lower-case media type of a Content-Type, without
// parameters ("" when absent or unparsable: such a body is taken byte for
// byte).
func mediaType(ct string) string {
	if ct == "" {
		return ""
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return strings.ToLower(strings.TrimSpace(ct))
	}
	return mt
}

// fingerprintInput is what the fingerprint covers under canonicalization
// version v: method, route, media type, API version, tenant, principal and
// the canonical body, and from version 2 on the canonical target (path and
// query, canonicalTarget). Each part is length-prefixed, so no two
// different inputs concatenate alike. A record of version 1 is compared on
// version 1's input, without the target, so that its retries after an
// upgrade still replay.
func fingerprintInput(v int, method string, req request, canon []byte) []byte {
	b := appendParts(nil, method, req.route, req.mediaType, req.version, req.tenant, req.fingerprintPrincipal(), string(canon))
	if v >= 2 {
		b = appendParts(b, req.target)
	}
	return b
}

// isBlank reports whether an extracted identity is empty or only white
// space.
func isBlank(s string) bool { return strings.TrimSpace(s) == "" }

// unauthenticated is the answer to a request without a caller identity.
func unauthenticated(detail string) *Problem {
	return &Problem{Type: TypeUnauthenticated, Title: "Caller not identified", Status: http.StatusUnauthorized, Detail: detail}
}

func appendParts(b []byte, parts ...string) []byte {
	for _, p := range parts {
		b = binary.AppendUvarint(b, uint64(len(p)))
		b = append(b, p...)
	}
	return b
}

// boundedPrincipal is principalKey, hashed like a long scope when over
// 255 bytes.
func boundedPrincipal(tenant, principalPart string) string {
	k := principalKey(tenant, principalPart)
	if len(k) > MaxKeyBytes || !validUTF8NoNUL(k) {
		return scopeOf(tenant, principalPart, "", "")
	}
	return k
}

// routePath is the path part of a ServeMux pattern ("POST /payments" →
// "/payments").
func routePath(route string) string {
	if i := strings.IndexByte(route, ' '); i >= 0 {
		return strings.TrimSpace(route[i+1:])
	}
	return route
}

// run runs next for hr into rec and returns the response to store, or the
// handler's failure: a panic, or a status that is not final.
func (m *Middleware) run(next http.Handler, rec *recorder, hr *http.Request, record []byte) (pgstore.HTTPResponse, error) {
	if err := runHandler(next, rec, hr); err != nil {
		return pgstore.HTTPResponse{}, err
	}
	if !m.cfg.FinalStatus(rec.status) && rec.status >= 400 {
		return pgstore.HTTPResponse{}, fmt.Errorf("httpidem: handler answered %d %s (not final: retryable)", rec.status, http.StatusText(rec.status))
	}
	blob, sealedBy, err := encodeResponse(storedResponse{Status: rec.status, Header: rec.header, Body: rec.body.Bytes(), ResourceID: rec.header.Get(ResourceIDHeader)}, m.responseOptions(record))
	if err != nil {
		return pgstore.HTTPResponse{}, fmt.Errorf("httpidem: store response: %w", err)
	}
	return pgstore.HTTPResponse{Status: rec.status, Stored: blob, SealedBy: sealedBy}, nil
}

// runHandler runs next, turning a panic into a *dedup.PanicError.
func runHandler(next http.Handler, rec *recorder, r *http.Request) (err error) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				err = fmt.Errorf("httpidem: handler aborted: %w", http.ErrAbortHandler)
			} else {
				err = &dedup.PanicError{Value: v}
			}
			rec.panicked = true
		}
	}()
	next.ServeHTTP(rec, r)
	return nil
}
