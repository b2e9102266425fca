package integration

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServer is a redis-server process of one test, on a port of its own,
// which the test may stop, start again on the same port, pause (SIGSTOP:
// a hung Redis) and resume. The shared Redis is never touched.
type redisServer struct {
	t    testing.TB
	bin  string
	port int

	mu  sync.Mutex
	cmd *exec.Cmd
}

// startRedisServer starts redis-server (from PATH: the Debian package, as
// scripts/services.sh installs it) on a free loopback port, without
// persistence, and stops it when the test ends. Without the binary the test
// fails under CI=true and is skipped otherwise.
func startRedisServer(t testing.TB) *redisServer {
	t.Helper()
	bin := redisServerBin(t)
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	s := &redisServer{t: t, bin: bin, port: port}
	s.start()
	t.Cleanup(func() {
		s.resume()
		s.stop()
	})
	return s
}

func (s *redisServer) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// start runs the server and waits until it answers PING.
func (s *redisServer) start() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		s.t.Fatal("redis-server already running")
	}
	dir := s.t.TempDir()
	cmd := exec.Command(s.bin, "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "", //nolint:gosec // our own binary from PATH, fixed arguments
		"--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "redis.log"), "--daemonize", "no", "--protected-mode", "no")
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	s.cmd = cmd
	c := redis.NewClient(&redis.Options{Addr: s.addr(), MaxRetries: -1})
	defer c.Close()
	eventually(s.t, 30*time.Second, "redis-server on "+s.addr()+" to answer PING", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return c.Ping(ctx).Err() == nil
	})
}

// stop shuts the server down (SIGTERM) and waits for it to exit: clients
// then get "connection refused".
func (s *redisServer) stop() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		_ = s.cmd.Wait() // "signal: terminated": the exit we asked for
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
	s.cmd = nil
}

// pause stops the process (SIGSTOP): it keeps its port and its connections
// but answers nothing, a hung Redis.
func (s *redisServer) pause() { s.signal(syscall.SIGSTOP) }

// resume continues a paused process (SIGCONT).
func (s *redisServer) resume() { s.signal(syscall.SIGCONT) }

func (s *redisServer) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		if err := s.cmd.Process.Signal(sig); err != nil {
			s.t.Errorf("signal %v to redis-server: %v", sig, err)
		}
	}
}

func (s *redisServer) String() string { return fmt.Sprintf("redis-server %s", s.addr()) }

// redisServerBin is the redis-server binary in PATH (the Debian package that
// scripts/services.sh installs), for tests that run Redis servers of their
// own. Without it the test fails under CI=true and is skipped otherwise.
func redisServerBin(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if servicesRequired() {
			t.Fatalf("redis-server is not in PATH and CI=true: this test runs Redis servers of its own; %s", startHint)
		}
		t.Skipf("redis-server is not in PATH: this test runs Redis servers of its own; %s", startHint)
	}
	return bin
}
