package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/kafkapub"
	"github.com/segmentio/kafka-go"
)

// BenchmarkRelayThroughput measures how many rows per second one relay moves
// from the outbox table to Kafka (claim, publish with acks=all, mark,
// commit), against ceilings measured in the same run with no database: the
// same messages written from memory with a kafka-go Writer (acks=all,
// BatchTimeout 2ms) in chunks of the relay's batch size, and with the
// relay's own publisher (kafkapub, one atomic produce request per partition)
// in the same chunks. Each iteration moves 5,000 rows; inserting them into
// the outbox is not timed. The rounds variant publishes through a plain
// Publisher (one row per key per call).
//
//	go test -run '^$' -bench RelayThroughput -benchtime 3x ./...
func BenchmarkRelayThroughput(b *testing.B) {
	const rows, batch = 5000, 500
	o := setupOutbox(b)
	topic := newTopic(b, 3)
	pub, err := kafkapub.New(kafkapub.Config{Brokers: kafkaBrokers(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()

	msgs := func(keys int, tag string) []outbox.Message {
		out := make([]outbox.Message, rows)
		for i := range out {
			k := fmt.Sprintf("key-%04d", i%keys)
			out[i] = outbox.Message{Topic: topic, Key: []byte(k), Headers: map[string]string{"bench": tag},
				Payload: []byte(fmt.Sprintf(`{"key":%q,"n":%d,"pad":"0123456789abcdef0123456789abcdef"}`, k, i))}
		}
		return out
	}
	report := func(b *testing.B, elapsed time.Duration) {
		b.ReportMetric(float64(rows*b.N)/elapsed.Seconds(), "rows/s")
		b.ReportMetric(0, "ns/op")
	}

	envelopes := func(keys int) []outbox.Envelope {
		in := msgs(keys, "raw")
		out := make([]outbox.Envelope, len(in))
		for i, m := range in {
			out[i] = o.ob.Envelope(outbox.Row{ID: uuid.Must(uuid.NewV7()), Topic: m.Topic, Key: m.Key, Headers: m.Headers, Payload: m.Payload})
		}
		return out
	}
	b.Run("ceiling=raw-writer", func(b *testing.B) {
		w := &kafka.Writer{Addr: kafka.TCP(kafkaBrokers(b)...), RequiredAcks: kafka.RequireAll, Balancer: kafka.Murmur2Balancer{},
			BatchTimeout: 2 * time.Millisecond, BatchSize: batch}
		defer w.Close()
		var km []kafka.Message
		for _, e := range envelopes(50) {
			km = append(km, kafkapub.Message(e))
		}
		ctx := context.Background()
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			for i := 0; i < len(km); i += batch {
				if err := w.WriteMessages(ctx, km[i:min(i+batch, len(km))]...); err != nil {
					b.Fatal(err)
				}
			}
		}
		report(b, time.Since(start))
	})
	b.Run("ceiling=raw-kafkapub", func(b *testing.B) {
		envs := envelopes(50)
		ctx := context.Background()
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			for i := 0; i < len(envs); i += batch {
				if err := pub.Publish(ctx, envs[i:min(i+batch, len(envs))]); err != nil {
					b.Fatal(err)
				}
			}
		}
		report(b, time.Since(start))
	})

	for _, v := range []struct {
		name string
		keys int
		pub  outbox.Publisher
	}{
		{"relay/keys=50", 50, pub},
		{"relay/keys=5000", 5000, pub},
		{"relay/keys=1", 1, pub},
		{"relay-rounds/keys=50", 50, outbox.PublisherFunc(pub.Publish)},
	} {
		b.Run(v.name, func(b *testing.B) {
			keys := v.keys
			r, err := outbox.NewRelay(o.ob, v.pub, outbox.RelayConfig{Name: "bench", BatchSize: batch})
			if err != nil {
				b.Fatal(err)
			}
			var elapsed time.Duration
			for range b.N {
				b.StopTimer()
				in := msgs(keys, "relay")
				tx, err := o.pool.Begin(o.ctx)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := o.ob.AddBatch(o.ctx, tx, in); err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(o.ctx); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				start := time.Now()
				moved := 0
				for moved < rows {
					res, err := r.RunOnce(o.ctx)
					if err != nil {
						b.Fatal(err)
					}
					if res.Failed > 0 {
						b.Fatalf("publish failures: %+v", res)
					}
					moved += res.Published
				}
				elapsed += time.Since(start)
			}
			report(b, elapsed)
		})
	}
}
