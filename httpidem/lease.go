package httpidem

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// leaseCall is one request in lease mode.
type leaseCall struct {
	req       request
	msg       *dedup.Message
	info      Info
	record    []byte // sealing AAD
	principal string // the cap's key
}

// processLeased runs one request in lease mode (Config.Lease): the claim
// commits first through pgstore's lease mode, the handler runs without a
// transaction, its response is stored under the lease, then the record is
// marked SUCCEEDED.
func (m *Middleware) processLeased(ctx context.Context, w http.ResponseWriter, r *http.Request, next http.Handler, c leaseCall, span trace.Span) (int, Outcome) {
	id := c.msg.Identity
	stored, err := m.hs.Stored(ctx, id)
	if err != nil {
		m.cfg.Logger.ErrorContext(ctx, "httpidem: lease: read record", "scope", id.Scope, "key", id.MessageID, "err", err)
		return m.unavailable(w)
	}
	// The fingerprint is compared under the version stored with the record.
	version, canon := CanonicalVersion, c.req.canon
	if stored.CanonVersion != 0 && stored.CanonVersion != CanonicalVersion {
		if canon, err = canonicalBodyVersion(stored.CanonVersion, c.req.mediaType, c.req.body, m.cfg.IgnoreFields); err != nil {
			return m.conflict(w)
		}
		version = stored.CanonVersion
	}
	c.msg.Payload = fingerprintInput(version, r.Method, c.req, canon)
	if stored.Status == "" {
		n, err := m.hs.CountUnfinished(ctx, c.principal, m.cfg.RetryWindow, m.cfg.MaxUnfinished)
		if err != nil {
			m.cfg.Logger.ErrorContext(ctx, "httpidem: lease: count unfinished", "scope", id.Scope, "key", id.MessageID, "err", err)
			return m.unavailable(w)
		}
		if n >= m.cfg.MaxUnfinished {
			return m.tooManyUnfinished(w)
		}
	}
	var last *recorder
	res, err := m.cfg.Store.ProcessLeased(ctx, c.msg, func(ctx context.Context, msg *dedup.Message) error {
		l, _ := dedup.LeaseFromContext(ctx)
		// Unfinished from the start: a lease whose owner dies counts
		// against the cap until it is retried or leaves RetryWindow.
		if err := m.hs.StoreLeased(ctx, l, c.principal, version, false, pgstore.HTTPResponse{}); err != nil {
			return err
		}
		info := c.info
		info.Attempt = msg.Attempt
		rec := newRecorder()
		last = rec
		hr := r.Clone(context.WithValue(ctx, ctxKey{}, &requestState{info: info}))
		hr.Body = io.NopCloser(bytes.NewReader(c.req.body))
		hr.ContentLength = int64(len(c.req.body))
		resp, herr := m.run(next, rec, hr, c.record)
		if herr != nil {
			return herr
		}
		return m.hs.StoreLeased(ctx, l, c.principal, version, true, resp)
	}, *m.cfg.Lease)
	if span.IsRecording() {
		span.SetAttributes(attribute.Int("idemq.http.attempt", res.Attempts))
	}
	if err != nil {
		m.cfg.Logger.ErrorContext(ctx, "httpidem: lease: outcome not recorded", "scope", id.Scope, "key", id.MessageID, "handler_called", res.HandlerCalled, "err", err)
		return m.unavailable(w)
	}
	switch res.Outcome {
	case dedup.OutcomeProcessed:
		last.writeTo(w)
		return last.status, OutcomeExecuted
	case dedup.OutcomeDuplicate:
		st, err := m.hs.Stored(ctx, id)
		switch {
		case err != nil:
			m.cfg.Logger.ErrorContext(ctx, "httpidem: lease: read stored response", "scope", id.Scope, "key", id.MessageID, "err", err)
			return m.unavailable(w)
		case st.Status == dedup.StatusFailedFinal:
			return m.exhausted(w, res.Attempts)
		case st.Response.Status == 0:
			return m.inFlight(w, r, c.info) // re-driven or purged meanwhile: ask for a retry
		}
		return m.replay(w, st.Response, c.record, id.Scope, id.MessageID)
	case dedup.OutcomeConflict:
		return m.conflict(w)
	case dedup.OutcomeFenced:
		return m.inFlight(w, r, c.info) // another owner took over: its outcome decides
	case dedup.OutcomeRetry:
		if errors.Is(res.Err, dedup.ErrLeaseHeld) {
			return m.inFlight(w, r, c.info)
		}
	case dedup.OutcomeDeadLetter:
		if !res.HandlerCalled {
			return m.exhausted(w, res.Attempts)
		}
	default:
		m.cfg.Logger.ErrorContext(ctx, "httpidem: lease: unexpected outcome", "outcome", res.Outcome, "err", res.Err)
		return m.unavailable(w)
	}
	if last == nil {
		return m.failed(w, nil, res)
	}
	if errors.Is(res.Err, dedup.ErrFenced) {
		return m.inFlight(w, r, c.info)
	}
	return m.failed(w, last, res)
}
