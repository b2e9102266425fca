package integration

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idemq/idemq/broker/rocketmqadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
)

// TestRocketMQStoreRetentionRefused reads the store retention of the shared
// broker (scripts/services.sh's broker.conf sets neither fileReservedTime
// nor deleteWhen: the broker's defaults 72h and "04", so 72h + 24h) and
// refuses a SucceededRetention of 48h, shorter than that, in atomic,
// batched and lease modes: consumer.Run over a Source and PushConsumer.Start
// (atomic and lease; a push listener has no batched mode) return an error
// wrapping dedup.ErrRetentionTooShort that names both numbers, and consume
// nothing. AcceptOffsetResetReplays lets the same consumers start.
func TestRocketMQStoreRetentionRefused(t *testing.T) {
	ns, _ := rmqEndpoints(t)
	topic := rmqTopic(t, "idemq_retention_")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	rs, err := rocketmqadapter.ReadStoreRetention(ctx, ns, topic, primitive.Credentials{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || rs[0].FileReservedTime != 72*time.Hour || rs[0].DeleteWhen != "04" || rs[0].CleanupGap != 24*time.Hour || rs[0].Horizon() != 96*time.Hour {
		t.Fatalf("store retention of the shared broker = %+v; want one broker, fileReservedTime 72h, deleteWhen 04 (horizon 96h)", rs)
	}

	e := setup(t, func(c *pgstore.Config) { c.SucceededRetention = 48 * time.Hour })
	// modeConfig returns the consumer config of mode whose handler counts
	// the messages it runs in calls.
	modeConfig := func(mode string, calls *atomic.Int64) consumer.Config {
		switch mode {
		case "atomic":
			return consumer.Config{Handler: func(context.Context, pgx.Tx, *dedup.Message) error { calls.Add(1); return nil }}
		case "batched":
			return consumer.Config{BatchSize: 10, BatchHandler: func(_ context.Context, _ pgx.Tx, ms []*dedup.Message) error {
				calls.Add(int64(len(ms)))
				return nil
			}}
		default:
			return consumer.Config{LeaseHandler: func(context.Context, *dedup.Message) error { calls.Add(1); return nil }}
		}
	}
	var refusedCalls atomic.Int64
	fromFirst := []rmqconsumer.Option{rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset)}
	p := rmqProducer(t)
	rmqSend(t, p, topic, []byte("x"), "m-retention-1")

	refused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, dedup.ErrRetentionTooShort) || !strings.Contains(err.Error(), "48h0m0s") || !strings.Contains(err.Error(), "96h0m0s") {
			t.Errorf("%s: %v; want ErrRetentionTooShort naming SucceededRetention 48h0m0s and the horizon 96h0m0s", what, err)
		}
	}
	for _, mode := range []string{"atomic", "batched", "lease"} {
		for _, accept := range []bool{false, true} {
			group := randomName("retention_" + mode + "_")
			var calls atomic.Int64
			cc := modeConfig(mode, &calls)
			if !accept {
				cc = modeConfig(mode, &refusedCalls)
			}
			cc.Scope, cc.Store = group, e.store
			src, err := rocketmqadapter.NewSource(rocketmqadapter.SourceConfig{NameServers: ns, Group: group, Topic: topic,
				AcceptOffsetResetReplays: accept, ClientOptions: fromFirst})
			if err != nil {
				t.Fatal(err)
			}
			if accept {
				// Runs, and consumes the message, until canceled.
				r := startConsumer(t, cc, src)
				eventually(t, time.Minute, mode+" Source with AcceptOffsetResetReplays to consume", func() bool { return calls.Load() >= 1 })
				r.stop(t)
			} else {
				rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
				refused("consumer.Run over a Source, "+mode+" mode", rmqConsumer(t, cc).Run(rctx, src))
				rcancel()
			}

			if mode == "batched" {
				continue
			}
			pcc := modeConfig(mode, &calls)
			if !accept {
				pcc = modeConfig(mode, &refusedCalls)
			}
			pcc.Scope, pcc.Store = group+"_push", e.store
			pc, err := rocketmqadapter.NewPushConsumer(rmqConsumer(t, pcc), rocketmqadapter.Config{NameServers: ns, Group: group + "_push", Topic: topic,
				AcceptOffsetResetReplays: accept, ClientOptions: fromFirst})
			if err != nil {
				t.Fatal(err)
			}
			err = pc.Start()
			if accept {
				if err != nil {
					t.Fatalf("%s push, AcceptOffsetResetReplays: Start = %v", mode, err)
				}
				before := calls.Load()
				eventually(t, time.Minute, mode+" push consumer with AcceptOffsetResetReplays to consume", func() bool { return calls.Load() > before })
				// Shut down at the end of the test, not now: the client's
				// first rebalance (started by Start, not stopped by Suspend)
				// may still be asking the broker about the group's retry
				// topic after the first message was handled, and a Shutdown
				// meanwhile races inside rocketmq-client-go (its client's
				// closed flag is written and read without a lock).
				t.Cleanup(func() { _ = pc.Shutdown() })
				continue
			}
			refused("PushConsumer.Start, "+mode+" mode", err)
			_ = pc.Shutdown()
		}
	}
	if n := refusedCalls.Load(); n != 0 {
		t.Errorf("the refused consumers handled %d messages; want none", n)
	}
}
