package integration

import (
	"encoding/json"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/dedup/redisfast"
	"github.com/idemq/idemq/outbox"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.yaml.in/yaml/v3"
)

// collectorMetrics returns the metric names idemq's collectors describe
// (consumer metrics, store, fast path, outbox, relay, Kafka source lag), histograms with
// their _bucket, _sum and _count series.
func collectorMetrics(t *testing.T) map[string]bool {
	t.Helper()
	o := setupOutbox(t)
	reg := prometheus.NewRegistry()
	if _, err := consumer.NewPrometheusMetrics(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := pgstore.NewMaintenanceMetrics(reg); err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(redisfast.ClientOptions("127.0.0.1:1"))
	t.Cleanup(func() { _ = client.Close() })
	fast, err := redisfast.New(redisfast.Config{Client: client})
	if err != nil {
		t.Fatal(err)
	}
	r, err := outbox.NewRelay(o.ob, obKafkaPub(t), outbox.RelayConfig{})
	if err != nil {
		t.Fatal(err)
	}
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{Reader: readerConfig(t, "deploy-test", "deploy-test")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	reg.MustRegister(consumer.StoreCollector(o.store), fast.Collector(), o.ob.Collector(0), r.Collector(), src.Collector())
	names := map[string]bool{}
	fq := regexp.MustCompile(`fqName: "([a-z_:]+)"`)
	for _, c := range []prometheus.Collector{consumer.StoreCollector(o.store), fast.Collector(), o.ob.Collector(0), r.Collector(), src.Collector()} {
		ch := make(chan *prometheus.Desc, 16)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			names[fq.FindStringSubmatch(d.String())[1]] = true
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, h := range []string{"idemq_delivery_duration_seconds", "idemq_maintenance_pass_duration_seconds"} {
		names[h], names[h+"_bucket"], names[h+"_sum"], names[h+"_count"] = true, true, true, true
	}
	// Vec metrics with no series yet are not gathered: take them from the
	// descriptions NewPrometheusMetrics registered.
	for _, n := range []string{"idemq_deliveries_total", "idemq_dead_lettered_total", "idemq_maintenance_purged_rows_total"} {
		if !names[n] {
			names[n] = describedBy(t, reg, n)
		}
	}
	return names
}

// describedBy reports whether registering a collector describing name in
// reg conflicts, i.e. reg already holds it.
func describedBy(t *testing.T, reg *prometheus.Registry, name string) bool {
	t.Helper()
	err := reg.Register(prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: "probe"}))
	return err != nil
}

var metricRef = regexp.MustCompile(`\bidemq_[a-z_]+\b`)

// The Grafana dashboard and the Prometheus alert rules under deploy/ parse,
// every expression refers only to metrics that idemq's collectors export,
// and the alerts cover dead letters, lag, parked rows, fast-path errors and
// purging.
func TestDeployDashboardAndAlertsUseRealMetrics(t *testing.T) {
	t.Parallel()
	known := collectorMetrics(t)

	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	b, err := os.ReadFile("../deploy/prometheus/idemq-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	var exprs []string
	alerts := map[string]string{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Expr == "" {
				t.Errorf("rule %+v: alert and expr required", r)
			}
			alerts[r.Alert] = r.Expr
			exprs = append(exprs, r.Expr)
		}
	}
	for _, want := range []string{"idemq_dead_lettered_total", "idemq_outbox_lag_seconds", `idemq_outbox_rows{state="parked"}`,
		`idemq_fastpath_total{result="error"}`, "idemq_relay_purged_total"} {
		found := false
		for _, e := range alerts {
			found = found || strings.Contains(e, want)
		}
		if !found {
			t.Errorf("no alert uses %s", want)
		}
	}

	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Query any `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	b, err = os.ReadFile("../deploy/grafana/idemq-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	if len(dash.Panels) == 0 {
		t.Fatal("dashboard has no panels")
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(string); ok {
			exprs = append(exprs, q)
		}
	}

	var unknown []string
	for _, e := range exprs {
		for _, m := range metricRef.FindAllString(e, -1) {
			if !known[m] {
				unknown = append(unknown, m)
			}
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		t.Fatalf("deploy/ refers to metrics no collector exports: %v", unknown)
	}
}
