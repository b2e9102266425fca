// Package submittoken is the one-time submit token for HTML forms, on Redis
// (github.com/redis/go-redis/v9, Store) or in a Postgres table (PGStore):
// the classic defence against a double-clicked "Pay" button.
//
// The page that renders the form calls Store.Issue and puts the token in a
// hidden field; the handler that receives the form calls Store.Consume with
// it before doing anything else. The first submit consumes the token; every
// later submit of the same token gets ErrTokenUsed, and the handler answers
// 409 Conflict. When the form also carries an Idempotency-Key (the httpidem
// middleware), consume with ConsumeFor or PGStore.Consume instead (see "A
// token with an Idempotency-Key"), so that a retry of a failed attempt runs.
//
//	tok, err := tokens.Issue(ctx, "checkout:"+sessionID) // render <input type="hidden" name="submit_token" value="{{tok}}">
//	...
//	switch err := tokens.Consume(ctx, "checkout:"+sessionID, r.FormValue("submit_token")); {
//	case errors.Is(err, submittoken.ErrTokenUsed):    // 409: already submitted
//	case errors.Is(err, submittoken.ErrTokenUnknown): // 400 or 403: expired, forged, or of another session; re-render the form
//	case err != nil:                                  // Redis failed: see "Redis is never the only defence"
//	}
//
// # Tokens and keys
//
// A token is 32 bytes from crypto/rand (256 bits), base64url without padding
// (43 characters of [A-Za-z0-9_-], safe in URLs, form fields and headers).
// It lives in Redis under "<Prefix>:submit:<scope>:<token>" for Config.TTL
// (default 30 minutes): Issue writes it with SET NX EX, so an issued token is
// never overwritten. The scope binds a token to where it may be used: put the
// form and the session or principal in it ("checkout:" + session ID), so a
// token leaked from one session is unknown in every other.
//
// Consume is one Lua script, atomic on the server: it finds the token issued
// and marks it used (the key then lives for the rest of the token's TTL, at
// least Config.UsedTTL), or finds it already used (ErrTokenUsed), or does not
// find it (ErrTokenUnknown: never issued in this scope, expired, used longer
// than UsedTTL ago, or malformed, which is refused without a Redis call). A
// plain GETDEL (Redis 6.2) consumes atomically too, but it forgets the token:
// a second submit could not be told from a forged one, and a call that
// go-redis sends again after its connection died (Options.MaxRetries) would
// report a token it had just consumed as unknown. The script instead
// remembers who consumed the token (a fresh ID per Consume call), so a
// second run of the same call answers "consumed" again. It needs Redis 6.2
// or later, the floor of the rest of idemq, and runs on Redis Cluster (one
// key per call).
//
// # Redis is never the only defence
//
// The token stops the common case, two submits of one rendered form, before
// any work starts, and lets the page answer "already submitted" at once.
// It is not a guarantee of exactly one effect, and must never be the only
// one: Redis may fail over and lose a write (a consumed token is then
// consumable again), evict keys under memory pressure, or be down. What
// decides is the database: the Postgres record of the httpidem middleware,
// or a business unique index (one payment per order), in the transaction
// that writes the effect. When Consume returns another error (Redis down),
// fail closed (503) or go on and rely on that record; never skip both.
//
// When a token helps: a browser form that a person may submit twice (a
// double-click, the back button then submit again, two tabs), where the
// page can issue a token per rendering.
//
// When it does not: API clients, gateways, and retries after a timeout. A
// client that did not get the answer must be able to send the same request
// again and get the same answer; a token consumed by the first attempt turns
// that retry into a 409, and the client cannot know whether the payment
// happened. Those clients send an Idempotency-Key instead (the httpidem
// middleware), which replays the first response. A form can carry both: the
// token answers the double-click early, the key makes a retried submit a
// replay.
//
// # A token with an Idempotency-Key
//
// Under the httpidem middleware the token must share the request's fate:
// when an attempt fails retryably (the handler answers 503, its
// transaction rolls back), the retry with the same key and token must run
// again, not meet its own used token. Plain Consume cannot know that: the
// retry gets ErrTokenUsed, the handler answers 409, which the middleware
// counts as another failed attempt until the key is exhausted, and the
// purchase never completes. Two ways that work:
//
//   - Redis: ConsumeFor(ctx, scope, token, info.DownstreamKey()) in the
//     handler (info from httpidem.InfoFromContext). The token is used for
//     that key: the key's retries get nil again (the middleware then
//     reruns a failed attempt or replays a finished one without calling
//     the handler), another key gets ErrTokenUsed. When the handler answers
//     a retryable failure it calls Release, so the token is unused again.
//     A rollback the handler cannot see (a crash between ConsumeFor and
//     COMMIT, a COMMIT that failed) leaves the token held by its key: that
//     key's retry goes on, no other request can use it, and it expires
//     with its TTL. A token used by a key whose attempt succeeded stays
//     used.
//   - Postgres: PGStore.Consume(ctx, httpidem.FromContext(ctx), scope,
//     token) consumes the token in the request's own transaction, so it is
//     used exactly when the request's work commits and unused whenever it
//     rolls back, a crash included. A concurrent submit with another key
//     waits on the token's row and then finds it used (or, when the first
//     rolled back, consumes it).
//
// Either way a different key with a token that a committed request used
// is refused with ErrTokenUsed ("already submitted").
//
// # Metrics
//
// Store.Collector exports idemq_submit_tokens_issued_total and
// idemq_submit_token_consumes_total{result} (consumed, reused, unknown,
// error), counting Consume and ConsumeFor calls; result="reused" counts
// second submits. Store.Stats returns the same numbers, and Released
// (tokens Release gave back). PGStore keeps no counters.
package submittoken
