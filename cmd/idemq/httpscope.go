package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/httpidem"
	"github.com/spf13/cobra"
)

// scopeFlags name a record's scope: -scope as stored, or the parts of an
// HTTP request's scope (package httpidem), composed with httpidem.Scope so
// that the operator never escapes or hashes it by hand.
type scopeFlags struct {
	scope                                       string
	tenant, principal, anonymous, method, route string
}

// httpFlagNames are the flags of an HTTP request's scope.
var httpFlagNames = []string{"http-tenant", "http-principal", "http-anonymous", "http-method", "http-route"}

func (s *scopeFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&s.scope, "scope", "", "scope (consumer group), as stored; or name an HTTP request with the --http-* flags")
	fs.StringVar(&s.tenant, "http-tenant", "", "HTTP request: the tenant (httpidem Config.Tenant; empty when none); with --http-principal, --http-method, --http-route instead of --scope")
	fs.StringVar(&s.principal, "http-principal", "", "HTTP request: the principal (httpidem Config.Principal)")
	fs.StringVar(&s.anonymous, "http-anonymous", "", "HTTP request of an anonymous caller: what it owns (httpidem Config.Anonymous, e.g. its session ID), instead of --http-principal")
	fs.StringVar(&s.method, "http-method", "", "HTTP request: the method, e.g. POST")
	fs.StringVar(&s.route, "http-route", "", `HTTP request: the route pattern (httpidem Config.Route; for ServeMux the pattern with its method, e.g. "POST /payments")`)
}

// httpSet reports whether any --http-* flag was given.
func httpSet(cmd *cobra.Command) bool {
	for _, n := range httpFlagNames {
		if cmd.Flags().Changed(n) {
			return true
		}
	}
	return false
}

// resolve returns the scope the flags name (after parsing): --scope, or
// httpidem.Scope of the --http-* flags (--http-method and --http-route
// required, the tenant and principal may be empty as the extractors
// return them). optional allows neither (dead-letters --scope-prefix).
// Its errors are usage errors.
func (s *scopeFlags) resolve(cmd *cobra.Command, f *storeFlags, optional bool) (string, error) {
	name := cmd.Name()
	if !httpSet(cmd) {
		if s.scope == "" && !optional {
			return "", usagef("%s: --scope is required (or --http-method and --http-route, with --http-tenant and --http-principal, for an HTTP request)", name)
		}
		return s.scope, nil
	}
	isRedis, err := f.useRedis()
	switch {
	case err != nil:
		return "", err
	case s.scope != "":
		return "", usagef("%s: give --scope or the --http-* flags, not both", name)
	case s.method == "" || s.route == "":
		return "", usagef("%s: --http-method and --http-route are required with the --http-* flags", name)
	case cmd.Flags().Changed("http-anonymous") && cmd.Flags().Changed("http-principal"):
		return "", usagef("%s: give --http-principal or --http-anonymous, not both", name)
	case cmd.Flags().Changed("http-anonymous") && strings.TrimSpace(s.anonymous) == "":
		return "", usagef("%s: --http-anonymous is blank: an anonymous caller is named by what it owns", name)
	case isRedis:
		return "", usagef("%s: the --http-* flags are not for a Redis-only store (--redis): HTTP requests are recorded in Postgres", name)
	}
	if cmd.Flags().Changed("http-anonymous") {
		return httpidem.AnonymousScope(s.tenant, s.anonymous, s.method, s.route), nil
	}
	return httpidem.Scope(s.tenant, s.principal, s.method, s.route), nil
}

// inspectOutput is inspect's JSON: the record's fields, and for an HTTP
// request the stored part of its record.
type inspectOutput struct {
	dedup.Record
	HTTP *httpPart `json:"http,omitempty"`
}

// httpPart is the `<records>_http` row of an HTTP request's record.
type httpPart struct {
	Principal    string        `json:"principal"`
	CanonVersion int           `json:"canon_version"`
	Unfinished   bool          `json:"unfinished"`
	UpdatedAt    time.Time     `json:"updated_at"`
	Response     *httpResponse `json:"response"` // null: no final response stored
}

// httpResponse describes a stored response; a sealed one only by its key
// ID and size, its body only with -show-body and never when sealed.
type httpResponse struct {
	Status      int         `json:"status"`
	Sealed      bool        `json:"sealed"`
	KeyID       string      `json:"key_id,omitempty"`
	Oversized   *bool       `json:"oversized"` // null when sealed: unknown
	ResourceID  string      `json:"resource_id,omitempty"`
	Headers     http.Header `json:"headers,omitempty"`
	StoredBytes int         `json:"stored_bytes"`
	BodyBytes   *int        `json:"body_bytes"` // null when sealed (unknown) or oversized (not stored)
	Body        *string     `json:"body,omitempty"`
	BodyBase64  []byte      `json:"body_base64,omitempty"` // a body that is not UTF-8
}

// inspectHTTP prints the record of an HTTP request (scope, key exactly as
// stored) with its stored part. showBody prints a plain stored body; a
// sealed one is never printed.
func (a *app) inspectHTTP(ctx context.Context, f *storeFlags, scope, key string, showBody bool, format outputFormat) error {
	pool, st, err := a.openPG(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	hs, err := pgstore.NewHTTPStore(st)
	if err != nil {
		return err
	}
	in, err := hs.Inspect(ctx, dedup.Identity{Scope: scope, MessageID: key})
	if err != nil {
		if errors.Is(err, dedup.ErrNotFound) {
			err = fmt.Errorf("%w: scope %q, key %q", err, scope, key)
		}
		return err
	}
	out := inspectOutput{Record: in.Record}
	if row := in.Stored; row != nil {
		out.HTTP = &httpPart{Principal: row.Principal, CanonVersion: row.CanonVersion, Unfinished: row.Unfinished, UpdatedAt: row.UpdatedAt}
		if len(row.Response.Stored) > 0 {
			if out.HTTP.Response, err = a.describe(row.Response, showBody); err != nil {
				return err
			}
		}
	}
	return writeObject(a.stdout, format, out)
}

// describe turns a stored response into inspect's JSON.
func (a *app) describe(r pgstore.HTTPResponse, showBody bool) (*httpResponse, error) {
	info, err := httpidem.DescribeStoredResponse(r.Stored, r.SealedBy)
	if err != nil {
		return nil, err
	}
	out := &httpResponse{Status: r.Status, Sealed: info.Sealed, KeyID: info.KeyID, StoredBytes: info.StoredBytes}
	if info.Sealed {
		if showBody {
			_, _ = fmt.Fprintf(a.stderr, "idemq: the stored response is sealed (key %s): its body is never shown\n", info.KeyID)
		}
		return out, nil
	}
	out.Oversized, out.ResourceID, out.Headers = &info.Oversized, info.ResourceID, info.Header
	if info.Oversized {
		return out, nil // no body stored: body_bytes null
	}
	n := len(info.Body)
	out.BodyBytes = &n
	if showBody {
		if utf8.Valid(info.Body) {
			b := string(info.Body)
			out.Body = &b
		} else {
			out.BodyBase64 = info.Body
		}
	}
	return out, nil
}

// isHTTPScope reports whether scope is an HTTP request's (httpidem).
func isHTTPScope(scope string) bool { return strings.HasPrefix(scope, httpidem.ScopePrefix) }
