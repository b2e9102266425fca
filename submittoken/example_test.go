package submittoken_test

import (
	"errors"
	"fmt"
	"html/template"
	"log"
	"net/http"

	"github.com/idemq/idemq/submittoken"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

var form = template.Must(template.New("checkout").Parse(`<form method="post" action="/checkout">
<input type="hidden" name="submit_token" value="{{.}}">
<button>Pay</button>
</form>`))

// sessionID is your session's ID (a cookie, a JWT subject, …).
func sessionID(*http.Request) string { return "session-from-your-cookie" }

// A checkout form protected against double submits: GET renders the form
// with a fresh token bound to the session, POST consumes it before any
// work; the second click of a double-click gets 409. The payment itself
// still commits under a Postgres record or unique index (see the package
// documentation). (Compiled, not run: it needs Redis.)
func Example() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	tokens, err := submittoken.New(submittoken.Config{Client: client}) // TTL 30m, key prefix "idemq"
	if err != nil {
		log.Fatal(err)
	}
	prometheus.MustRegister(tokens.Collector()) // idemq_submit_token_consumes_total{result="reused"}: second submits

	http.HandleFunc("GET /checkout", func(w http.ResponseWriter, r *http.Request) {
		tok, err := tokens.Issue(r.Context(), "checkout:"+sessionID(r))
		if err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		_ = form.Execute(w, tok)
	})
	http.HandleFunc("POST /checkout", func(w http.ResponseWriter, r *http.Request) {
		switch err := tokens.Consume(r.Context(), "checkout:"+sessionID(r), r.FormValue("submit_token")); {
		case errors.Is(err, submittoken.ErrTokenUsed):
			http.Error(w, "this form was already submitted", http.StatusConflict)
			return
		case errors.Is(err, submittoken.ErrTokenUnknown):
			http.Error(w, "this form has expired: reload the page", http.StatusBadRequest)
			return
		case err != nil: // Redis failed: fail closed here, or rely on the Postgres record alone
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		// … the payment, in a transaction that the database guards …
		_, _ = fmt.Fprintln(w, "paid")
	})
}
