package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq/broker/rocketmqadapter"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/devenv"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/kafkapub"
	"github.com/idemq/idemq/outbox/rocketmqpub"
	"github.com/idemq/idemq/wire"
)

// asNewFlags are redrive's flags for re-driving a conflict's dead letter as
// a new message (pgstore.Store.RedriveAsNew): the dead letter, the override
// for payload conflicts, and the broker the message is published to.
type asNewFlags struct {
	asNew, force         bool
	id                   int64
	operator             string
	broker, header       string
	kafkaBrokers, namesr string
}

func (a *asNewFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&a.asNew, "as-new", false, "re-drive the conflict's dead letter -id as a new message: publish it under the message ID <message ID>#redrive-<id>")
	fs.Int64Var(&a.id, "id", 0, "-as-new: the dead letter's ID (the ID column of idemq dead-letters)")
	fs.BoolVar(&a.force, "force", false, "-as-new: also re-drive a payload conflict (one intent sent with two payloads; the record usually stands for the right one)")
	fs.StringVar(&a.operator, "operator", os.Getenv("USER"), "-as-new: who asks, for the audit row")
	fs.StringVar(&a.broker, "broker", "kafka", "-as-new: where the message is published: kafka or rocketmq")
	fs.StringVar(&a.header, "message-id-header", wire.MessageIDHeader, "-as-new: the message-ID header (Kafka) or property (RocketMQ) the consumer reads")
	fs.StringVar(&a.kafkaBrokers, "kafka-brokers", devenv.KafkaBrokers(), "-as-new: Kafka bootstrap brokers, comma separated")
	fs.StringVar(&a.namesr, "rocketmq-namesrv", devenv.RocketMQNamesrv(), "-as-new: RocketMQ NameServers, comma separated")
}

// run re-drives dead letter a.id of scope as a new message and prints what
// happened: published now, or already published by an earlier run.
func (a *asNewFlags) run(ctx context.Context, f *storeFlags, scope string) error {
	if a.id <= 0 {
		return errors.New("redrive -as-new: -id of the dead letter is required (see idemq dead-letters)")
	}
	if a.header == "" {
		return errors.New("redrive -as-new: -message-id-header must not be empty")
	}
	publish, closePub, err := a.publisher()
	if err != nil {
		return err
	}
	defer closePub()
	st, closeStore, err := f.admin(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	res, err := st.RedriveAsNew(ctx, scope, a.id, dedup.RedriveAsNewOptions{Publish: publish, Force: a.force, Operator: a.operator})
	if err != nil {
		if errors.Is(err, dedup.ErrPayloadConflict) && !a.force {
			err = fmt.Errorf("%w\n(pass -force to re-drive it anyway)", err)
		}
		return err
	}
	d := res.DeadLetter
	if !res.Published {
		fmt.Printf("dead letter %d (%s) was already re-driven as %s at %s: nothing new published\n",
			d.ID, d.Reason, res.MessageID, res.PublishedAt.Format(time.RFC3339))
		return nil
	}
	fmt.Printf("dead letter %d (%s) re-driven as new: published to %s as message ID %s; the consumer of scope %s processes it under that identity (the record %s keeps its own)\n",
		d.ID, d.Reason, d.Topic, res.MessageID, scope, d.MessageID)
	return nil
}

// publisher returns the Publish function of RedriveAsNew for a.broker: one
// envelope, published with the outbox's publishers (Kafka acks=all,
// RocketMQ SendSync), so the call returns only once the broker stored it.
// The publisher is made at the first publish (a refused or already done
// re-drive connects to no broker); closePub releases it.
func (a *asNewFlags) publisher() (publish func(context.Context, dedup.RedriveMessage) error, closePub func(), err error) {
	if a.broker != "kafka" && a.broker != "rocketmq" {
		return nil, nil, fmt.Errorf("-broker %q: want kafka or rocketmq", a.broker)
	}
	var pub interface {
		outbox.Publisher
		Close() error
	}
	publish = func(ctx context.Context, m dedup.RedriveMessage) error {
		if pub == nil {
			var err error
			if a.broker == "kafka" {
				pub, err = kafkapub.New(kafkapub.Config{Brokers: strings.Split(a.kafkaBrokers, ",")})
			} else {
				pub, err = rocketmqpub.New(rocketmqpub.Config{NameServers: strings.Split(a.namesr, ",")})
			}
			if err != nil {
				pub = nil
				return err
			}
		}
		return pub.Publish(ctx, []outbox.Envelope{republishEnvelope(a.broker, a.header, m)})
	}
	closePub = func() {
		if pub != nil {
			_ = pub.Close()
		}
	}
	return publish, closePub, nil
}

// republishEnvelope is the message RedriveAsNew publishes: the dead letter's
// topic, key, payload and headers (for RocketMQ its user properties only,
// without the stored copy's UNIQ_KEY, offsets and retry topic), with header
// set to the derived message ID.
func republishEnvelope(broker, header string, m dedup.RedriveMessage) outbox.Envelope {
	h := m.Headers
	if broker == "rocketmq" {
		h = rocketmqadapter.UserProperties(h)
	}
	headers := make(map[string]string, len(h)+1)
	for k, v := range h {
		headers[k] = v
	}
	headers[header] = m.MessageID
	var key []byte
	if len(m.Key) > 0 {
		key = m.Key
	}
	id, err := uuid.NewV7()
	if err != nil {
		id = uuid.New() // only names the envelope in publish errors
	}
	return outbox.Envelope{ID: id, Topic: m.Topic, Key: key, Headers: headers, Payload: m.Payload}
}
