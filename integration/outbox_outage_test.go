package integration

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/kafkapub"
)

// closedAddr returns a 127.0.0.1 address on which nothing listens (a port
// taken and released), so every dial is refused.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// A broker outage on the wire: kafkapub publishing to an address that
// refuses connections fails with an error that outbox.IsUnavailable
// classifies as the broker's, while a row error from the real Kafka (a
// topic that does not exist, CreateTopics off) is not; and a relay on the
// refusing address over a real outbox parks nothing even with MaxAttempts
// 1: it opens its breaker and leaves every row untouched (no attempt, no
// error recorded).
func TestOutboxBrokerOutageIsNotARowError(t *testing.T) {
	o := setupOutbox(t)
	ctx, cancel := context.WithTimeout(o.ctx, 2*time.Minute)
	defer cancel()
	env := []outbox.Envelope{{Topic: randomName("outage"), Key: []byte("k"), Payload: []byte("p")}}

	down, err := kafkapub.New(kafkapub.Config{Brokers: []string{closedAddr(t)}, CreateTopics: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = down.Close() })
	pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
	err = down.Publish(pctx, env)
	pcancel()
	if err == nil || !outbox.IsUnavailable(err) {
		t.Fatalf("publish to a refusing address: %v (IsUnavailable %v); want an unavailable broker", err, outbox.IsUnavailable(err))
	}

	up, err := kafkapub.New(kafkapub.Config{Brokers: kafkaBrokers(t)}) // CreateTopics off: the topic is missing
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = up.Close() })
	err = up.Publish(ctx, env)
	if err == nil || outbox.IsUnavailable(err) {
		t.Fatalf("publish to a missing topic on the real Kafka: %v (IsUnavailable %v); want a row error", err, outbox.IsUnavailable(err))
	}

	const n = 20
	o.addRows(t, env[0].Topic, n, 4, "outage")
	cfg := fastRelay(randomName("outage-relay"))
	cfg.MaxAttempts = 1
	cfg.PublishTimeout = 5 * time.Second
	rr := o.startRelay(t, down, cfg)
	eventually(t, time.Minute, "the relay to see the outage twice (breaker open, a probe failed)", func() bool {
		s := rr.r.Stats()
		return s.BreakerOpen && s.Outages == 1 && s.Unavailable >= 2*4
	})
	rr.stop(t)
	s := rr.r.Stats()
	st := o.stats(t)
	if st.Parked != 0 || st.Failing != 0 || st.Pending != n || s.Failed != 0 || s.Parked != 0 {
		t.Fatalf("after the outage: outbox %+v, relay %+v; want all %d rows pending, none failing or parked", st, s, n)
	}
}
