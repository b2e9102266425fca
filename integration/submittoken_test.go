package integration

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/httpidem"
	"github.com/idemq/idemq/internal/faultproxy"
	"github.com/idemq/idemq/submittoken"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// tokenStore is a submittoken.Store on the test Redis (at addr when given,
// else TEST_REDIS_ADDR) under a key prefix of the test's own, whose keys are
// deleted when the test ends.
func tokenStore(t *testing.T, addr string, tweak func(*submittoken.Config)) (*submittoken.Store, *redis.Client) {
	t.Helper()
	direct := redis.NewClient(&redis.Options{Addr: redisAddress(t)})
	if addr == "" {
		addr = redisAddress(t)
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	prefix := randomName("st")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if keys, err := direct.Keys(ctx, prefix+":*").Result(); err == nil && len(keys) > 0 {
			_ = direct.Del(ctx, keys...).Err()
		}
		_ = direct.Close()
		_ = c.Close()
	})
	cfg := submittoken.Config{Client: c, Prefix: prefix}
	if tweak != nil {
		tweak(&cfg)
	}
	s, err := submittoken.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, direct
}

var tokenPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{43}$`)

// A token is consumed once: the second submit gets ErrTokenUsed; it is
// unknown in another scope, and a forged token is unknown; tokens are
// URL-safe and distinct; the key expires with the configured TTL.
func TestSubmitTokenIssueConsume(t *testing.T) {
	t.Parallel()
	s, rdb := tokenStore(t, "", nil)
	ctx := context.Background()
	seen := map[string]bool{}
	for range 200 {
		tok, err := s.Issue(ctx, "checkout:session-1")
		if err != nil {
			t.Fatal(err)
		}
		if !tokenPattern.MatchString(tok) || seen[tok] {
			t.Fatalf("token %q: not 43 base64url characters, or issued twice", tok)
		}
		seen[tok] = true
	}
	tok, err := s.Issue(ctx, "checkout:session-1")
	if err != nil {
		t.Fatal(err)
	}
	ttl, err := rdb.TTL(ctx, s.Config().Prefix+":submit:checkout:session-1:"+tok).Result()
	if err != nil || ttl <= submittoken.DefaultTTL-time.Minute || ttl > submittoken.DefaultTTL {
		t.Fatalf("the token's key TTL = %s, %v; want about %s", ttl, err, submittoken.DefaultTTL)
	}
	if err := s.Consume(ctx, "checkout:session-2", tok); !errors.Is(err, submittoken.ErrTokenUnknown) {
		t.Fatalf("consumed in another scope: %v, want ErrTokenUnknown", err)
	}
	if err := s.Consume(ctx, "checkout:session-1", tok); err != nil {
		t.Fatalf("first submit: %v", err)
	}
	for i := range 3 {
		if err := s.Consume(ctx, "checkout:session-1", tok); !errors.Is(err, submittoken.ErrTokenUsed) {
			t.Fatalf("submit %d: %v, want ErrTokenUsed", i+2, err)
		}
	}
	forged := strings.Repeat("A", 43) // well formed, never issued
	if err := s.Consume(ctx, "checkout:session-1", forged); !errors.Is(err, submittoken.ErrTokenUnknown) {
		t.Fatalf("forged token: %v, want ErrTokenUnknown", err)
	}
	if st := s.Stats(); st.Issued != 201 || st.Consumed != 1 || st.Reused != 3 || st.Unknown != 2 || st.Errors != 0 {
		t.Fatalf("stats = %+v; want 201 issued, 1 consumed, 3 reused, 2 unknown", st)
	}
}

// An unused token expires after TTL (unknown); a used one is remembered as
// used for at least UsedTTL, past the token's own expiry.
func TestSubmitTokenExpiry(t *testing.T) {
	t.Parallel()
	s, rdb := tokenStore(t, "", func(c *submittoken.Config) { c.TTL = 2 * time.Second; c.UsedTTL = time.Minute })
	ctx := context.Background()
	unused, err := s.Issue(ctx, "checkout")
	if err != nil {
		t.Fatal(err)
	}
	used, err := s.Issue(ctx, "checkout")
	if err != nil {
		t.Fatal(err)
	}
	usedExpiry := time.Now().Add(2 * time.Second) // no earlier than the TTL the used token was issued with
	if err := s.Consume(ctx, "checkout", used); err != nil {
		t.Fatalf("first submit: %v", err)
	}
	key := func(tok string) string { return s.Config().Prefix + ":submit:checkout:" + tok }
	if ttl, err := rdb.PTTL(ctx, key(used)).Result(); err != nil || ttl <= 2*time.Second {
		t.Fatalf("a used token's key TTL = %s, %v; want UsedTTL (1m), more than the token's 2s", ttl, err)
	}
	deadline := time.Now().Add(time.Minute)
	for rdb.Exists(ctx, key(unused)).Val() == 1 {
		if time.Now().After(deadline) {
			t.Fatal("the unused token's key did not expire")
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Until(usedExpiry)) // the used token's own TTL has run out too
	if err := s.Consume(ctx, "checkout", unused); !errors.Is(err, submittoken.ErrTokenUnknown) {
		t.Fatalf("expired token: %v, want ErrTokenUnknown", err)
	}
	if err := s.Consume(ctx, "checkout", used); !errors.Is(err, submittoken.ErrTokenUsed) {
		t.Fatalf("a used token past its TTL: %v, want ErrTokenUsed", err)
	}
}

// 50 submits of one token at once: exactly one consumes it, the 49 others
// get ErrTokenUsed. Ten tokens, so a lucky interleaving cannot pass.
func TestSubmitTokenConcurrentConsumes(t *testing.T) {
	t.Parallel()
	s, _ := tokenStore(t, "", nil)
	ctx := context.Background()
	for range 10 {
		tok, err := s.Issue(ctx, "checkout")
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make([]error, 50)
		for i := range errs {
			wg.Go(func() {
				<-start
				errs[i] = s.Consume(ctx, "checkout", tok)
			})
		}
		close(start)
		wg.Wait()
		won, used := 0, 0
		for _, err := range errs {
			switch {
			case err == nil:
				won++
			case errors.Is(err, submittoken.ErrTokenUsed):
				used++
			default:
				t.Fatalf("consume: %v", err)
			}
		}
		if won != 1 || used != 49 {
			t.Fatalf("50 concurrent submits: %d consumed, %d ErrTokenUsed; want 1 and 49", won, used)
		}
	}
	if st := s.Stats(); st.Consumed != 10 || st.Reused != 490 {
		t.Fatalf("stats = %+v; want 10 consumed, 490 reused", st)
	}
}

// Consume's reply is lost and its connection closed (S18's fault, through
// a TCP proxy in front of the real Redis): go-redis sends the script again,
// which finds the token consumed by this very call and answers nil, not
// "unknown" (GETDEL's answer) nor "used". A later submit gets ErrTokenUsed.
func TestSubmitTokenConsumeReplyLost(t *testing.T) {
	t.Parallel()
	p := faultproxy.New(t, redisAddress(t), faultproxy.RESP)
	s, _ := tokenStore(t, p.Addr(), nil)
	ctx := context.Background()
	// A first token loads the script, so that the lost reply is the
	// script's, not EVALSHA's NOSCRIPT.
	for range 2 {
		warm, err := s.Issue(ctx, "warm-up")
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Consume(ctx, "warm-up", warm); err != nil {
			t.Fatal(err)
		}
	}
	tok, err := s.Issue(ctx, "checkout")
	if err != nil {
		t.Fatal(err)
	}
	p.DropReplyOnce(func(req []byte) bool {
		sc, ok := faultproxy.AsScript(req)
		return ok && sc.HasKey(":submit:checkout:"+tok)
	})
	err = s.Consume(ctx, "checkout", tok)
	p.WaitDropped(1)
	if err != nil {
		t.Fatalf("consume whose first reply was lost: %v, want nil", err)
	}
	if err := s.Consume(ctx, "checkout", tok); !errors.Is(err, submittoken.ErrTokenUsed) {
		t.Fatalf("second submit: %v, want ErrTokenUsed", err)
	}
}

// s25Backend is one token backend of S25: issue a token, consume it in a
// handler under the httpidem middleware, and give it back when the
// handler's attempt fails (a no-op for the Postgres backend, whose
// consumption rolls back with the request's transaction).
type s25Backend struct {
	issue   func() string
	consume func(r *http.Request, token string) error
	release func(r *http.Request, token string)
}

func s25Backends(t *testing.T, e *env) map[string]s25Backend {
	const scope = "checkout:alice"
	rs, _ := tokenStore(t, "", nil)
	owner := func(r *http.Request) string {
		info, ok := httpidem.InfoFromContext(r.Context())
		if !ok {
			t.Error("the handler runs outside the middleware")
		}
		return info.DownstreamKey()
	}
	pg, err := submittoken.NewPG(submittoken.PGConfig{Table: pgx.Identifier{e.schema, "submit_tokens"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.CreateTable(e.ctx, e.pool); err != nil {
		t.Fatal(err)
	}
	return map[string]s25Backend{
		"redis": {
			issue: func() string {
				tok, err := rs.Issue(e.ctx, scope)
				if err != nil {
					t.Fatal(err)
				}
				return tok
			},
			consume: func(r *http.Request, token string) error { return rs.ConsumeFor(r.Context(), scope, token, owner(r)) },
			release: func(r *http.Request, token string) {
				if ok, err := rs.Release(r.Context(), scope, token, owner(r)); !ok || err != nil {
					t.Errorf("release: %v, %v; want the token released", ok, err)
				}
			},
		},
		"postgres": {
			issue: func() string {
				tok, err := pg.Issue(e.ctx, e.pool, scope)
				if err != nil {
					t.Fatal(err)
				}
				return tok
			},
			consume: func(r *http.Request, token string) error {
				return pg.Consume(r.Context(), httpidem.FromContext(r.Context()), scope, token)
			},
			release: func(*http.Request, string) {},
		},
	}
}

// S25: a checkout form carries a submit token and Idempotency-Key ck-25.
// The first attempt consumes the token, then answers 503 (a provider
// timeout) and rolls back; the retry with the same token and key runs and
// answers 201 (one payment row); a third copy is a replay; another key with
// the same, now used, token is refused as already submitted (409). Then
// the crash between consume and commit: the attempt's connection is
// terminated after the token was consumed (nothing released): the retry
// with the same key still pays, once, and another key is refused. For the
// Redis tokens (ConsumeFor/Release) and the Postgres ones (consumed in the
// request's transaction) alike.
func TestSubmitTokenWithKeyS25(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"redis", "postgres"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, func(c *pgstore.Config) { c.MaxAttempts = 3 })
			b := s25Backends(t, e)[name]
			tbl := e.table("payments25_" + name)
			e.exec(`create table ` + tbl + ` (id bigint generated always as identity primary key, ref text not null)`)
			var calls atomic.Int64
			var failFirst, crashFirst atomic.Bool
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				token := r.PostFormValue("submit_token")
				switch err := b.consume(r, token); {
				case errors.Is(err, submittoken.ErrTokenUsed):
					http.Error(w, "this form was already submitted", http.StatusConflict)
					return
				case err != nil:
					http.Error(w, err.Error(), http.StatusServiceUnavailable)
					return
				}
				tx := httpidem.FromContext(r.Context())
				if _, err := tx.Exec(r.Context(), `insert into `+tbl+` (ref) values ($1)`, r.PostFormValue("ref")); err != nil {
					http.Error(w, err.Error(), http.StatusServiceUnavailable)
					return
				}
				if crashFirst.CompareAndSwap(true, false) {
					// The process dies between consume and commit: its
					// connection goes, the transaction rolls back, nothing is
					// released.
					_, _ = tx.Exec(r.Context(), `select pg_terminate_backend(pg_backend_pid())`)
					http.Error(w, "crashed", http.StatusServiceUnavailable)
					return
				}
				if failFirst.CompareAndSwap(true, false) {
					b.release(r, token)
					http.Error(w, "provider timeout", http.StatusServiceUnavailable)
					return
				}
				w.Header().Set(httpidem.ResourceIDHeader, "pay_"+r.PostFormValue("ref"))
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, "paid "+r.PostFormValue("ref")) //nolint:gosec // a test server's plain-text answer
			})
			// InFlightWait: the retry after the crash waits for the killed
			// backend to release the key's lock instead of a 409 in flight.
			mw, err := httpidem.New(httpidem.Config{Store: e.store, Fingerprinter: testFingerprinter(t), Principal: httpidem.Header("X-User"),
				InFlightWait: 20 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			mux := http.NewServeMux()
			mux.Handle("POST /checkout", mw.Handler(handler))
			srv := httptest.NewServer(mux)
			t.Cleanup(srv.Close)
			post := func(key, token, ref string) (int, string, bool) {
				t.Helper()
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/checkout", strings.NewReader(url.Values{"submit_token": {token}, "ref": {ref}}.Encode()))
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				req.Header.Set("X-User", "alice")
				req.Header.Set("Idempotency-Key", key)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = resp.Body.Close() }()
				body, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(body), resp.Header.Get(httpidem.ReplayHeader) == "true"
			}
			expect := func(step string, gotStatus int, body string, replayed bool, wantStatus int, wantReplay bool) {
				t.Helper()
				if gotStatus != wantStatus || replayed != wantReplay {
					t.Fatalf("%s: %d (replayed %v) %q; want %d (replayed %v)", step, gotStatus, replayed, body, wantStatus, wantReplay)
				}
			}

			tok := b.issue()
			failFirst.Store(true)
			st, body, rp := post("ck-25", tok, "r25")
			expect("first attempt (provider timeout)", st, body, rp, http.StatusServiceUnavailable, false)
			st, body, rp = post("ck-25", tok, "r25")
			expect("retry, same key and token", st, body, rp, http.StatusCreated, false)
			st, body, rp = post("ck-25", tok, "r25")
			expect("third copy", st, body, rp, http.StatusCreated, true)
			st, body, rp = post("ck-25-other", tok, "r25")
			expect("another key, the used token", st, body, rp, http.StatusConflict, false)
			if !strings.Contains(body, "already submitted") {
				t.Fatalf("another key: %q; want already submitted", body)
			}
			if n := e.count(`select count(*) from ` + tbl + ` where ref = 'r25'`); n != 1 || calls.Load() != 3 {
				t.Fatalf("%d payment rows, %d handler calls; want 1 row, 3 calls (the replay runs nothing)", n, calls.Load())
			}

			tok = b.issue()
			crashFirst.Store(true)
			st, body, rp = post("ck-25c", tok, "r25c")
			expect("attempt that crashed after consume", st, body, rp, http.StatusServiceUnavailable, false)
			st, body, rp = post("ck-25c", tok, "r25c")
			expect("retry after the crash", st, body, rp, http.StatusCreated, false)
			st, body, rp = post("ck-25c-other", tok, "r25c")
			expect("another key after the crash", st, body, rp, http.StatusConflict, false)
			if n := e.count(`select count(*) from ` + tbl + ` where ref = 'r25c'`); n != 1 {
				t.Fatalf("%d payment rows after the crash and retry; want 1", n)
			}
		})
	}
}

// ConsumeFor holds a token for its owner: the same owner gets nil again,
// another owner and Consume get ErrTokenUsed; Release by another owner
// changes nothing, by the owner makes the token unused (keeping a TTL),
// and then another owner may consume it.
func TestSubmitTokenConsumeForRelease(t *testing.T) {
	t.Parallel()
	s, rdb := tokenStore(t, "", nil)
	ctx := context.Background()
	tok, err := s.Issue(ctx, "checkout")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := s.ConsumeFor(ctx, "checkout", tok, "key-a"); err != nil {
			t.Fatalf("owner a, call %d: %v, want nil", i+1, err)
		}
	}
	if err := s.ConsumeFor(ctx, "checkout", tok, "key-b"); !errors.Is(err, submittoken.ErrTokenUsed) {
		t.Fatalf("owner b: %v, want ErrTokenUsed", err)
	}
	if err := s.Consume(ctx, "checkout", tok); !errors.Is(err, submittoken.ErrTokenUsed) {
		t.Fatalf("Consume of a token owner a holds: %v, want ErrTokenUsed", err)
	}
	if ok, err := s.Release(ctx, "checkout", tok, "key-b"); ok || err != nil {
		t.Fatalf("Release by owner b: %v, %v; want false (a holds it)", ok, err)
	}
	if ok, err := s.Release(ctx, "checkout", tok, "key-a"); !ok || err != nil {
		t.Fatalf("Release by owner a: %v, %v; want true", ok, err)
	}
	if ok, err := s.Release(ctx, "checkout", tok, "key-a"); ok || err != nil {
		t.Fatalf("Release of an unused token: %v, %v; want false", ok, err)
	}
	if ttl, err := rdb.PTTL(ctx, s.Config().Prefix+":submit:checkout:"+tok).Result(); err != nil || ttl <= 0 {
		t.Fatalf("the released token's key TTL = %s, %v; want it kept", ttl, err)
	}
	if err := s.ConsumeFor(ctx, "checkout", tok, "key-b"); err != nil {
		t.Fatalf("owner b after the release: %v, want nil", err)
	}
	if err := s.ConsumeFor(ctx, "checkout", tok, "key-a"); !errors.Is(err, submittoken.ErrTokenUsed) {
		t.Fatalf("owner a after b took it: %v, want ErrTokenUsed", err)
	}
	if st := s.Stats(); st.Consumed != 3 || st.Reused != 3 || st.Released != 1 {
		t.Fatalf("stats = %+v; want 3 consumed, 3 reused, 1 released", st)
	}
}

// PGStore: a token consumed in a transaction that rolls back is unused
// again; two transactions consuming one token at once serialize on its
// row (the second waits, proven by pg_stat_activity, then finds it used
// when the first commits, or consumes it when the first rolls back);
// other scopes, forged and expired tokens are unknown; a used token past
// its expiry is still used; Purge deletes rows expired more than UsedTTL
// ago, and only those.
func TestSubmitTokenPostgres(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := e.ctx
	s, err := submittoken.NewPG(submittoken.PGConfig{Table: pgx.Identifier{e.schema, "submit_tokens"}})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // idempotent
		if err := s.CreateTable(ctx, e.pool); err != nil {
			t.Fatal(err)
		}
	}
	issue := func() string {
		tok, err := s.Issue(ctx, e.pool, "checkout")
		if err != nil || !tokenPattern.MatchString(tok) {
			t.Fatalf("issue: %q, %v", tok, err)
		}
		return tok
	}
	begin := func() pgx.Tx {
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return tx
	}

	tok := issue()
	tx := begin()
	if err := s.Consume(ctx, tx, "checkout", tok); err != nil {
		t.Fatalf("consume in a transaction: %v", err)
	}
	_ = tx.Rollback(ctx)
	if err := s.Consume(ctx, e.pool, "checkout:other", tok); !errors.Is(err, submittoken.ErrTokenUnknown) {
		t.Fatalf("another scope: %v, want ErrTokenUnknown", err)
	}
	if err := s.Consume(ctx, e.pool, "checkout", strings.Repeat("A", 43)); !errors.Is(err, submittoken.ErrTokenUnknown) {
		t.Fatalf("forged: %v, want ErrTokenUnknown", err)
	}

	// Two at once, the first commits; then two at once, the first rolls back.
	for _, commitFirst := range []bool{true, false} {
		tok := tok
		if !commitFirst {
			tok = issue()
		}
		first := begin()
		if err := s.Consume(ctx, first, "checkout", tok); err != nil {
			t.Fatalf("first (rolled back before: unused again): %v", err)
		}
		var pid uint32
		second := begin()
		if err := second.QueryRow(ctx, `select pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- s.Consume(ctx, second, "checkout", tok) }()
		eventually(t, 30*time.Second, "the second consume to wait for the first's row lock", func() bool {
			return e.count(`select count(*) from pg_stat_activity where pid = $1 and wait_event_type = 'Lock'`, pid) == 1
		})
		var want error
		if commitFirst {
			if err := first.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			want = submittoken.ErrTokenUsed
		} else {
			_ = first.Rollback(ctx)
		}
		select {
		case err := <-done:
			if !errors.Is(err, want) {
				t.Fatalf("second consume (first committed: %v) = %v, want %v", commitFirst, err, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the second consume did not return after the first ended")
		}
		if err := second.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.Consume(ctx, e.pool, "checkout", tok); !errors.Is(err, submittoken.ErrTokenUsed) {
			t.Fatalf("after a committed consume: %v, want ErrTokenUsed", err)
		}
	}

	// Expiry and purge, moved in database time.
	unused := issue()
	tbl := pgx.Identifier{e.schema, "submit_tokens"}.Sanitize()
	e.exec(`update ` + tbl + ` set expires_at = now() - interval '1 second'`)
	if err := s.Consume(ctx, e.pool, "checkout", unused); !errors.Is(err, submittoken.ErrTokenUnknown) {
		t.Fatalf("expired: %v, want ErrTokenUnknown", err)
	}
	if err := s.Consume(ctx, e.pool, "checkout", tok); !errors.Is(err, submittoken.ErrTokenUsed) {
		t.Fatalf("used, then expired: %v, want ErrTokenUsed", err)
	}
	if n, err := s.Purge(ctx, e.pool, 100); err != nil || n != 0 {
		t.Fatalf("purge within UsedTTL of the expiry: %d, %v; want 0", n, err)
	}
	e.exec(`update `+tbl+` set expires_at = now() - interval '11 minutes' where token_hash <> sha256(convert_to($1, 'UTF8'))`, unused)
	fresh := issue()
	if n, err := s.Purge(ctx, e.pool, 1); err != nil || n != 1 {
		t.Fatalf("purge, limit 1: %d, %v; want 1", n, err)
	}
	if n, err := s.Purge(ctx, e.pool, 100); err != nil || n != 1 {
		t.Fatalf("purge: %d, %v; want the other expired row", n, err)
	}
	if n := e.count(`select count(*) from ` + tbl); n != 2 {
		t.Fatalf("%d rows after the purge; want 2 (the fresh token, the one expired 1s ago)", n)
	}
	if err := s.Consume(ctx, e.pool, "checkout", fresh); err != nil {
		t.Fatalf("fresh token after the purge: %v", err)
	}
}
