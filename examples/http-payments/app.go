package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"html/template"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/httpidem"
	"github.com/idemq/idemq/submittoken"
	"github.com/idemq/idemq/transition"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// fingerprintSecret would come from a secret store in production.
var fingerprintSecret = []byte("demo-only-fingerprint-secret-change-me")

// DelayHeader asks the payment handler to take this long (a Go duration)
// after its insert, as a slow payment provider would: the demo's gateway
// gives up before the answer comes.
const DelayHeader = "Demo-Provider-Delay"

// orderRules is the order life cycle: PENDING → PAID → SHIPPED,
// PENDING → CANCELLED.
var orderRules = append(transition.Path("PENDING", "PAID", "SHIPPED"), transition.Rule{From: "PENDING", To: "CANCELLED"})

// paymentRequest is the body of POST /payments (JSON) and of the checkout
// form (form fields of the same names).
type paymentRequest struct {
	OrderID  string `json:"order_id"`
	Amount   string `json:"amount"`
	Currency string `json:"currency"`
	Ref      string `json:"ref"`
}

// payment is what POST /payments answers.
type payment struct {
	PaymentID string `json:"payment_id"`
	paymentRequest
}

// callback is the body of the provider's POST /callbacks/provider. The
// provider sends a new event ID with each delivery of one payment's
// callback, so no request-level key dedups them: the order's state does.
type callback struct {
	EventID string `json:"event_id"`
	OrderID string `json:"order_id"`
}

var amountRE = regexp.MustCompile(`^[0-9]{1,9}\.[0-9]{2}$`)

func (p paymentRequest) validate() error {
	switch {
	case !amountRE.MatchString(p.Amount):
		return fmt.Errorf("amount %q must look like 30.00", p.Amount)
	case p.Currency == "" || p.Ref == "" || p.OrderID == "":
		return errors.New("order_id, currency and ref are required")
	}
	return nil
}

// tables are one side's business tables (quoted, schema-qualified).
type tables struct{ payments, orders, ledger string }

func tablesFor(schema, mode string) tables {
	prefix := ""
	if mode == "naive" {
		prefix = "naive_"
	}
	q := func(n string) string { return pgx.Identifier{schema, prefix + n}.Sanitize() }
	return tables{payments: q("payments"), orders: q("orders"), ledger: q("ledger")}
}

// seedOrders are the orders both sides start with.
var seedOrders = []struct{ id, status, amount string }{
	{"ord-1", "PENDING", "30.00"},   // paid by the provider's callback
	{"ord-2", "CANCELLED", "45.00"}, // cancelled by the shopper; the provider's callback comes late
}

// createSchema creates the demo schema: idemq's tables (records, dead
// letters, stored responses) and both sides' business tables.
func createSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if _, err := pool.Exec(ctx, `create schema `+pgx.Identifier{schema}.Sanitize()); err != nil {
		return err
	}
	st, err := newStore(pool, schema)
	if err != nil {
		return err
	}
	if err := st.Migrate(ctx); err != nil {
		return err
	}
	for _, mode := range []string{"idemq", "naive"} {
		t := tablesFor(schema, mode)
		for _, sql := range []string{
			`create table ` + t.payments + ` (id bigint generated always as identity primary key, order_id text not null,
			   amount numeric(12,2) not null, currency text not null, ref text not null, created_at timestamptz not null default now())`,
			`create table ` + t.orders + ` (id text primary key, status text not null, version bigint not null default 0, amount numeric(12,2) not null)`,
			`create table ` + t.ledger + ` (id bigint generated always as identity primary key, order_id text not null,
			   event_id text not null, amount numeric(12,2) not null)`,
		} {
			if _, err := pool.Exec(ctx, sql); err != nil {
				return err
			}
		}
		for _, o := range seedOrders {
			if _, err := pool.Exec(ctx, `insert into `+t.orders+` (id, status, amount) values ($1, $2, $3)`, o.id, o.status, o.amount); err != nil {
				return err
			}
		}
	}
	return nil
}

func newStore(pool *pgxpool.Pool, schema string) (*pgstore.Store, error) {
	fp, err := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "demo-1", Secret: fingerprintSecret})
	if err != nil {
		return nil, err
	}
	return pgstore.New(pool, pgstore.Config{Schema: schema, Fingerprinter: fp})
}

// server is one side: idemq's (the middleware, submit tokens and guarded
// transitions) or the naive one (the same handlers without them).
type server struct {
	mode     string
	t        tables
	pool     *pgxpool.Pool
	mw       *httpidem.Middleware // idemq only
	tokens   *submittoken.Store   // idemq only
	orders   *transition.Machine  // idemq only
	crashKey string
}

// runServe runs one server on 127.0.0.1 (a free port, printed on stdout as
// "listening on <addr>") until SIGTERM.
func runServe(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	mode := fs.String("mode", "idemq", "idemq or naive")
	schema := fs.String("schema", "", "the demo schema (created by demo)")
	dsn := fs.String("dsn", "", "Postgres DSN")
	redisAt := fs.String("redis", redisAddr(), "Redis address")
	crashKey := fs.String("crash-key", "", "SIGKILL this process after the commit of the request with this Idempotency-Key, before its response")
	_ = fs.Parse(args)

	cfg, err := pgxpool.ParseConfig(*dsn)
	if err != nil {
		return err
	}
	cfg.MaxConns = 40 // 20 concurrent copies wait for the first one's row lock, each on a connection
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	s := &server{mode: *mode, t: tablesFor(*schema, *mode), pool: pool, crashKey: *crashKey}
	if s.mode == "idemq" {
		st, err := newStore(pool, *schema)
		if err != nil {
			return err
		}
		fp, _ := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "demo-1", Secret: fingerprintSecret})
		if s.mw, err = httpidem.New(httpidem.Config{
			Store: st, Fingerprinter: fp,
			// API clients are known by their account; a browser without
			// one only by its session, in a key space of its own. A
			// request with neither is refused 401 before anything is
			// written, never put in a key space every caller shares.
			Principal: httpidem.Header("X-User"), // in production: from the verified credentials
			Anonymous: httpidem.Cookie("sid"),
			// A copy that arrives while the first request runs waits for
			// its outcome (then replays it) instead of a 409 at once.
			InFlightWait: 5 * time.Second,
		}); err != nil {
			return err
		}
		rdb := redis.NewClient(&redis.Options{Addr: *redisAt})
		defer func() { _ = rdb.Close() }()
		if s.tokens, err = submittoken.New(submittoken.Config{Client: rdb, Prefix: "idemq-demo-" + *schema}); err != nil {
			return err
		}
		if s.orders, err = transition.New(transition.Config{Table: pgx.Identifier{*schema, "orders"}, Returning: []string{"amount"}, Rules: orderRules}); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second}
	fmt.Printf("listening on %s\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /checkout", s.checkoutForm)
	if s.mode == "idemq" {
		mux.Handle("POST /checkout", s.formGate(s.mw.Handler(http.HandlerFunc(s.checkout))))
		mux.Handle("POST /payments", s.mw.Handler(http.HandlerFunc(s.createPayment)))
		mux.HandleFunc("POST /callbacks/provider", s.providerCallback)
	} else {
		mux.HandleFunc("POST /checkout", s.checkout)
		mux.HandleFunc("POST /payments", s.createPayment)
		mux.HandleFunc("POST /callbacks/provider", s.naiveProviderCallback)
	}
	return s.crashAfterCommit(mux)
}

// principal is who sends the request, as the middleware tells callers
// apart: X-User for API clients (in production: the verified
// credentials), else the form's session cookie, each in a namespace of its
// own (the submit tokens' key).
func principal(r *http.Request) (string, error) {
	if u := strings.TrimSpace(r.Header.Get("X-User")); u != "" {
		return "user:" + u, nil
	}
	if c, err := r.Cookie("sid"); err == nil && strings.TrimSpace(c.Value) != "" {
		return "session:" + c.Value, nil
	}
	return "", &httpidem.Problem{Type: httpidem.TypeUnauthenticated, Title: "who are you?", Status: http.StatusUnauthorized}
}

// insertPayment is the business write, the same on both sides.
func (s *server) insertPayment(ctx context.Context, tx pgx.Tx, req paymentRequest) (payment, error) {
	var id int64
	err := tx.QueryRow(ctx, `insert into `+s.t.payments+` (order_id, amount, currency, ref) values ($1, $2, $3, $4) returning id`,
		req.OrderID, req.Amount, req.Currency, req.Ref).Scan(&id)
	return payment{PaymentID: "pay_" + strconv.FormatInt(id, 10), paymentRequest: req}, err
}

// pay runs insertPayment in the request's transaction: the one of the
// record under idemq (committed by the middleware with the record and the
// stored response), or one of its own, committed at once, on the naive
// side. Then the slow provider call, if the request asks for one.
func (s *server) pay(r *http.Request, req paymentRequest) (payment, error) {
	ctx := r.Context()
	var p payment
	var err error
	if tx := httpidem.FromContext(ctx); tx != nil {
		p, err = s.insertPayment(ctx, tx, req)
	} else {
		err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			p, err = s.insertPayment(ctx, tx, req)
			return err
		})
	}
	if err != nil {
		return p, err
	}
	if d, perr := time.ParseDuration(r.Header.Get(DelayHeader)); perr == nil && d > 0 && d <= time.Minute {
		time.Sleep(d) // the provider call (under idemq it would carry Info.DownstreamKey())
	}
	return p, nil
}

// createPayment is POST /payments (JSON).
func (s *server) createPayment(w http.ResponseWriter, r *http.Request) {
	var req paymentRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		problem(w, http.StatusBadRequest, "malformed JSON: "+err.Error())
		return
	}
	if err := req.validate(); err != nil {
		problem(w, http.StatusBadRequest, err.Error()) // final: stored and replayed under idemq
		return
	}
	p, err := s.pay(r, req)
	if err != nil {
		problem(w, http.StatusServiceUnavailable, "try again") // 5xx: the retry runs again
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/payments/"+p.PaymentID)
	w.Header().Set(httpidem.ResourceIDHeader, p.PaymentID)
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(p)
}

var formPage = template.Must(template.New("checkout").Parse(`<!doctype html>
<title>Checkout</title>
<form method="post" action="/checkout">
<input type="hidden" name="submit_token" value="{{.Token}}">
<input type="hidden" name="order_id" value="ord-1">
<input type="hidden" name="ref" value="{{.Ref}}">
<label>Amount <input name="amount" value="30.00"></label>
<input type="hidden" name="currency" value="EUR">
<button id="pay">Pay</button>
</form>
`))

var resultPage = template.Must(template.New("paid").Parse(`<!doctype html>
<title>Paid</title>
<p id="result">Payment {{.PaymentID}}: {{.Amount}} {{.Currency}} for {{.OrderID}}</p>
`))

// checkoutForm is GET /checkout: the form, with a fresh submit token under
// idemq.
func (s *server) checkoutForm(w http.ResponseWriter, r *http.Request) {
	who, err := principal(r)
	if err != nil {
		http.Error(w, "no session", http.StatusUnauthorized)
		return
	}
	var tok string
	if s.tokens != nil {
		if tok, err = s.tokens.Issue(r.Context(), "checkout:"+who); err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = formPage.Execute(w, map[string]string{"Token": tok, "Ref": r.URL.Query().Get("ref")})
}

// checkout is POST /checkout (the form).
func (s *server) checkout(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad form", http.StatusBadRequest)
		return
	}
	req := paymentRequest{OrderID: r.PostForm.Get("order_id"), Amount: r.PostForm.Get("amount"),
		Currency: r.PostForm.Get("currency"), Ref: r.PostForm.Get("ref")}
	if err := req.validate(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	p, err := s.pay(r, req)
	if err != nil {
		http.Error(w, "try again", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set(httpidem.ResourceIDHeader, p.PaymentID)
	w.WriteHeader(http.StatusCreated)
	_ = resultPage.Execute(w, p)
}

// formKey is the Idempotency-Key of a form submit: derived from its submit
// token, so every submit of one rendered form is one request to the key
// layer, and a used token can never start a second payment under a fresh
// key.
func formKey(token string) string {
	h := sha256.Sum256([]byte("checkout-form\x00" + token))
	return "form-" + hex.EncodeToString(h[:16])
}

// formGate consumes the form's submit token before the key layer runs. The
// first submit goes on; a second one (a double-click) goes on too, to the
// key layer, which replays the first answer (or waits for it): the browser
// shows the answer to the last click, so it must be the payment's page,
// not an error. A form that is not ours (unknown or expired token) is
// refused before Postgres sees it. Redis failing costs nothing but the
// early refusal: the record decides.
func (s *server) formGate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
		if err != nil {
			http.Error(w, "form too large", http.StatusRequestEntityTooLarge)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body)) // for the key layer's fingerprint and the handler
		form, err := url.ParseQuery(string(body))
		if err != nil {
			http.Error(w, "bad form", http.StatusBadRequest)
			return
		}
		who, err := principal(r)
		if err != nil {
			http.Error(w, "no session", http.StatusUnauthorized)
			return
		}
		token := form.Get("submit_token")
		switch err := s.tokens.Consume(r.Context(), "checkout:"+who, token); {
		case err == nil, errors.Is(err, submittoken.ErrTokenUsed):
			// First submit, or a repeat: the key layer tells them apart.
		case errors.Is(err, submittoken.ErrTokenUnknown):
			http.Error(w, "this form has expired: reload the page", http.StatusBadRequest)
			return
		default:
			slog.Warn("submit token check failed; the idempotency record decides alone", "err", err)
		}
		r.Header.Set("Idempotency-Key", formKey(token))
		next.ServeHTTP(w, r)
	})
}

// providerCallback is POST /callbacks/provider under idemq: PENDING → PAID
// as a guarded transition, and the merchant's ledger credited only by the
// call that changed the order.
func (s *server) providerCallback(w http.ResponseWriter, r *http.Request) {
	var ev callback
	if err := json.NewDecoder(r.Body).Decode(&ev); err != nil || ev.OrderID == "" || ev.EventID == "" {
		problem(w, http.StatusBadRequest, "event_id and order_id are required")
		return
	}
	var amount string
	err := pgx.BeginFunc(r.Context(), s.pool, func(tx pgx.Tx) error {
		res, err := s.orders.Apply(r.Context(), tx, ev.OrderID, "PAID", transition.Into(&amount))
		if err != nil || !res.Changed {
			return err // AlreadyApplied: a repeated delivery, nothing more to do
		}
		_, err = tx.Exec(r.Context(), `insert into `+s.t.ledger+` (order_id, event_id, amount) values ($1, $2, $3)`, ev.OrderID, ev.EventID, amount)
		return err
	})
	var illegal *transition.IllegalTransitionError
	switch {
	case errors.As(err, &illegal):
		problem(w, http.StatusConflict, "order "+ev.OrderID+" is "+illegal.Status+": refund the payment")
	case errors.Is(err, transition.ErrNotFound):
		problem(w, http.StatusNotFound, "no order "+ev.OrderID)
	case err != nil:
		problem(w, http.StatusServiceUnavailable, "try again")
	default:
		w.WriteHeader(http.StatusNoContent) // first delivery and repeats alike
	}
}

// naiveProviderCallback is the same callback without the guard: it sets
// PAID and credits the ledger on every delivery.
func (s *server) naiveProviderCallback(w http.ResponseWriter, r *http.Request) {
	var ev callback
	if err := json.NewDecoder(r.Body).Decode(&ev); err != nil || ev.OrderID == "" || ev.EventID == "" {
		problem(w, http.StatusBadRequest, "event_id and order_id are required")
		return
	}
	err := pgx.BeginFunc(r.Context(), s.pool, func(tx pgx.Tx) error {
		var amount string
		if err := tx.QueryRow(r.Context(), `update `+s.t.orders+` set status = 'PAID', version = version + 1 where id = $1 returning amount::text`, ev.OrderID).Scan(&amount); err != nil {
			return err
		}
		_, err := tx.Exec(r.Context(), `insert into `+s.t.ledger+` (order_id, event_id, amount) values ($1, $2, $3)`, ev.OrderID, ev.EventID, amount)
		return err
	})
	if err != nil {
		problem(w, http.StatusServiceUnavailable, "try again")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func problem(w http.ResponseWriter, status int, detail string) {
	httpidem.WriteProblem(w, &httpidem.Problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail})
}

// crashAfterCommit SIGKILLs this process when the response to the request
// whose Idempotency-Key is s.crashKey starts: under idemq the middleware
// writes the response only after COMMIT, and the naive handlers commit
// before they answer, so the payment is durable and the client never hears
// of it.
func (s *server) crashAfterCommit(next http.Handler) http.Handler {
	if s.crashKey == "" {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == s.crashKey {
			w = &killOnWrite{ResponseWriter: w}
		}
		next.ServeHTTP(w, r)
	})
}

type killOnWrite struct{ http.ResponseWriter }

func (k *killOnWrite) WriteHeader(int) { kill() }

func (k *killOnWrite) Write([]byte) (int, error) { kill(); return 0, nil }

func kill() {
	_, _ = fmt.Fprintln(os.Stderr, "[crash] SIGKILL after the commit, before the response")
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}
