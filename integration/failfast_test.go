package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/redis/go-redis/v9"
)

// The Redis-only store's watchdog goes by the lease's clock: with Redis hung
// (its process stopped, SIGSTOP, connections open and silent) and a go-redis
// client that waits a minute on a socket read and retries three times, the
// handler's context still ends with ErrLeaseExpired at 90% of the lease's
// TTL, while Redis is still hung, instead of when the renewal call gives up.
func TestRedisStoreRenewalFailsByTheLeaseClock(t *testing.T) {
	t.Parallel()
	rs := startRedisServer(t)
	client := redis.NewClient(&redis.Options{Addr: rs.addr(), ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	t.Cleanup(func() { _ = client.Close() })
	s, err := redisstore.New(redisstore.Config{Client: client, Prefix: randomName("rs-"), Fingerprinter: testFingerprinter(t)})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	ended := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = s.ProcessLeased(context.Background(), msg(t, "billing", "m-hung", "", "x"), func(hctx context.Context, _ *dedup.Message) error {
			close(started)
			<-hctx.Done()
			ended <- context.Cause(hctx)
			return context.Cause(hctx)
		}, dedup.LeaseOptions{TTL: 2 * time.Second, Heartbeat: 200 * time.Millisecond})
	}()
	<-started
	rs.pause()
	select {
	case cause := <-ended:
		if !errors.Is(cause, dedup.ErrLeaseExpired) {
			t.Fatalf("handler canceled with %v, want ErrLeaseExpired", cause)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("30s after Redis hung, the handler of a 2s lease still runs: the watchdog waits for the renewal call instead of the lease's clock")
	}
	rs.resume()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("ProcessLeased did not return after Redis resumed")
	}
}
