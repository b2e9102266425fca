package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/redis/go-redis/v9"
)

// startRedisCluster runs a one-node Redis Cluster (all 16,384 slots on one
// primary) on a free loopback port for the test. One node is enough to
// prove the key layout: cluster mode refuses any command or script whose
// keys hash to different slots (CROSSSLOT) however many nodes there are.
func startRedisCluster(t *testing.T) *redis.ClusterClient {
	t.Helper()
	bin := redisServerBin(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := t.TempDir()
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", fmt.Sprint(port), "--cluster-enabled", "yes",
		"--cluster-config-file", dir+"/nodes.conf", "--dir", dir, "--save", "", "--appendonly", "no",
		"--logfile", dir+"/redis.log")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	node := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port)})
	defer node.Close()
	ctx := context.Background()
	eventually(t, 10*time.Second, "redis-server to answer", func() bool { return node.Ping(ctx).Err() == nil })
	if err := node.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "cluster_state:ok", func() bool {
		info, err := node.ClusterInfo(ctx).Result()
		return err == nil && strings.Contains(info, "cluster_state:ok")
	})
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{fmt.Sprintf("127.0.0.1:%d", port)}})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// The Redis-only store on Redis Cluster: every script's keys share a slot
// (per-scope hash tag), through every path: new, duplicate by message ID and
// by business key (a second script call), conflict, retry, takeover, final
// failure with a dead letter, re-drive, rejection, lookups and renewals.
func TestRedisStoreOnRedisCluster(t *testing.T) {
	t.Parallel()
	c := startRedisCluster(t)
	s, err := redisstore.New(redisstore.Config{Client: c, Fingerprinter: testFingerprinter(t), MaxAttempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ok := func(context.Context, *dedup.Message) error { return nil }
	fail := func(context.Context, *dedup.Message) error { return errors.New("provider down") }
	scripts := countScripts(c)
	slow := func(context.Context, *dedup.Message) error { // runs through two renewals
		scripts.waitMore(t, 2, "two lease renewals on the cluster")
		return nil
	}
	opt := dedup.LeaseOptions{TTL: time.Second, Heartbeat: 150 * time.Millisecond}
	steps := []struct {
		mid, bk, payload string
		h                dedup.LeaseHandler
		want             dedup.Outcome
	}{
		{"m-1", "pay-1", "a", slow, dedup.OutcomeProcessed},
		{"m-1", "pay-1", "a", ok, dedup.OutcomeDuplicate},
		{"m-2", "pay-1", "a", ok, dedup.OutcomeDuplicate}, // by business key
		{"m-3", "pay-1", "b", ok, dedup.OutcomeConflict},
		{"m-4", "pay-4", "c", fail, dedup.OutcomeRetry},
		{"m-5", "pay-4", "c", fail, dedup.OutcomeDeadLetter}, // takeover by business key, last attempt
	}
	for i, st := range steps {
		r, err := s.ProcessLeased(ctx, msg(t, "billing {eu}", st.mid, st.bk, st.payload), st.h, opt)
		if err != nil || r.Outcome != st.want {
			t.Fatalf("step %d (%s/%s): %+v, %v; want %s", i+1, st.mid, st.bk, r, err, st.want)
		}
	}
	if err := s.Redrive(ctx, "billing {eu}", "m-4"); err != nil {
		t.Fatal(err)
	}
	if r, err := s.ProcessLeased(ctx, msg(t, "billing {eu}", "m-4", "pay-4", "c"), ok, opt); err != nil || r.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("after re-drive: %+v, %v", r, err)
	}
	if r, err := s.Reject(ctx, msg(t, "billing {eu}", "m-6", "pay-6", "??"), dedup.ReasonBadInput, nil); err != nil || r.Outcome != dedup.OutcomeDeadLetter {
		t.Fatalf("reject: %+v, %v", r, err)
	}
	if rec, err := s.LookupBusinessKey(ctx, "billing {eu}", "pay-4"); err != nil || rec.Status != dedup.StatusSucceeded || rec.MessageID != "m-4" {
		t.Fatalf("LookupBusinessKey: %+v, %v", rec, err)
	}
	dls, err := s.DeadLetters(ctx, "billing {eu}", 0, 10)
	if err != nil || len(dls) != 3 {
		t.Fatalf("dead letters: %d, %v; want 3 (conflict, attempts exhausted, bad input)", len(dls), err)
	}
}
