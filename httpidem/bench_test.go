package httpidem

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// BenchmarkHTTPIdem measures, in one run and on one handler (insert a
// payment row, answer 201 with a small JSON body), what the middleware adds
// per request against the same handler without it (which begins and
// commits its own transaction): for a new key (claim, cap check, stored
// response, all in the handler's transaction) and for a replay (a claim
// that finds the record, and the stored response read). The three kinds
// alternate request by request, so load on the machine affects them alike;
// requests go straight to the handler (no network).
//
//	go test -run '^$' -bench BenchmarkHTTPIdem ./httpidem/
func BenchmarkHTTPIdem(b *testing.B) {
	e := newEnv(b, nil)
	var seq int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tx := FromContext(ctx)
		own := tx == nil
		if own {
			var err error
			if tx, err = dbPool.BeginTx(ctx, pgx.TxOptions{}); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		}
		seq++
		id := "pay_" + strconv.FormatInt(seq, 10)
		if _, err := tx.Exec(ctx, `insert into `+e.biz+`.payments (id, amount) values ($1, '30.00')`, id); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if own {
			if err := tx.Commit(ctx); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"` + id + `","amount":"30.00","currency":"EUR"}`))
	})
	plain := http.NewServeMux()
	plain.Handle("POST /payments", handler)
	wrapped := http.NewServeMux()
	wrapped.Handle("POST /payments", e.mw.Handler(handler))
	body := `{"amount":"30.00","currency":"EUR","ref":"inv-1"}`
	serve := func(mux *http.ServeMux, key string, want int) time.Duration {
		r := httptest.NewRequestWithContext(e.ctx, http.MethodPost, "/payments", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-User", "bench")
		if key != "" {
			r.Header.Set(KeyHeader, key)
		}
		w := httptest.NewRecorder()
		start := time.Now()
		mux.ServeHTTP(w, r)
		d := time.Since(start)
		if w.Code != want {
			b.Fatalf("key %q: %d %s", key, w.Code, w.Body)
		}
		return d
	}
	run := randomHex(4)
	var tPlain, tNew, tReplay time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		key := run + "-" + strconv.Itoa(i)
		tPlain += serve(plain, "", http.StatusCreated)
		tNew += serve(wrapped, key, http.StatusCreated)
		tReplay += serve(wrapped, key, http.StatusCreated)
	}
	n := float64(b.N)
	us := func(d time.Duration) float64 { return float64(d.Microseconds()) / n }
	b.ReportMetric(us(tPlain), "plain-µs/req")
	b.ReportMetric(us(tNew), "newkey-µs/req")
	b.ReportMetric(us(tReplay), "replay-µs/req")
	b.ReportMetric(us(tNew-tPlain), "added-newkey-µs/req")
	b.ReportMetric(us(tReplay-tPlain), "added-replay-µs/req")
}
