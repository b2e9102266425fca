package httpidem

import (
	"context"
	"crypto/sha256"
	"encoding/hex"

	"github.com/jackc/pgx/v5"
)

type ctxKey struct{}

// requestState is what the middleware puts in the handler's context.
type requestState struct {
	tx   pgx.Tx
	info Info
}

// Info describes the request a handler runs for under the middleware.
type Info struct {
	// Scope is the consumption record's scope: tenant, principal, method
	// and route pattern (see Scope).
	Scope string
	// Key is the Idempotency-Key as the client sent it (the record's
	// message ID).
	Key string
	// Attempt is the 1-based number of this handler execution for the
	// key (the record's attempts after the claim): above 1 after
	// retryable failures.
	Attempt int
}

// DownstreamKey is an idempotency key to send to a downstream provider for
// this request: "idemq-" and the first 32 hex digits of SHA-256 over the
// scope and key, so it is the same on every retry of the request, differs
// between principals and routes, and reveals neither (38 bytes, within
// every provider's limit).
func (i Info) DownstreamKey() string {
	h := sha256.New()
	h.Write([]byte(i.Scope))
	h.Write([]byte{0})
	h.Write([]byte(i.Key))
	return "idemq-" + hex.EncodeToString(h.Sum(nil))[:32]
}

// FromContext returns the transaction that holds the request's
// consumption record, for the handler's writes: business rows, outbox rows
// (outbox.Add) and the stored response commit together, or not at all.
// The handler must not commit or roll it back. It returns nil outside the
// middleware (a method that passes through, or no middleware).
func FromContext(ctx context.Context) pgx.Tx {
	if s, ok := ctx.Value(ctxKey{}).(*requestState); ok {
		return s.tx
	}
	return nil
}

// InfoFromContext returns the scope, key and attempt of the request the
// handler runs for, and false outside the middleware.
func InfoFromContext(ctx context.Context) (Info, bool) {
	if s, ok := ctx.Value(ctxKey{}).(*requestState); ok {
		return s.info, true
	}
	return Info{}, false
}

// KeyFromContext returns Info.DownstreamKey of the request the handler
// runs for (the key to pass to a payment provider or any downstream API
// that deduplicates), and false outside the middleware.
func KeyFromContext(ctx context.Context) (string, bool) {
	i, ok := InfoFromContext(ctx)
	if !ok {
		return "", false
	}
	return i.DownstreamKey(), true
}
