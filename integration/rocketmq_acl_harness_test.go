package integration

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idemq/idemq/broker/rocketmqadapter"
)

// rmqACLCluster is a RocketMQ 5.3.3 NameServer and broker with ACL 2.0
// (authentication and authorization) that a test starts from the jars
// scripts/services.sh caches, on free loopback ports, with its store in a
// temporary folder. Its broker config sets fileReservedTime=48 and
// deleteWhen=04;16, so a retention read must see 48h + 12h.
type rmqACLCluster struct {
	nameServers []string
	broker      string
	admin       primitive.Credentials // the initial (super) user
}

// aclFileReservedHours and aclDeleteWhen are the ACL broker's store
// retention settings.
const (
	aclFileReservedHours = 48
	aclDeleteWhen        = "04;16"
)

// rmqLibDir is the folder of the RocketMQ jars: TEST_ROCKETMQ_LIB (printed
// by `scripts/services.sh env`), else the repository's
// .cache/services/rocketmq/lib.
func rmqLibDir() string {
	if d := os.Getenv("TEST_ROCKETMQ_LIB"); d != "" {
		return d
	}
	return filepath.Join("..", ".cache", "services", "rocketmq", "lib")
}

// freeBrokerPort returns a free port p whose p-2 (the broker's VIP channel)
// and p+1 (HA) are free too.
func freeBrokerPort(t testing.TB) int {
	t.Helper()
	for range 50 {
		p, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		ok := p > 1026 && p < 65534
		for _, q := range []int{p - 2, p + 1} {
			if !ok {
				break
			}
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(q))
			if err != nil {
				ok = false
				break
			}
			_ = l.Close()
		}
		if ok {
			return p
		}
	}
	t.Fatal("no free broker port with free neighbours")
	return 0
}

// startACLRocketMQ starts an ACL-enabled NameServer and broker (about 20s)
// and stops them at the end of the test. Without the jars or java it skips,
// or fails under CI=true / TEST_REQUIRE_BROKERS.
func startACLRocketMQ(t *testing.T) *rmqACLCluster {
	t.Helper()
	lib := rmqLibDir()
	jars, _ := filepath.Glob(filepath.Join(lib, "rocketmq-broker-*.jar"))
	java, jerr := exec.LookPath("java")
	if jh := os.Getenv("JAVA_HOME"); jh != "" {
		java, jerr = filepath.Join(jh, "bin", "java"), nil
	}
	if len(jars) == 0 || jerr != nil {
		msg := fmt.Sprintf("no RocketMQ broker jar in %s (set TEST_ROCKETMQ_LIB); %s", lib, startHint)
		if jerr != nil {
			msg = fmt.Sprintf("no java to start the ACL broker: %v; %s", jerr, startHint)
		}
		if servicesRequired() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	lib, _ = filepath.Abs(lib)
	dir := t.TempDir()
	home := filepath.Join(dir, "home")
	if err := os.MkdirAll(filepath.Join(home, "conf"), 0o750); err != nil {
		t.Fatal(err)
	}
	nsPort, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	brokerPort := freeBrokerPort(t)
	admin := primitive.Credentials{AccessKey: "idemq-admin", SecretKey: randomName("secret-")}
	c := &rmqACLCluster{
		nameServers: []string{fmt.Sprintf("127.0.0.1:%d", nsPort)},
		broker:      fmt.Sprintf("127.0.0.1:%d", brokerPort),
		admin:       admin,
	}
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	nsConf := write("namesrv.conf", fmt.Sprintf("listenPort=%d\nbindAddress=127.0.0.1\nscanAvailableNameSrv=false\n", nsPort))
	brokerConf := write("broker.conf", fmt.Sprintf(`brokerClusterName=IdemqACL
brokerName=broker-acl
brokerId=0
brokerRole=ASYNC_MASTER
flushDiskType=ASYNC_FLUSH
namesrvAddr=%[1]s
brokerIP1=127.0.0.1
brokerIP2=127.0.0.1
listenPort=%[2]d
bindAddress=127.0.0.1
autoCreateTopicEnable=false
autoCreateSubscriptionGroup=true
defaultTopicQueueNums=4
storePathRootDir=%[3]s
mappedFileSizeCommitLog=16777216
mappedFileSizeConsumeQueue=600000
diskMaxUsedSpaceRatio=95
messageDelayLevel=1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s
registerNameServerPeriod=10000
fileReservedTime=%[4]d
deleteWhen=%[5]s
authenticationEnabled=true
authenticationProvider=org.apache.rocketmq.auth.authentication.provider.DefaultAuthenticationProvider
authenticationMetadataProvider=org.apache.rocketmq.auth.authentication.provider.LocalAuthenticationMetadataProvider
authorizationEnabled=true
authorizationProvider=org.apache.rocketmq.auth.authorization.provider.DefaultAuthorizationProvider
authorizationMetadataProvider=org.apache.rocketmq.auth.authorization.provider.LocalAuthorizationMetadataProvider
initAuthenticationUser={"username":"%[6]s","password":"%[7]s"}
innerClientAuthenticationCredentials={"accessKey":"%[6]s","secretKey":"%[7]s"}
`, c.nameServers[0], brokerPort, filepath.Join(dir, "store"), aclFileReservedHours, aclDeleteWhen, admin.AccessKey, admin.SecretKey))

	jdk17 := []string{"--add-opens", "java.base/java.lang=ALL-UNNAMED", "--add-opens", "java.base/java.nio=ALL-UNNAMED",
		"--add-opens", "java.base/java.util=ALL-UNNAMED", "--add-opens", "java.base/jdk.internal.ref=ALL-UNNAMED",
		"--add-exports", "java.base/sun.nio.ch=ALL-UNNAMED"}
	start := func(name string, heap []string, logback, main, conf string) (*exec.Cmd, *logBuf) {
		// C1 only and the serial collector: these JVMs live for one test on
		// a shared machine, so start-up CPU matters more than peak speed.
		args := append(append(append([]string(nil), heap...), "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"), jdk17...)
		args = append(args, "-Duser.home="+home, "-Drmq.logback.configurationFile="+logback, "-cp", filepath.Join(lib, "*"), main, "-c", conf)
		cmd := exec.Command(java, args...) //nolint:gosec // the JDK the harness found, our own fixed arguments
		cmd.Env = append(os.Environ(), "ROCKETMQ_HOME="+home)
		out := &logBuf{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", name, err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		return cmd, out
	}
	_, nsOut := start("NameServer", []string{"-Xms128m", "-Xmx128m", "-Xmn64m"}, "rmq.namesrv.logback.xml",
		"org.apache.rocketmq.namesrv.NamesrvStartup", nsConf)
	waitLog := func(what string, out *logBuf, needle string, d time.Duration) {
		deadline := time.Now().Add(d)
		for !bytes.Contains(out.bytes(), []byte(needle)) {
			if time.Now().After(deadline) {
				t.Fatalf("%s not ready after %s:\n%s", what, d, out.bytes())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	t0 := time.Now()
	waitLog("ACL NameServer", nsOut, "boot success", 60*time.Second)
	t.Logf("ACL NameServer up after %s", time.Since(t0).Round(time.Millisecond))
	_, brOut := start("broker", []string{"-Xms256m", "-Xmx256m", "-Xmn128m", "-XX:MaxDirectMemorySize=256m"}, "rmq.broker.logback.xml",
		"org.apache.rocketmq.broker.BrokerStartup", brokerConf)
	waitLog("ACL broker", brOut, "boot success", 90*time.Second)
	t.Logf("ACL broker up after %s", time.Since(t0).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("ACL broker output:\n%s", brOut.bytes())
		}
	})
	return c
}

// topic creates a fresh topic (4 queues) as the admin user and waits for
// its route.
func (c *rmqACLCluster) topic(t testing.TB, prefix string) string {
	t.Helper()
	topic := randomName(prefix)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := rocketmqadapter.EnsureTopicWithCredentials(ctx, c.nameServers, c.broker, topic, 4, c.admin); err != nil {
		t.Fatal(err)
	}
	return topic
}

// logBuf collects a process's output; safe for concurrent use.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]byte(nil), l.b.Bytes()...)
}
