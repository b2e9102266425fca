// Package httpidem is net/http middleware that makes HTTP requests carrying
// an Idempotency-Key (draft-ietf-httpapi-idempotency-key-header) take
// effect once, on the same consumption records, fingerprints, dead letters,
// retention and tooling as idemq's message consumers (dedup/pgstore). A
// double-clicked button, a gateway that retries after a timeout, and 20
// copies of one request at once all run the handler once; every retry gets
// the first response back, byte for byte, marked Idempotent-Replayed: true.
//
// # Use
//
//	mw, err := httpidem.New(httpidem.Config{
//		Store:         store, // *pgstore.Store; store.Migrate creates the tables
//		Fingerprinter: fp,    // dedup.NewFingerprinter(nil, keys...)
//		Principal:     func(r *http.Request) (string, error) { return userID(r) }, // "" → 401
//	})
//	mux.Handle("POST /payments", mw.Handler(http.HandlerFunc(createPayment)))
//
//	func createPayment(w http.ResponseWriter, r *http.Request) {
//		tx := httpidem.FromContext(r.Context()) // the record's transaction
//		_, err := tx.Exec(r.Context(), "insert into payments …")
//		…
//		w.WriteHeader(http.StatusCreated)
//	}
//
// # Identity
//
// A request's consumption record is (scope, message ID): the scope is
// tenant, principal, method and route pattern, each from an Extractor
// (Config.Tenant, Principal, Route), joined injectively by Scope (keys of
// two principals, tenants or routes never collide; the same key on two
// routes is two requests; the same key on two targets of one route is a
// conflict, see Fingerprint); the message ID is the Idempotency-Key, 1 to 255
// bytes of printable ASCII (ValidateKey; an RFC 8941 quoted string as the
// draft writes it is accepted too). Requests whose method is in
// Config.Methods (POST and PATCH by default) must carry one: none → 400
// TypeKeyMissing, an invalid one → 400 TypeKeyInvalid, both with RFC 9457
// problem+json bodies (Problem).
//
// An empty or blank principal is no identity (no credentials, an
// authentication middleware that did not run): every such caller would
// share one key space and be served another's stored response. It is
// answered 401 TypeUnauthenticated before anything is written, and a blank
// configured tenant 400 TypeUnidentified. A route open to anonymous callers
// says so with Config.Anonymous, an Extractor of something the caller owns
// (Cookie("session"), a device ID): a request without a principal is then
// scoped by it, in a key space no principal shares (AnonymousScope), and a
// blank one is refused too.
//
// # Fingerprint
//
// The record stores an HMAC-SHA256 (Config.Fingerprinter: key IDs, current
// and previous keys for rotation) over the method, route pattern, the
// target, media type, API version (Config.APIVersion), tenant, principal
// and the canonical body: JSON bodies per RFC 8785 (JCS) without the
// members of Config.IgnoreFields, other bodies byte for byte. The target is
// the concrete resource and parameters: the path (path values included;
// RFC 3986 normalized: %2D is "-", %2f is %2F) and the query parsed as
// URL.Query() reads it and re-encoded with the parameters sorted by name
// (the order of parameters does not matter, the order of one parameter's
// repeated values does), without Config.IgnoreQuery; a query that does not
// parse counts byte for byte. So one key sent to /invoices/inv-901/credits
// and then to /invoices/inv-902/credits, or with ?cents=7 and then
// ?cents=700, is a conflict (422), never a replay of the other resource's
// outcome. The canonicalization rules carry a version (CanonicalVersion),
// stored with the record; a retry is compared under the stored version, so
// a rule upgrade never turns a retry into a conflict (records of version 1
// are compared without the target until they leave Config.RetryWindow).
//
// # Outcomes
//
//   - New key: the handler runs (see Atomicity). A final response (2xx, 3xx,
//     and 4xx but 408, 409, 425 and 429: Config.FinalStatus) is stored and
//     committed with the record (SUCCEEDED).
//   - Same key, same fingerprint, finished: the stored status, the
//     allow-listed headers (Config.StoredHeaders) and the body are replayed
//     with Idempotent-Replayed: true; the handler is not called.
//   - Same key, another fingerprint: 422 (or 409, Config.ConflictStatus),
//     TypeKeyReused; the handler is not called, the record is unchanged, and
//     a dead letter (reason payload_conflict) keeps the request for
//     `idemq dead-letters`.
//   - Same key, still running: 409 TypeInFlight with Retry-After
//     (Config.RetryAfter), after waiting at most Config.InFlightWait for the
//     first request to finish (then answered from its outcome). Never a 5xx.
//   - The handler answers a non-final status (5xx, 408, 409, 425, 429),
//     panics, or its transaction fails: its writes roll back, the record
//     becomes FAILED_RETRYABLE with the attempt counted, the client gets the
//     handler's answer (or 500), and the next retry runs the handler again.
//     After the store's MaxAttempts failures the record is FAILED_FINAL with
//     a dead letter, and the key answers 409 TypeKeyExhausted (an operator
//     may re-drive it: `idemq redrive`).
//   - A new key while the principal has Config.MaxUnfinished retryable
//     records touched within Config.RetryWindow: 429 TypeTooManyUnfinished
//     with Retry-After; nothing is written.
//
// Asynchronous routes (Config.AsyncStatus) answer copies of a running
// request 202 Accepted with a status URL and Retry-After instead of 409.
//
// # Atomicity and the claim design
//
// Atomic mode, one transaction per request: it first takes a
// transaction-level advisory lock on the identity (64 bits of SHA-256 over
// scope and key): at once (pg_try_advisory_xact_lock) when
// Config.InFlightWait is 0, else waiting at most that long
// (pg_advisory_xact_lock under a transaction-local lock_timeout, the only
// statement that runs under it, so no unrelated lock wait passes for a
// request in flight). A copy that does not get it is answered 409 with
// Retry-After instead of blocking a connection for the first request's
// whole duration. Then the claim inserts the record (INSERT … ON CONFLICT
// DO NOTHING, or locks an existing retryable one FOR UPDATE), the handler
// runs in the same transaction (FromContext), and the record, the
// handler's business rows, its outbox rows and the stored response commit
// together. A crashed process's transaction is rolled back by Postgres,
// its locks with it, so no lease is needed and nothing is left in flight.
//
// Unfinished keys must be countable for the cap: in-flight records are
// uncommitted (invisible), and bounded by the pool and the server's
// concurrency anyway; what can pile up are committed FAILED_RETRYABLE
// records. Their stored-response row (one per HTTP record, keyed by the
// record id, ON DELETE CASCADE) carries the principal and an unfinished
// flag, and a partial index on (principal, updated_at) where unfinished
// holds only those, so the cap is one index scan of at most MaxUnfinished
// entries, sent with the key's lock in one round trip.
//
// The handler's response is buffered and written to the client only after
// COMMIT. The handler and the recording of its outcome run on a context
// detached from the client (context.WithoutCancel, bounded by
// Config.Timeout): a client that hangs up mid-handler interrupts neither,
// so the record is never left in flight or lost, and its retry replays. A
// COMMIT whose outcome is unknown (the connection lost) answers 503
// TypeUnavailable with Retry-After; the retry finds the truth.
//
// # Lease mode
//
// Handlers whose side effects cannot join the transaction (a payment
// provider's API) set Config.Lease: the claim commits first through
// dedup/pgstore's lease mode (PROCESSING with an owner token, a fence and a
// lease in database time, extended by heartbeats), so the unfinished key is
// visible and counted at once; the handler runs without a transaction
// (FromContext returns nil) and passes KeyFromContext to the provider; its
// final response is stored only while the lease's token and fence still
// hold the record, then the record is marked SUCCEEDED the same way. A copy
// that finds a live lease gets 409 with Retry-After; one that finds an
// expired lease (its owner died or stalled) takes over with fence + 1 and
// runs the handler again with the same downstream key, so the provider
// deduplicates; the stale owner's response and marks are refused, and its
// client gets 409. These are brandur's atomic phases with one recovery
// point: the provider's own idempotency key.
//
// # Stored responses
//
// At most Config.MaxResponseBytes of body are stored (a larger body stores
// the status, headers and Resource-Id, and replays them with
// Idempotent-Replay-Body-Omitted: true); Config.Redact may mask what is
// stored; Config.Sealer (NewAESGCM) encrypts it at rest with key IDs for
// rotation.
//
// # Retention
//
// Records are kept as the Store says (SucceededRetention, 7 days by
// default) and purged with the MQ records (`idemq purge`); New refuses a
// SucceededRetention shorter than Config.RetryWindow (24 hours by default),
// naming both. After retention a key is new again: keep a business unique
// index (e.g. on the payment's reference) as the last line of defence.
//
// # Clients that retry by themselves
//
// Go's own http.Transport treats a request carrying an Idempotency-Key
// header as idempotent: when the connection closes before any answer, it
// sends the request again once, on a new connection, without telling the
// caller. Behind this middleware that resend is answered like any other
// copy (a replay, or 409 while the first still runs); a server without it
// may apply such a request twice. Gateways and SDKs that retry on timeouts
// behave the same way, which is why the key, not the client, decides.
//
// # Routers
//
// The route pattern comes from net/http's ServeMux (Request.Pattern, Go
// 1.23+) by default. Other routers give Config.Route an Extractor and wrap
// handlers with Handler the way they take net/http middleware:
//
//   - chi: r.With(mw.Handler).Post("/payments", h); Route:
//     func(r *http.Request) (string, error) { return chi.RouteContext(r.Context()).RoutePattern(), nil }
//     (set after routing: wrap the handler, not the router).
//   - echo: e.POST("/payments", h, echo.WrapMiddleware(mw.Handler)); Route:
//     the path echo matched, which it keeps in echo.Context.Path(): store it
//     in the request context in a small echo middleware before this one.
//   - gin: a gin.HandlerFunc that calls mw.Handler(next).ServeHTTP(c.Writer,
//     c.Request) with next calling c.Next(); Route: c.FullPath(), put in the
//     request context the same way.
//
// See Example_router for a complete adapter that needs no router import.
//
// # Operations
//
// HTTP records are consumption records: `idemq inspect --http-tenant T
// -http-principal P -http-method M -http-route R -message-id <key>`
// (-http-anonymous OWNER for an anonymous caller) shows
// one with its stored response (the scope composed by Scope; the body only
// with -show-body, never a sealed one: DescribeStoredResponse), `idemq
// dead-letters -scope-prefix 'http|'` (ScopePrefix) lists conflicts and
// exhausted keys, `idemq redrive` takes the same flags, and `idemq purge`
// removes expired records, their stored responses with them (ON DELETE
// CASCADE).
// NewMetrics counts outcomes for Prometheus (idemq_http_requests_total);
// with Config.TracerProvider the middleware starts a server span with the
// HTTP semantic-convention attributes (http.request.method, http.route,
// http.response.status_code, url.path, url.scheme, server.address,
// user_agent.original) plus idemq.http.outcome and idemq.http.attempt,
// else it adds them to the span already in the request context (otelhttp's),
// and does nothing when there is none.
package httpidem
