package integration

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idemq/idemq/broker/rocketmqadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/rocketmqpub"
	"github.com/jackc/pgx/v5"
)

// TestRocketMQACL runs idemq against a RocketMQ 5.3.3 NameServer and broker
// with ACL 2.0 (authentication and authorization on) that it starts itself:
// the relay (rocketmqpub) publishes and both consumers (Source under
// consumer.Run, PushConsumer) consume with the right credentials, whose ACL
// 1.0-style signature the broker accepts; a wrong secret stops a consumer at
// Start with ErrAccessDenied; and a publish the broker refuses
// (NO_PERMISSION) pauses the relay, parks nothing, and the rows drain once
// the credentials are right.
func TestRocketMQACL(t *testing.T) {
	c := startACLRocketMQ(t)
	topic := c.topic(t, "idemq_acl_")
	o := setupOutbox(t)
	wrong := primitive.Credentials{AccessKey: c.admin.AccessKey, SecretKey: "not-" + c.admin.SecretKey}

	t.Run("RightCredentials", func(t *testing.T) {
		eff := o.table("acl_effects")
		o.exec(`create table ` + eff + ` (grp text not null, message_id text not null, primary key (grp, message_id))`)
		want := o.addRows(t, topic, 12, 3, "acl")
		pub, err := rocketmqpub.New(rocketmqpub.Config{NameServers: c.nameServers, Credentials: c.admin, InstanceName: randomName("acl-relay-")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pub.Close() })
		rr := o.startRelay(t, pub, fastRelay(randomName("acl-relay")))
		eventually(t, time.Minute, "the relay to publish every row", func() bool {
			st := o.stats(t)
			return st.Pending == 0 && st.Parked == 0 && st.Failing == 0
		})
		rr.stop(t)

		handler := func(group string) func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
			return func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
				_, err := tx.Exec(ctx, `insert into `+eff+` values ($1, $2)`, group, m.Identity.MessageID)
				return err
			}
		}
		// The Source under consumer.Run: its horizon check reads the broker's
		// config with a signed GET_BROKER_CONFIG.
		pullGroup := randomName("acl_pull_")
		src, err := rocketmqadapter.NewSource(rocketmqadapter.SourceConfig{NameServers: c.nameServers, Group: pullGroup, Topic: topic,
			Credentials:   c.admin,
			ClientOptions: []rmqconsumer.Option{rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset)}})
		if err != nil {
			t.Fatal(err)
		}
		h, err := src.RedeliveryHorizon(o.ctx)
		if wantH := aclFileReservedHours*time.Hour + 12*time.Hour; err != nil || h != wantH {
			t.Fatalf("Source.RedeliveryHorizon = %s, %v; want %s (fileReservedTime %dh + deleteWhen %q gap 12h)", h, err, wantH, aclFileReservedHours, aclDeleteWhen)
		}
		startConsumer(t, consumer.Config{Scope: pullGroup, Store: o.store, Handler: handler(pullGroup)}, src)

		// The push consumer: Start probes the credentials and reads the
		// store retention, signed.
		pushGroup := randomName("acl_push_")
		cc := rmqConsumer(t, consumer.Config{Scope: pushGroup, Store: o.store, Handler: handler(pushGroup)})
		pc, err := rocketmqadapter.NewPushConsumer(cc, rocketmqadapter.Config{NameServers: c.nameServers, Group: pushGroup, Topic: topic,
			Credentials:   c.admin,
			ClientOptions: []rmqconsumer.Option{rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset)}})
		if err != nil {
			t.Fatal(err)
		}
		if err := pc.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pc.Shutdown() })

		for _, g := range []string{pullGroup, pushGroup} {
			eventually(t, 90*time.Second, "group "+g+" to consume every row", func() bool {
				return o.count(`select count(*) from `+eff+` where grp = $1`, g) == len(want)
			})
			for id := range want {
				if r, err := o.store.Lookup(o.ctx, g, id); err != nil || r.Status != dedup.StatusSucceeded {
					t.Errorf("group %s, message %s: record %+v, %v; want SUCCEEDED", g, id, r, err)
				}
			}
		}
	})

	t.Run("WrongSecretRefusedAtStart", func(t *testing.T) {
		checkRefusal := func(what string, err error, took time.Duration) {
			t.Helper()
			switch {
			case !errors.Is(err, rocketmqadapter.ErrAccessDenied):
				t.Errorf("%s with a wrong secret: %v; want ErrAccessDenied", what, err)
			case !strings.Contains(err.Error(), "signature"):
				t.Errorf("%s: %v; want the broker's reason (check signature failed)", what, err)
			case strings.Contains(err.Error(), wrong.SecretKey):
				t.Errorf("%s: the error shows the secret: %v", what, err)
			case took > 15*time.Second:
				t.Errorf("%s: refused after %s; want at once", what, took)
			}
		}
		group := randomName("acl_wrong_push_")
		cc := rmqConsumer(t, consumer.Config{Scope: group, Store: o.store,
			Handler: func(context.Context, pgx.Tx, *dedup.Message) error { return nil }})
		pc, err := rocketmqadapter.NewPushConsumer(cc, rocketmqadapter.Config{NameServers: c.nameServers, Group: group, Topic: topic, Credentials: wrong})
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		err = pc.Start()
		checkRefusal("PushConsumer.Start", err, time.Since(t0))
		if err2 := pc.Start(); !errors.Is(err2, rocketmqadapter.ErrAccessDenied) {
			t.Errorf("second Start: %v; want the same refusal", err2)
		}
		_ = pc.Shutdown()

		// The Source: with FileReservedTime configured, nothing is read for
		// the horizon, so the probe of the first Fetch refuses; without it,
		// the signed store-retention read does.
		for _, frt := range []time.Duration{aclFileReservedHours * time.Hour, 0} {
			group := randomName("acl_wrong_pull_")
			src, err := rocketmqadapter.NewSource(rocketmqadapter.SourceConfig{NameServers: c.nameServers, Group: group, Topic: topic,
				Credentials: wrong, FileReservedTime: frt})
			if err != nil {
				t.Fatal(err)
			}
			cons := rmqConsumer(t, consumer.Config{Scope: group, Store: o.store,
				Handler: func(context.Context, pgx.Tx, *dedup.Message) error { return nil }})
			ctx, cancel := context.WithTimeout(o.ctx, time.Minute)
			t0 := time.Now()
			err = cons.Run(ctx, src)
			cancel()
			checkRefusal("consumer.Run over a Source (FileReservedTime "+frt.String()+")", err, time.Since(t0))
			if _, ferr := src.Fetch(o.ctx); !errors.Is(ferr, io.EOF) && !errors.Is(ferr, rocketmqadapter.ErrAccessDenied) {
				t.Errorf("Fetch after Run: %v; want io.EOF (closed)", ferr)
			}
		}
	})

	t.Run("PublishRefusedPausesRelay", func(t *testing.T) {
		bad, err := rocketmqpub.New(rocketmqpub.Config{NameServers: c.nameServers, Credentials: wrong, InstanceName: randomName("acl-bad-relay-")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = bad.Close() })
		perr := bad.Publish(o.ctx, []outbox.Envelope{{Topic: topic, Key: []byte("k"), Payload: []byte("p")}})
		if perr == nil || !outbox.IsUnavailable(perr) || !strings.Contains(perr.Error(), "CODE: 16") {
			t.Fatalf("publish with a wrong secret: %v (IsUnavailable %v); want NO_PERMISSION (16) as an outage", perr, outbox.IsUnavailable(perr))
		}
		const n = 8
		before := o.stats(t)
		o.addRows(t, topic, n, 2, "acl-refused")
		cfg := fastRelay(randomName("acl-bad-relay"))
		cfg.MaxAttempts = 1
		cfg.OutageBackoffInitial, cfg.OutageBackoffMax = 100*time.Millisecond, time.Second
		rr := o.startRelay(t, bad, cfg)
		eventually(t, time.Minute, "the relay to pause (breaker open, a probe refused too)", func() bool {
			s := rr.r.Stats()
			return s.BreakerOpen && s.Outages >= 1 && s.Unavailable >= 2
		})
		rr.stop(t)
		s, st := rr.r.Stats(), o.stats(t)
		if st.Parked != before.Parked || st.Failing != 0 || st.Pending != before.Pending+n || s.Failed != 0 || s.Parked != 0 {
			t.Fatalf("after refused publishes: outbox %+v, relay %+v; want all %d rows pending, none failing or parked", st, s, n)
		}

		good, err := rocketmqpub.New(rocketmqpub.Config{NameServers: c.nameServers, Credentials: c.admin, InstanceName: randomName("acl-good-relay-")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = good.Close() })
		rr = o.startRelay(t, good, fastRelay(randomName("acl-good-relay")))
		eventually(t, time.Minute, "the rows to drain with the right credentials", func() bool {
			st := o.stats(t)
			return st.Pending == 0 && st.Parked == 0
		})
		rr.stop(t)
	})

	// The CLI on the same cluster: `idemq relay --once --broker rocketmq`
	// with --rocketmq-access-key and the secret from
	// IDEMQ_ROCKETMQ_SECRET_KEY publishes every row; a wrong secret exits 1,
	// parks nothing and shows no secret.
	t.Run("CLIRelayOnce", func(t *testing.T) {
		bin := buildExample(t, "github.com/idemq/idemq/cmd/idemq")
		co := setupOutbox(t)
		run := func(secret string, n int) (string, string, int) {
			t.Helper()
			co.addRows(t, topic, n, 2, "acl-cli")
			out, errOut, code := cliRunEnv(t, bin, []string{"IDEMQ_ROCKETMQ_SECRET_KEY=" + secret},
				"relay", "--once", "--dsn", postgresDSN(t), "--schema", co.schema, "--broker", "rocketmq",
				"--rocketmq-namesrv", strings.Join(c.nameServers, ","), "--rocketmq-access-key", c.admin.AccessKey,
				"--max-attempts", "1", "--publish-timeout", "15s")
			if strings.Contains(out+errOut, c.admin.SecretKey) {
				t.Fatalf("the secret key is in the output:\n%s%s", out, errOut)
			}
			return out, errOut, code
		}
		out, errOut, code := run(wrong.SecretKey, 4)
		if code != 1 || !strings.Contains(out, "published 0\n") {
			t.Fatalf("relay --once, wrong secret: exit %d, want 1\n%s%s", code, out, errOut)
		}
		if st := co.stats(t); st.Parked != 0 || st.Failing != 0 || st.Pending != 4 {
			t.Fatalf("outbox after the refused publishes: %+v; want 4 pending, none failing or parked", st)
		}
		out, errOut, code = run(c.admin.SecretKey, 6)
		if code != 0 || !strings.Contains(out, "published 10\n") || !strings.Contains(out, "pending 0\n") {
			t.Fatalf("relay --once, right credentials: exit %d\n%s%s", code, out, errOut)
		}
		if st := co.stats(t); st.Published != 10 || st.Pending != 0 || st.Parked != 0 {
			t.Fatalf("outbox after the drain: %+v; want 10 published", st)
		}
	})
}
