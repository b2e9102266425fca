package integration

// The services' versions are named once, in internal/versions. These tests
// need no service, no Docker and no environment variable: they read
// docker-compose.yml (with compose-go, the loader of docker compose, so an
// invalid file fails as `docker compose config` would), scripts/services.sh,
// the README and examples/Dockerfile, and fail where one disagrees with the
// constants or with the testcontainers setup of setup_test.go.

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	composecli "github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/idemq/idemq/internal/versions"
)

const (
	repoRoot    = ".."
	composeFile = "../docker-compose.yml"
	demoService = "demo"
)

// composeImages is the image of each service of docker-compose.yml; the demo
// service is built (examples/Dockerfile) instead.
var composeImages = map[string]string{
	"postgres":         versions.PostgresImage,
	"redis":            versions.RedisImage,
	"kafka":            versions.KafkaImage,
	"rocketmq-namesrv": versions.RocketMQImage,
	"rocketmq-broker":  versions.RocketMQImage,
}

// loadCompose loads docker-compose.yml as `docker compose --profile ...
// config` does: schema validation, interpolation (from no environment: the
// file must not depend on one), normalization and the consistency checks
// (depends_on, network_mode: service:...). "*" enables every profile.
func loadCompose(t *testing.T, profiles ...string) *types.Project {
	t.Helper()
	opts, err := composecli.NewProjectOptions([]string{composeFile},
		composecli.WithWorkingDirectory(repoRoot), composecli.WithProfiles(profiles))
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("docker-compose.yml with profiles %q does not validate: %v", profiles, err)
	}
	return p
}

func TestComposeValidatesForEveryProfile(t *testing.T) {
	all := loadCompose(t, "*")
	profiles := map[string]bool{}
	for _, s := range all.Services {
		for _, p := range s.Profiles {
			profiles[p] = true
		}
	}
	if !profiles[demoService] {
		t.Errorf("no service has the profile %q (profiles: %v)", demoService, profiles)
	}
	// Without a profile: the services only, which `docker compose up -d --wait` starts.
	def := loadCompose(t)
	var names []string
	for n := range def.Services {
		names = append(names, n)
	}
	sort.Strings(names)
	var want []string
	for n := range composeImages {
		want = append(want, n)
	}
	sort.Strings(want)
	if !slices.Equal(names, want) {
		t.Errorf("services without a profile = %v, want %v", names, want)
	}
	for p := range profiles {
		proj := loadCompose(t, p)
		for _, s := range proj.Services {
			for dep := range s.DependsOn {
				if _, ok := proj.Services[dep]; !ok {
					t.Errorf("profile %s: service %s depends on %s, which the profile does not enable", p, s.Name, dep)
				}
			}
		}
	}
}

func TestComposeImagesAreTheVersions(t *testing.T) {
	p := loadCompose(t, "*")
	for name, want := range composeImages {
		s, ok := p.Services[name]
		if !ok {
			t.Errorf("docker-compose.yml has no service %s", name)
			continue
		}
		if s.Image != want {
			t.Errorf("service %s runs image %q; internal/versions says %q", name, s.Image, want)
		}
	}
	for name, s := range p.Services {
		if _, ok := composeImages[name]; ok {
			continue
		}
		if name != demoService || s.Build == nil {
			t.Errorf("service %s (image %q) is not one of the known services %v", name, s.Image, composeImages)
		}
	}
}

// Every server has a healthcheck making a request of its own protocol; the
// demo job declares its healthcheck disabled. The RocketMQ broker's is the
// check the testcontainers setup waits for (rocketmqClusterListed), with the
// address the NameServer hands clients.
func TestComposeHealthchecks(t *testing.T) {
	p := loadCompose(t, "*")
	probes := map[string][]string{
		"postgres":         {"psql ", "select 1"},
		"redis":            {"redis-cli", "ping", "PONG"},
		"kafka":            {"/opt/kafka/bin/kafka-broker-api-versions.sh", "--bootstrap-server"},
		"rocketmq-namesrv": {"sh " + versions.RocketMQHome + "/bin/mqadmin clusterList", "#Cluster Name"},
		"rocketmq-broker":  {rocketmqClusterListed("rocketmq-namesrv:9876", "127.0.0.1:10911")},
	}
	for name, s := range p.Services {
		hc := s.HealthCheck
		if name == demoService {
			// A job: it runs the demos and exits; nothing waits for its health.
			if hc == nil || !hc.Disable {
				t.Errorf("service %s: want its healthcheck declared disabled (a job), got %+v", name, hc)
			}
			continue
		}
		if hc == nil || hc.Disable || len(hc.Test) < 2 || (hc.Test[0] != "CMD" && hc.Test[0] != "CMD-SHELL") {
			t.Errorf("service %s has no healthcheck command: %+v", name, hc)
			continue
		}
		cmd := strings.Join(hc.Test[1:], " ")
		want, ok := probes[name]
		if !ok {
			t.Errorf("service %s: no expected healthcheck known to this test", name)
		}
		for _, w := range want {
			if !strings.Contains(cmd, w) {
				t.Errorf("service %s: healthcheck %q does not contain %q", name, cmd, w)
			}
		}
	}
}

func TestComposeDemoService(t *testing.T) {
	p := loadCompose(t, demoService)
	d, ok := p.Services[demoService]
	if !ok {
		t.Fatalf("docker-compose.yml has no %s service with --profile %s", demoService, demoService)
	}
	if !slices.Equal(d.Profiles, []string{demoService}) {
		t.Errorf("demo profiles = %v, want [%s] (plain `docker compose up` must not run it)", d.Profiles, demoService)
	}
	for name := range composeImages {
		dep, ok := d.DependsOn[name]
		if !ok || dep.Condition != types.ServiceConditionHealthy {
			t.Errorf("demo depends on %s with %+v, want condition %s", name, dep, types.ServiceConditionHealthy)
		}
	}
	// RocketMQ advertises one address (brokerIP1:listenPort = 127.0.0.1:10911),
	// reachable from a container only in the broker's network namespace.
	if d.NetworkMode != "service:rocketmq-broker" {
		t.Errorf("demo network_mode = %q, want service:rocketmq-broker", d.NetworkMode)
	}
	env := func(k string) string {
		if v := d.Environment[k]; v != nil {
			return *v
		}
		return ""
	}
	if got := env("TEST_ROCKETMQ_BROKER"); got != "127.0.0.1:10911" {
		t.Errorf("demo TEST_ROCKETMQ_BROKER = %q, want 127.0.0.1:10911", got)
	}
	if got := env("TEST_ROCKETMQ_NAMESRV"); got != "rocketmq-namesrv:9876" {
		t.Errorf("demo TEST_ROCKETMQ_NAMESRV = %q, want rocketmq-namesrv:9876", got)
	}
	if got := env("TEST_POSTGRES_DSN"); !strings.Contains(got, "@postgres:5432/") {
		t.Errorf("demo TEST_POSTGRES_DSN = %q, want the postgres service", got)
	}
	kafka := p.Services["kafka"].Environment["KAFKA_ADVERTISED_LISTENERS"]
	if b := env("TEST_KAFKA_BROKERS"); b == "" || kafka == nil || !strings.Contains(*kafka, "://"+b) {
		t.Errorf("demo TEST_KAFKA_BROKERS = %q is not an advertised Kafka listener (%v)", b, kafka)
	}

	// The image: examples/Dockerfile, on the Go of go.mod, building the demos.
	if d.Build == nil {
		t.Fatal("the demo service has no build section")
	}
	if ctx, err := filepath.Abs(repoRoot); err != nil || filepath.Clean(d.Build.Context) != ctx {
		t.Errorf("demo build context = %q, want the repository root %q (%v)", d.Build.Context, ctx, err)
	}
	df, err := os.ReadFile(filepath.Join(d.Build.Context, d.Build.Dockerfile))
	if err != nil {
		t.Fatalf("demo Dockerfile: %v", err)
	}
	gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	if from := "FROM golang:" + string(m[1]) + " "; !strings.Contains(string(df), from) {
		t.Errorf("%s does not build on %q (go.mod says go %s)", d.Build.Dockerfile, strings.TrimSpace(from), m[1])
	}
	for _, pkg := range []string{"payments", "rocketmq-orders", "order-pipeline", "http-payments"} {
		if !strings.Contains(string(df), "./examples/"+pkg) {
			t.Errorf("%s does not build ./examples/%s", d.Build.Dockerfile, pkg)
		}
		if _, err := os.Stat(filepath.Join(repoRoot, "examples", pkg, "main.go")); err != nil {
			t.Errorf("demo %s: %v", pkg, err)
		}
	}
}

// The testcontainers Kafka runs with compose's settings (listeners aside).
func TestComposeKafkaSettings(t *testing.T) {
	env := loadCompose(t).Services["kafka"].Environment
	for k, want := range kafkaSettings {
		if v := env[k]; v == nil || *v != want {
			t.Errorf("docker-compose.yml kafka %s = %v, setup_test.go has %q", k, v, want)
		}
	}
}

// The testcontainers RocketMQ broker runs with compose's settings (its
// address aside).
func TestComposeRocketMQBrokerSettings(t *testing.T) {
	s := loadCompose(t).Services["rocketmq-broker"]
	lines := map[string]bool{}
	for _, part := range s.Command {
		for _, l := range strings.Split(part, "\n") {
			lines[strings.TrimSpace(l)] = true
		}
	}
	for _, want := range append(slices.Clone(rocketmqBrokerSettings), "brokerIP1=127.0.0.1", "listenPort=10911") {
		if !lines[want] {
			t.Errorf("docker-compose.yml rocketmq-broker config has no line %q", want)
		}
	}
}

func TestVersionsServicesScript(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "scripts", "services.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"KAFKA_VERSION": versions.Kafka, "ROCKETMQ_VERSION": versions.RocketMQ} {
		m := regexp.MustCompile(`(?m)^` + name + `=([^\s#]+)`).FindSubmatch(b)
		if m == nil {
			t.Errorf("scripts/services.sh sets no %s", name)
			continue
		}
		if got := strings.Trim(string(m[1]), `"'`); got != want {
			t.Errorf("scripts/services.sh %s=%s; internal/versions says %s", name, got, want)
		}
	}
}

// The README names the Kafka and RocketMQ versions (in its tables or its
// text): some line names each product with the version of internal/versions.
func TestVersionsReadme(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for product, v := range map[string]string{"Kafka": versions.Kafka, "RocketMQ": versions.RocketMQ} {
		found := false
		for l := range strings.SplitSeq(string(b), "\n") {
			if strings.Contains(l, product) && strings.Contains(l, v) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("README.md has no line naming %s %s", product, v)
		}
	}
}

// No test file names an image itself: the testcontainers setup takes them
// from internal/versions.
func TestVersionsNoImageLiterals(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	image := regexp.MustCompile(`"((?:postgres|redis|apache/kafka|apache/rocketmq|confluentinc/[\w.-]+|bitnami/[\w.-]+):[\w.-]+)"`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range image.FindAllSubmatch(b, -1) {
			t.Errorf("%s names the image %s: use the constants of internal/versions", f, m[1])
		}
	}
}
