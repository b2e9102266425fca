package submittoken_test

import (
	"errors"
	"log"
	"net/http"

	"github.com/idemq/idemq/httpidem"
	"github.com/idemq/idemq/submittoken"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// A form that carries a submit token and an Idempotency-Key, under the
// httpidem middleware, with a Redis token: ConsumeFor holds the token for
// the request's key, so the retry of a failed attempt runs again and any
// other key is refused; Release gives the token back when the attempt
// fails. (Compiled, not run: it needs Redis and the middleware.)
func ExampleStore_ConsumeFor() {
	tokens, err := submittoken.New(submittoken.Config{Client: redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})})
	if err != nil {
		log.Fatal(err)
	}
	checkout := func(w http.ResponseWriter, r *http.Request) { // wrapped by mw.Handler
		info, _ := httpidem.InfoFromContext(r.Context())
		scope, token := "checkout:"+sessionID(r), r.PostFormValue("submit_token")
		switch err := tokens.ConsumeFor(r.Context(), scope, token, info.DownstreamKey()); {
		case errors.Is(err, submittoken.ErrTokenUsed):
			http.Error(w, "this form was already submitted", http.StatusConflict)
			return
		case err != nil:
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		if err := pay(r); err != nil { // in httpidem.FromContext(r.Context())
			_, _ = tokens.Release(r.Context(), scope, token, info.DownstreamKey())
			http.Error(w, "try again", http.StatusServiceUnavailable) // rolled back: the retry runs again
			return
		}
		w.WriteHeader(http.StatusCreated)
	}
	_ = checkout
}

// The same with tokens in Postgres: the token is consumed in the request's
// transaction, so it is used when the payment commits and unused whenever
// the attempt rolls back (a 503, a panic, a crash). (Compiled, not run.)
func ExamplePGStore_Consume() {
	tokens, err := submittoken.NewPG(submittoken.PGConfig{Table: pgx.Identifier{"shop", "submit_tokens"}})
	if err != nil {
		log.Fatal(err)
	}
	// At start: tokens.CreateTable(ctx, pool). GET /checkout renders
	// tokens.Issue(ctx, pool, "checkout:"+sessionID(r)).
	checkout := func(w http.ResponseWriter, r *http.Request) { // wrapped by mw.Handler
		tx := httpidem.FromContext(r.Context())
		switch err := tokens.Consume(r.Context(), tx, "checkout:"+sessionID(r), r.PostFormValue("submit_token")); {
		case errors.Is(err, submittoken.ErrTokenUsed):
			http.Error(w, "this form was already submitted", http.StatusConflict)
			return
		case errors.Is(err, submittoken.ErrTokenUnknown):
			http.Error(w, "this form has expired: reload the page", http.StatusBadRequest)
			return
		case err != nil:
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		if err := pay(r); err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable) // the rollback restores the token
			return
		}
		w.WriteHeader(http.StatusCreated)
	}
	_ = checkout
}

// pay is your payment, written through httpidem.FromContext(r.Context()).
func pay(*http.Request) error { return nil }
