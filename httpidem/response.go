package httpidem

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"sort"
)

// DefaultMaxResponseBytes is the default limit, in bytes, on a stored
// response body (after redaction): 64 KiB. A larger body is not stored; the
// status, the resource ID and the allow-listed headers are, and the
// middleware replays those with a marker that the body was too large.
const DefaultMaxResponseBytes = 64 << 10

// DefaultStoredHeaders returns the response headers stored and replayed by
// default, as canonical names: Content-Type, Content-Language,
// Content-Location, Location, ETag and Last-Modified. The list describes the
// representation, not the connection or the client, and carries no cookies
// or credentials. Each call returns a new slice the caller may extend.
func DefaultStoredHeaders() []string {
	return []string{"Content-Type", "Content-Language", "Content-Location", "Location", "Etag", "Last-Modified"}
}

// neverStored are headers that are not stored even when allow-listed: the
// length changes under redaction and is recomputed on replay, and the rest
// are hop-by-hop (RFC 9110 section 7.6.1) or framing.
var neverStored = map[string]bool{
	"Content-Length":      true,
	"Transfer-Encoding":   true,
	"Connection":          true,
	"Keep-Alive":          true,
	"Proxy-Connection":    true,
	"Proxy-Authenticate":  true,
	"Proxy-Authorization": true,
	"Te":                  true,
	"Trailer":             true,
	"Upgrade":             true,
}

// responseFormatV1 is the first byte of every stored response blob; a new
// encoding gets a new version, and decodeResponse keeps reading the old ones.
const responseFormatV1 = 1

// flagSealed in a blob's second byte: the payload is a Sealer ciphertext.
const flagSealed = 1

// errCorruptResponse is wrapped by decodeResponse for a blob it cannot read.
var errCorruptResponse = errors.New("httpidem: corrupt stored response")

// storedResponse is what the middleware records for a finished request and
// replays for its retries.
type storedResponse struct {
	Status     int
	Header     http.Header // allow-listed headers only, canonical names
	Body       []byte      // nil when Oversized
	Oversized  bool        // the body exceeded MaxBytes and was not stored
	ResourceID string      // the created resource, when the handler named one
}

// responseOptions controls encodeResponse and decodeResponse. The middleware
// builds one per request from its configuration.
type responseOptions struct {
	// AllowHeaders are the header names stored (any case; canonicalized).
	// nil means DefaultStoredHeaders(); an empty non-nil slice stores none.
	// Headers in neverStored are dropped regardless.
	AllowHeaders []string
	// MaxBytes limits the stored body in bytes; 0 means
	// DefaultMaxResponseBytes. Negative is an error.
	MaxBytes int
	// Redact, when set, is called before storing with the status, a copy of
	// the allow-listed headers (which it may change in place) and the body
	// (nil when the body is already over MaxBytes); it returns the body to
	// store. Its result counts against MaxBytes. It is not called on replay.
	Redact func(status int, h http.Header, body []byte) []byte
	// Sealer, when set, encrypts every new blob. nil stores plain blobs.
	// Plain blobs stay readable after a Sealer is configured.
	Sealer Sealer
	// Record is the identity of the record the blob belongs to (scope and
	// idempotency key). It is authenticated with a sealed blob, so a blob
	// copied to another record fails to open. Required when Sealer is set.
	Record []byte
}

// validate checks the options; errors name the field.
func (o responseOptions) validate() error {
	if o.MaxBytes < 0 {
		return fmt.Errorf("httpidem: MaxBytes is %d, want >= 0 (0 means %d)", o.MaxBytes, DefaultMaxResponseBytes)
	}
	for i, h := range o.AllowHeaders {
		if !validHeaderName(h) {
			return fmt.Errorf("httpidem: AllowHeaders[%d] %q is not a valid header name", i, h)
		}
	}
	return nil
}

// validHeaderName reports whether name is a non-empty RFC 9110 token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c < 0x80 && c > 0x20 && c != 0x7f && !isSeparator(c):
		default:
			return false
		}
	}
	return true
}

func isSeparator(c byte) bool {
	switch c {
	case '(', ')', '<', '>', '@', ',', ';', ':', '\\', '"', '/', '[', ']', '?', '=', '{', '}':
		return true
	}
	return false
}

// encodeResponse filters, redacts, size-limits and (with a Sealer) encrypts r
// into a blob for the records table, and returns the Sealer's key ID ("" for
// a plain blob), to be stored beside it. r is not modified.
//
// Blob format, version 1: byte 0 is the format version (1); byte 1 holds
// flags (bit 0: sealed); the rest is the payload, or its ciphertext when
// sealed, with bytes 0–1 and Record as authenticated data. Payload: status
// (uvarint), oversized (1 byte), resource ID (string), number of header names
// (uvarint), per name: name (string), number of values (uvarint), values
// (strings); body (string). A string is a uvarint length and its bytes.
func encodeResponse(r storedResponse, opt responseOptions) (blob []byte, keyID string, err error) {
	if err := opt.validate(); err != nil {
		return nil, "", err
	}
	if r.Status < 100 || r.Status > 999 {
		return nil, "", fmt.Errorf("httpidem: status %d is not an HTTP status code", r.Status)
	}
	if opt.Sealer != nil && len(opt.Record) == 0 {
		return nil, "", errors.New("httpidem: a sealed response needs the record identity (responseOptions.Record)")
	}
	maxBytes := opt.MaxBytes
	if maxBytes == 0 {
		maxBytes = DefaultMaxResponseBytes
	}
	allow := opt.AllowHeaders
	if allow == nil {
		allow = DefaultStoredHeaders()
	}

	h := make(http.Header)
	for _, name := range allow {
		name = textproto.CanonicalMIMEHeaderKey(name)
		if neverStored[name] {
			continue
		}
		if vs := r.Header.Values(name); len(vs) > 0 {
			h[name] = append([]string(nil), vs...)
		}
	}
	oversized := r.Oversized || len(r.Body) > maxBytes
	body := r.Body
	if oversized {
		body = nil
	}
	if opt.Redact != nil {
		redacted := opt.Redact(r.Status, h, body)
		if !oversized {
			body = redacted
		}
	}
	if len(body) > maxBytes {
		oversized, body = true, nil
	}

	payload := appendPayload(nil, r.Status, oversized, r.ResourceID, h, body)
	if opt.Sealer == nil {
		return append([]byte{responseFormatV1, 0}, payload...), "", nil
	}
	head := []byte{responseFormatV1, flagSealed}
	keyID, ct, err := opt.Sealer.Seal(payload, responseAAD(head, opt.Record))
	if err != nil {
		return nil, "", fmt.Errorf("httpidem: sealing stored response: %w", err)
	}
	if keyID == "" {
		return nil, "", errors.New("httpidem: Sealer.Seal returned an empty key ID")
	}
	return append(head, ct...), keyID, nil
}

// decodeResponse reads a blob from encodeResponse. keyID is the one stored
// beside it. A sealed blob needs opt.Sealer and the same opt.Record it was
// sealed with; errors from the Sealer are wrapped ([ErrUnknownKeyID],
// [ErrOpenFailed]). An unreadable blob is an error wrapping
// errCorruptResponse. Only Sealer and Record of opt are used.
func decodeResponse(blob []byte, keyID string, opt responseOptions) (storedResponse, error) {
	if len(blob) < 2 {
		return storedResponse{}, fmt.Errorf("%w: %d bytes", errCorruptResponse, len(blob))
	}
	if blob[0] != responseFormatV1 {
		return storedResponse{}, fmt.Errorf("%w: unknown format version %d", errCorruptResponse, blob[0])
	}
	payload := blob[2:]
	switch blob[1] {
	case 0:
		if keyID != "" {
			return storedResponse{}, fmt.Errorf("%w: plain blob stored with key ID %q", errCorruptResponse, keyID)
		}
	case flagSealed:
		if keyID == "" {
			return storedResponse{}, fmt.Errorf("%w: sealed blob stored without a key ID", errCorruptResponse)
		}
		if opt.Sealer == nil {
			return storedResponse{}, fmt.Errorf("httpidem: stored response is sealed with key %q but no Sealer is configured", keyID)
		}
		pt, err := opt.Sealer.Open(keyID, payload, responseAAD(blob[:2], opt.Record))
		if err != nil {
			return storedResponse{}, fmt.Errorf("httpidem: opening stored response: %w", err)
		}
		payload = pt
	default:
		return storedResponse{}, fmt.Errorf("%w: unknown flags %#x", errCorruptResponse, blob[1])
	}
	r, err := parsePayload(payload)
	if err != nil {
		return storedResponse{}, fmt.Errorf("%w: %w", errCorruptResponse, err)
	}
	return r, nil
}

// responseAAD authenticates the blob's plain head and the record identity.
func responseAAD(head, record []byte) []byte {
	out := make([]byte, 0, len(head)+len(record))
	return append(append(out, head...), record...)
}

func appendString(b []byte, s []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendPayload(b []byte, status int, oversized bool, resourceID string, h http.Header, body []byte) []byte {
	b = binary.AppendUvarint(b, uint64(status)) //nolint:gosec // 100..999, checked by encodeResponse
	if oversized {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = appendString(b, []byte(resourceID))
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	sort.Strings(names)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, name := range names {
		b = appendString(b, []byte(name))
		b = binary.AppendUvarint(b, uint64(len(h[name])))
		for _, v := range h[name] {
			b = appendString(b, []byte(v))
		}
	}
	return appendString(b, body)
}

// payloadReader reads the payload fields, refusing any length that runs past
// the end (so a corrupt blob cannot make it allocate more than it holds).
type payloadReader struct {
	b   []byte
	err error
}

func (p *payloadReader) uvarint(what string) uint64 {
	if p.err != nil {
		return 0
	}
	v, n := binary.Uvarint(p.b)
	if n <= 0 {
		p.err = fmt.Errorf("bad %s", what)
		return 0
	}
	p.b = p.b[n:]
	return v
}

func (p *payloadReader) bytes(what string) []byte {
	n := p.uvarint(what + " length")
	if p.err != nil {
		return nil
	}
	if n > uint64(len(p.b)) {
		p.err = fmt.Errorf("%s length %d runs past the end (%d bytes left)", what, n, len(p.b))
		return nil
	}
	s := p.b[:n:n]
	p.b = p.b[n:]
	return s
}

// count reads a count of items that take at least one byte each.
func (p *payloadReader) count(what string) int {
	n := p.uvarint(what)
	if p.err == nil && n > uint64(len(p.b)) {
		p.err = fmt.Errorf("%s %d exceeds the %d bytes left", what, n, len(p.b))
		return 0
	}
	return int(n) //nolint:gosec // bounded by len(p.b) above
}

func parsePayload(b []byte) (storedResponse, error) {
	p := &payloadReader{b: b}
	var r storedResponse
	status := p.uvarint("status")
	if p.err == nil && (status < 100 || status > 999) {
		return r, fmt.Errorf("status %d out of range", status)
	}
	r.Status = int(status) //nolint:gosec // 100..999 checked above
	if p.err == nil {
		if len(p.b) == 0 {
			return r, errors.New("missing oversized flag")
		}
		switch p.b[0] {
		case 0:
		case 1:
			r.Oversized = true
		default:
			return r, fmt.Errorf("bad oversized flag %#x", p.b[0])
		}
		p.b = p.b[1:]
	}
	r.ResourceID = string(p.bytes("resource ID"))
	nh := p.count("header count")
	if p.err == nil {
		r.Header = make(http.Header, nh)
	}
	for i := 0; i < nh && p.err == nil; i++ {
		name := string(p.bytes("header name"))
		nv := p.count("header value count")
		vs := make([]string, 0, nv)
		for j := 0; j < nv && p.err == nil; j++ {
			vs = append(vs, string(p.bytes("header value")))
		}
		if p.err == nil {
			r.Header[name] = vs
		}
	}
	body := p.bytes("body")
	if p.err != nil {
		return storedResponse{}, p.err
	}
	if len(p.b) != 0 {
		return storedResponse{}, fmt.Errorf("%d trailing bytes", len(p.b))
	}
	if !r.Oversized {
		r.Body = append([]byte{}, body...)
	}
	return r, nil
}
