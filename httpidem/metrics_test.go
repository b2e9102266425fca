package httpidem

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The Prometheus series count replays, conflicts and in-flight 409s as
// they happen, with const labels, through a registry: one executed, one
// replayed, one conflict (another body), one in-flight copy answered 409
// while the first ran, then that key's copy replayed.
func TestMetricsCountReplaysConflictsInFlight(t *testing.T) {
	metrics := NewMetrics(prometheus.Labels{"api": "payments"})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics)
	e := newEnv(t, func(c *Config) { c.Metrics = metrics })
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	e.before = func(r *http.Request, _ int) int {
		if r.Header.Get(KeyHeader) == "K2" {
			started <- struct{}{}
			select {
			case <-release:
			case <-time.After(time.Minute):
			}
		}
		return 0
	}
	body := `{"amount":"30.00"}`
	mustEqual(t, "new key", e.post("/payments", "alice", "K1", body).status, http.StatusCreated)
	if r := e.post("/payments", "alice", "K1", body); r.status != http.StatusCreated || !r.replayed() {
		t.Fatalf("retry: %d replayed=%v", r.status, r.replayed())
	}
	mustEqual(t, "other body", e.post("/payments", "alice", "K1", `{"amount":"31.00"}`).status, http.StatusUnprocessableEntity)
	first := make(chan resp, 1)
	go func() { first <- e.post("/payments", "alice", "K2", body) }()
	<-started
	if r := e.post("/payments", "alice", "K2", body); r.status != http.StatusConflict || r.problem(t).Type != TypeInFlight {
		t.Fatalf("copy in flight: %d %s", r.status, r.body)
	}
	close(release)
	mustEqual(t, "first K2", (<-first).status, http.StatusCreated)

	want := `
# HELP idemq_http_requests_total Requests that required an Idempotency-Key, by what the middleware did: executed, replayed, conflict, in_flight (409), too_many_unfinished (429), failed (retryable), exhausted, rejected (400/401/413), unavailable (503).
# TYPE idemq_http_requests_total counter
idemq_http_requests_total{api="payments",outcome="conflict"} 1
idemq_http_requests_total{api="payments",outcome="executed"} 2
idemq_http_requests_total{api="payments",outcome="exhausted"} 0
idemq_http_requests_total{api="payments",outcome="failed"} 0
idemq_http_requests_total{api="payments",outcome="in_flight"} 1
idemq_http_requests_total{api="payments",outcome="rejected"} 0
idemq_http_requests_total{api="payments",outcome="replayed"} 1
idemq_http_requests_total{api="payments",outcome="too_many_unfinished"} 0
idemq_http_requests_total{api="payments",outcome="unavailable"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idemq_http_requests_total"); err != nil {
		t.Fatal(err)
	}
}
