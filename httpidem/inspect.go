package httpidem

import (
	"fmt"
	"net/http"
)

// ScopePrefix starts the scope of every request the middleware records
// ("http|", see Scope): list the dead letters of HTTP requests with
// `idemq dead-letters --scope-prefix 'http|'`
// (pgstore.Store.DeadLettersByScopePrefix).
const ScopePrefix = scopePrefix

// StoredResponseInfo describes a stored response for operators (`idemq
// inspect`), as DescribeStoredResponse reads it.
type StoredResponseInfo struct {
	// Sealed is true when the response is encrypted at rest
	// (Config.Sealer): then only KeyID and the stored size are known, never
	// the body, its headers or whether it was oversized.
	Sealed bool
	// KeyID is the sealing key's ID ("" when not sealed).
	KeyID string
	// StoredBytes is the size of the stored, encoded response in bytes.
	StoredBytes int
	// Status is the stored HTTP status (0 when Sealed: read the table's
	// status column, which is never sealed).
	Status int
	// Oversized is true when the body exceeded Config.MaxResponseBytes and
	// was not stored (replays carry Idempotent-Replay-Body-Omitted: true).
	// Always false when Sealed (unknown).
	Oversized bool
	// ResourceID is the created resource's ID (ResourceIDHeader), "" when
	// the handler named none.
	ResourceID string
	// Header holds the stored, allow-listed headers (canonical names).
	Header http.Header
	// Body is the stored body after redaction (nil when Oversized or
	// Sealed).
	Body []byte
}

// DescribeStoredResponse reads a stored response (pgstore.HTTPResponse's
// Stored and SealedBy, e.g. from pgstore.HTTPStore.Inspect) without any
// sealing key: a plain response whole, a sealed one only as sealed (its key
// ID and size; it is never opened). It returns an error for a response it
// cannot read (an unknown format version, a corrupt encoding, or a plain
// one stored with a key ID).
func DescribeStoredResponse(stored []byte, keyID string) (StoredResponseInfo, error) {
	info := StoredResponseInfo{StoredBytes: len(stored), KeyID: keyID}
	if len(stored) >= 2 && stored[0] == responseFormatV1 && stored[1] == flagSealed {
		if keyID == "" {
			return StoredResponseInfo{}, fmt.Errorf("%w: sealed blob stored without a key ID", errCorruptResponse)
		}
		info.Sealed = true
		return info, nil
	}
	r, err := decodeResponse(stored, keyID, responseOptions{})
	if err != nil {
		return StoredResponseInfo{}, err
	}
	info.Status, info.Oversized, info.ResourceID, info.Header, info.Body = r.Status, r.Oversized, r.ResourceID, r.Header, r.Body
	return info, nil
}
