package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/internal/versions"
	"github.com/idemq/idemq/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/moby/moby/api/types/container"
	dockernet "github.com/moby/moby/api/types/network"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"
	"github.com/testcontainers/testcontainers-go/network"
	"github.com/testcontainers/testcontainers-go/wait"
)

const startHint = "start the services with `make services-up` and export them with `eval \"$(scripts/services.sh env)\"`"

// servicesRequired is true in CI: a missing service is then a failure, never
// a skip.
func servicesRequired() bool {
	return os.Getenv("CI") == "true" || os.Getenv("TEST_REQUIRE_BROKERS") != ""
}

var (
	dockerOnce sync.Once
	dockerOK   bool
)

func dockerAvailable() bool {
	dockerOnce.Do(func() {
		p, err := testcontainers.NewDockerProvider()
		if err != nil {
			return
		}
		defer p.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		dockerOK = p.Health(ctx) == nil
	})
	return dockerOK
}

// TestMain terminates the containers that the tests started (see service):
// they are shared by the package's tests, so they live until m.Run returns.
// Run with crashChildEnv set, the test binary is instead a child consumer
// process of the S17 tests (crashloop_process_test.go).
func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		os.Exit(crashChildMain())
	}
	code := m.Run()
	if err := started.terminate(); err != nil {
		fmt.Fprintln(os.Stderr, "integration: terminating the test containers:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// started holds what the container fallback started, in start order:
// containers and networks, each with its termination.
var started cleanups

type cleanups struct {
	mu    sync.Mutex
	stops []func(context.Context) error
}

// add registers the termination of a container (nil is ignored, as are
// containers a failed Run did not create).
func (c *cleanups) add(ctr testcontainers.Container) {
	c.addFunc(func(context.Context) error { return testcontainers.TerminateContainer(ctr) })
}

func (c *cleanups) addFunc(stop func(context.Context) error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stops = append(c.stops, stop)
}

// terminate stops everything in reverse start order (containers before the
// network they are attached to).
func (c *cleanups) terminate() error {
	c.mu.Lock()
	stops := c.stops
	c.stops = nil
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var errs []error
	for i := len(stops) - 1; i >= 0; i-- {
		errs = append(errs, stops[i](ctx))
	}
	return errors.Join(errs...)
}

// service is one service of the tests. Its address comes from the
// environment variable env (what `scripts/services.sh env` exports); without
// it, a test fails under CI=true (or TEST_REQUIRE_BROKERS=1), otherwise the
// service is started with testcontainers-go when a Docker engine answers
// (once per test process, shared by the tests, terminated by TestMain), from
// the images of internal/versions (the images of docker-compose.yml),
// otherwise the test is skipped.
type service struct {
	env, name string
	start     func(ctx context.Context) (string, error)

	once sync.Once
	addr string
	err  error
}

func (s *service) endpoint(t testing.TB) string {
	t.Helper()
	if v := os.Getenv(s.env); v != "" {
		return v
	}
	if servicesRequired() {
		t.Fatalf("%s is not set and CI=true: %s is required; %s", s.env, s.name, startHint)
	}
	if !dockerAvailable() {
		t.Skipf("%s is not set and no Docker engine answers: %s", s.env, startHint)
	}
	s.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		s.addr, s.err = s.start(ctx)
		if s.err == nil && s.addr == "" {
			s.err = errors.New("no address")
		}
	})
	if s.err != nil {
		t.Fatalf("start %s with testcontainers (%s is not set): %v", s.name, s.env, s.err)
	}
	return s.addr
}

var (
	postgresService = &service{env: "TEST_POSTGRES_DSN", name: "PostgreSQL", start: startPostgres}
	redisService    = &service{env: "TEST_REDIS_ADDR", name: "Redis", start: startRedis}
	kafkaService    = &service{env: "TEST_KAFKA_BROKERS", name: "Kafka", start: startKafka}
	rocketmqService = &service{env: "TEST_ROCKETMQ_NAMESRV", name: "RocketMQ", start: startRocketMQ}
)

func postgresDSN(t testing.TB) string { return postgresService.endpoint(t) }

func kafkaBrokers(t testing.TB) []string {
	return strings.Split(kafkaService.endpoint(t), ",")
}

func redisAddress(t testing.TB) string { return redisService.endpoint(t) }

// rocketmqNamesrv returns the NameServer address(es), comma separated. When
// it starts RocketMQ in containers it also sets TEST_ROCKETMQ_BROKER (read by
// the RocketMQ tests and inherited by the processes they start) to the
// broker's address.
func rocketmqNamesrv(t testing.TB) string { return rocketmqService.endpoint(t) }

// ---------------------------------------------------------------------------
// The container fallback: the images and settings of docker-compose.yml.

func startPostgres(ctx context.Context) (string, error) {
	ctr, err := tcpostgres.Run(ctx, versions.PostgresImage, tcpostgres.WithDatabase("idemq"),
		tcpostgres.WithUsername("idemq"), tcpostgres.WithPassword("idemq"), tcpostgres.BasicWaitStrategies(),
		testcontainers.WithCmdArgs("-c", "max_connections=300"))
	started.add(ctr)
	if err != nil {
		return "", err
	}
	return ctr.ConnectionString(ctx, "sslmode=disable")
}

func startRedis(ctx context.Context) (string, error) {
	ctr, err := tcredis.Run(ctx, versions.RedisImage)
	started.add(ctr)
	if err != nil {
		return "", err
	}
	s, err := ctr.ConnectionString(ctx)
	return strings.TrimPrefix(s, "redis://"), err
}

// kafkaSettings are docker-compose.yml's Kafka settings besides the
// listeners (TestComposeKafkaSettings compares them).
var kafkaSettings = map[string]string{
	"CLUSTER_ID":                                             "5L6g3nShT-eMCtK--X86sw",
	"KAFKA_NODE_ID":                                          "1",
	"KAFKA_PROCESS_ROLES":                                    "broker,controller",
	"KAFKA_CONTROLLER_QUORUM_VOTERS":                         "1@localhost:9093",
	"KAFKA_CONTROLLER_LISTENER_NAMES":                        "CONTROLLER",
	"KAFKA_LOG_DIRS":                                         "/var/lib/kafka/data",
	"KAFKA_NUM_PARTITIONS":                                   "3",
	"KAFKA_AUTO_CREATE_TOPICS_ENABLE":                        "true",
	"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR":                 "1",
	"KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS":                     "1",
	"KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR":         "1",
	"KAFKA_TRANSACTION_STATE_LOG_MIN_ISR":                    "1",
	"KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
	"KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR":            "1",
	"KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS":                 "0",
	"KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS":                     "1000",
	"KAFKA_HEAP_OPTS":                                        "-Xms512m -Xmx512m",
}

// kafkaStarter is the script that starts Kafka in its container, copied in
// once the container runs: only then is the published port, which the
// broker must advertise, known.
const kafkaStarter = "/tmp/idemq-kafka-start.sh"

// startKafka runs versions.KafkaImage (KRaft, one node) with the settings of
// docker-compose.yml. The client listener (PLAINTEXT, container port 9092)
// advertises the published host:port; the broker talks to itself on BROKER.
func startKafka(ctx context.Context) (string, error) {
	env := map[string]string{
		"KAFKA_LISTENERS":                      "PLAINTEXT://:9092,BROKER://localhost:9094,CONTROLLER://localhost:9093",
		"KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,BROKER:PLAINTEXT",
		"KAFKA_INTER_BROKER_LISTENER_NAME":     "BROKER",
	}
	for k, v := range kafkaSettings {
		env[k] = v
	}
	ctr, err := testcontainers.Run(ctx, versions.KafkaImage,
		testcontainers.WithExposedPorts("9092/tcp"),
		testcontainers.WithEnv(env),
		// The image's own command, /etc/kafka/docker/run, once the starter
		// script is there.
		testcontainers.WithCmd("bash", "-c", "while [ ! -f "+kafkaStarter+" ]; do sleep 0.1; done; exec bash "+kafkaStarter),
		testcontainers.WithLifecycleHooks(testcontainers.ContainerLifecycleHooks{
			PostStarts: []testcontainers.ContainerHook{func(ctx context.Context, c testcontainers.Container) error {
				if err := wait.ForMappedPort("9092/tcp").WaitUntilReady(ctx, c); err != nil {
					return err
				}
				addr, err := c.PortEndpoint(ctx, "9092/tcp", "")
				if err != nil {
					return err
				}
				script := "export KAFKA_ADVERTISED_LISTENERS='PLAINTEXT://" + addr + ",BROKER://localhost:9094'\n" +
					"exec /etc/kafka/docker/run\n"
				return c.CopyToContainer(ctx, []byte(script), kafkaStarter, 0o755)
			}},
		}),
		testcontainers.WithWaitStrategy(wait.ForLog("Kafka Server started").WithStartupTimeout(3*time.Minute)),
	)
	started.add(ctr)
	if err != nil {
		return "", err
	}
	return ctr.PortEndpoint(ctx, "9092/tcp", "")
}

// rocketmqBrokerSettings are the broker settings of docker-compose.yml
// besides its address (TestComposeRocketMQBrokerSettings compares them).
var rocketmqBrokerSettings = []string{
	"brokerClusterName=DefaultCluster",
	"brokerName=broker-a",
	"brokerId=0",
	"brokerRole=ASYNC_MASTER",
	"flushDiskType=ASYNC_FLUSH",
	"autoCreateTopicEnable=true",
	"autoCreateSubscriptionGroup=true",
	"defaultTopicQueueNums=4",
	"mappedFileSizeCommitLog=67108864",
	"mappedFileSizeConsumeQueue=600000",
	"diskMaxUsedSpaceRatio=95",
	"messageDelayLevel=1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s",
	"registerNameServerPeriod=10000",
}

// rocketmqClusterListed is the check of docker-compose.yml's broker
// healthcheck: the NameServer lists broker-a at addr, and the broker answered
// its runtime-info request there (its version is printed). mqadmin exits 0
// even when a request fails, hence the grep.
func rocketmqClusterListed(namesrv, addr string) string {
	return "sh " + versions.RocketMQHome + "/bin/mqadmin clusterList -n " + namesrv +
		" 2>/dev/null | grep -q 'broker-a .*" + addr + " *" + versions.RocketMQVersionDesc + "'"
}

// startRocketMQ runs a NameServer and a broker of versions.RocketMQImage on a
// network of their own, with the settings of docker-compose.yml, and returns
// the NameServer's published address.
//
// The NameServer hands clients brokerIP1:listenPort, one address: it must be
// reachable from this process, so brokerIP1 is the Docker host's address and
// the broker listens on the same port number inside the container as the one
// published. That port is picked free on this machine just before the start
// (retried if Docker finds it taken): the limitation is a Docker engine on
// another machine (DOCKER_HOST=tcp://...), where a port free here may be
// taken there.
func startRocketMQ(ctx context.Context) (string, error) {
	nw, err := network.New(ctx)
	if err != nil {
		return "", fmt.Errorf("network: %w", err)
	}
	started.addFunc(nw.Remove)
	namesrv, err := testcontainers.Run(ctx, versions.RocketMQImage,
		network.WithNetwork([]string{"rocketmq-namesrv"}, nw),
		testcontainers.WithExposedPorts("9876/tcp"),
		testcontainers.WithEnv(map[string]string{"JAVA_OPT_EXT": "-Xms256m -Xmx256m -Xmn128m"}),
		testcontainers.WithCmd("sh", "mqnamesrv"),
		testcontainers.WithWaitStrategy(wait.ForLog("The Name Server boot success").WithStartupTimeout(3*time.Minute)),
	)
	started.add(namesrv)
	if err != nil {
		return "", fmt.Errorf("name server: %w", err)
	}
	nsAddr, err := namesrv.PortEndpoint(ctx, "9876/tcp", "")
	if err != nil {
		return "", err
	}
	host, err := dockerHostIP(ctx)
	if err != nil {
		return "", err
	}
	var brokerAddr string
	for try := 1; ; try++ {
		port, err := freePort()
		if err != nil {
			return "", err
		}
		brokerAddr = net.JoinHostPort(host, strconv.Itoa(port))
		err = runRocketMQBroker(ctx, nw, host, port)
		if err == nil {
			break
		}
		if try == 3 || !strings.Contains(err.Error(), "already") {
			return "", fmt.Errorf("broker: %w", err)
		}
	}
	// For rmqEndpoints and obRocketTopic, and the processes the tests start.
	if err := os.Setenv("TEST_ROCKETMQ_BROKER", brokerAddr); err != nil {
		return "", err
	}
	return nsAddr, nil
}

// runRocketMQBroker starts broker-a advertising host:port, listening on port
// inside its container, published on the same port.
func runRocketMQBroker(ctx context.Context, nw *testcontainers.DockerNetwork, host string, port int) error {
	p := strconv.Itoa(port)
	conf := strings.Join(rocketmqBrokerSettings, "\n") + "\nbrokerIP1=" + host + "\nlistenPort=" + p + "\n"
	ctr, err := testcontainers.Run(ctx, versions.RocketMQImage,
		network.WithNetwork([]string{"rocketmq-broker"}, nw),
		testcontainers.WithExposedPorts(p+"/tcp"),
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
			hc.PortBindings = dockernet.PortMap{dockernet.MustParsePort(p + "/tcp"): {{HostPort: p}}}
		}),
		testcontainers.WithEnv(map[string]string{"JAVA_OPT_EXT": "-Xms512m -Xmx512m -Xmn256m -XX:MaxDirectMemorySize=512m"}),
		testcontainers.WithCmd("sh", "-c", "cat > \"$HOME/broker.conf\" <<'EOF'\n"+conf+"EOF\n"+
			"exec sh mqbroker -n rocketmq-namesrv:9876 -c \"$HOME/broker.conf\""),
		testcontainers.WithWaitStrategy(wait.ForExec([]string{"sh", "-c", rocketmqClusterListed("rocketmq-namesrv:9876", net.JoinHostPort(host, p))}).
			WithPollInterval(2*time.Second).WithStartupTimeout(3*time.Minute)),
	)
	started.add(ctr)
	return err
}

// dockerHostIP is the address of the Docker host as this process reaches the
// published ports (testcontainers' DaemonHost, "localhost" for a local
// engine), as an IP: RocketMQ clients dial brokerIP1 as given.
func dockerHostIP(ctx context.Context) (string, error) {
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return "", err
	}
	defer p.Close()
	host, err := p.DaemonHost(ctx)
	if err != nil {
		return "", err
	}
	if net.ParseIP(host) != nil {
		return host, nil
	}
	ips, err := net.DefaultResolver.LookupIP(ctx, "ip4", host)
	if err != nil || len(ips) == 0 {
		return "", fmt.Errorf("the Docker host %q has no IPv4 address: %v", host, err)
	}
	return ips[0].String(), nil
}

// freePort returns a TCP port that nothing listens on here right now (on
// loopback: if another interface has it, Docker's bind fails and
// startRocketMQ tries another).
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

var (
	poolOnce sync.Once
	pool     *pgxpool.Pool
	poolErr  error
)

// testPool is one pool shared by the package's tests.
func testPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	dsn := postgresDSN(t)
	poolOnce.Do(func() {
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			poolErr = err
			return
		}
		cfg.MaxConns = 50
		pool, poolErr = pgxpool.NewWithConfig(context.Background(), cfg)
		if poolErr == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			poolErr = pool.Ping(ctx)
		}
	})
	if poolErr != nil {
		t.Fatalf("postgres at %s: %v", dsn, poolErr)
	}
	return pool
}

func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// testKeys is the fingerprint key set of the tests.
func testFingerprinter(t testing.TB) *dedup.Fingerprinter {
	f, err := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "k1", Secret: []byte("integration-test-secret-0123456789")})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// env is one test's bundle: its own schema holding the idemq tables and the
// test's business tables, dropped at the end.
type env struct {
	t      testing.TB
	ctx    context.Context
	pool   *pgxpool.Pool
	schema string
	store  *pgstore.Store
}

// setup creates a fresh schema with migrated idemq tables; cfg tweaks the
// store config (Schema and Fingerprinter are filled in).
func setup(t testing.TB, tweak func(*pgstore.Config)) *env {
	t.Helper()
	p := testPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	schema := randomName("t_")
	cfg := pgstore.Config{Schema: schema, Fingerprinter: testFingerprinter(t)}
	if tweak != nil {
		tweak(&cfg)
	}
	st, err := pgstore.New(p, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = p.Exec(context.Background(), "drop schema if exists "+pgx.Identifier{schema}.Sanitize()+" cascade")
	})
	return &env{t: t, ctx: ctx, pool: p, schema: schema, store: st}
}

// table returns a quoted table name in the test's schema.
func (e *env) table(name string) string { return pgx.Identifier{e.schema, name}.Sanitize() }

func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.pool.Exec(e.ctx, sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(e.ctx, sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (e *env) record(scope, messageID string) dedup.Record {
	e.t.Helper()
	r, err := e.store.Lookup(e.ctx, scope, messageID)
	if err != nil {
		e.t.Fatalf("record %s/%s: %v", scope, messageID, err)
	}
	return r
}

// outboxWith migrates an outbox in the env's schema and commits msg to it.
func (e *env) outboxWith(msg outbox.Message) *outbox.Outbox {
	e.t.Helper()
	ob, err := outbox.New(e.pool, outbox.Config{Schema: e.schema})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := ob.Migrate(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	tx, err := e.pool.Begin(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	if _, err := ob.Add(e.ctx, tx, msg); err != nil {
		e.t.Fatal(err)
	}
	if err := tx.Commit(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	return ob
}

func (e *env) deadLetters(scope string) []dedup.DeadLetter {
	e.t.Helper()
	dl, err := e.store.DeadLetters(e.ctx, scope, 0, 1000)
	if err != nil {
		e.t.Fatal(err)
	}
	return dl
}
