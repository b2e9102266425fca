package rocketmqadapter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/apache/rocketmq-client-go/v2/admin"
	"github.com/apache/rocketmq-client-go/v2/primitive"
)

// EnsureTopic creates topic on the broker at brokerAddr ("127.0.0.1:10911")
// with queues read and write queues (default 4 when queues is 0) through the
// admin API (admin.CreateTopic with WithBrokerAddrCreate), then waits until
// the name servers return a route for it, at most 30s or until ctx ends. It
// is idempotent: creating an existing topic updates its queue counts. Call
// it before PushConsumer.Start, which fails without a route.
func EnsureTopic(ctx context.Context, nameServers []string, brokerAddr, topic string, queues int) error {
	if queues == 0 {
		queues = 4
	}
	switch {
	case len(nameServers) == 0 || brokerAddr == "" || topic == "":
		return errors.New("idemq/rocketmqadapter: EnsureTopic needs name servers, a broker address and a topic")
	case queues < 1 || queues > 1024:
		return fmt.Errorf("idemq/rocketmqadapter: EnsureTopic: queues %d must be 1 to 1024", queues)
	}
	adm, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver(nameServers)))
	if err != nil {
		return fmt.Errorf("idemq/rocketmqadapter: admin client: %w", err)
	}
	defer func() { _ = adm.Close() }()
	if err := adm.CreateTopic(ctx, admin.WithTopicCreate(topic), admin.WithBrokerAddrCreate(brokerAddr),
		admin.WithReadQueueNums(queues), admin.WithWriteQueueNums(queues)); err != nil {
		return fmt.Errorf("idemq/rocketmqadapter: create topic %s on %s: %w", topic, brokerAddr, err)
	}
	return waitForRoute(ctx, nameServers, topic, func() (bool, error) {
		mqs, err := adm.FetchPublishMessageQueues(ctx, topic)
		return err == nil && len(mqs) > 0, err
	})
}

// EnsureTopicWithCredentials is EnsureTopic for an ACL-enabled broker: the
// topic is created with a signed UPDATE_AND_CREATE_TOPIC request (request
// code 17; rocketmq-client-go's admin client sends CreateTopic unsigned
// even with credentials), then the route is awaited as EnsureTopic does.
// With empty credentials it is EnsureTopic. The user needs the permission
// to create topics (an ACL 2.0 super user, or CREATE on the topic). A
// refusal returns a *BrokerError (errors.Is ErrAccessDenied for
// NO_PERMISSION); the error names the topic and broker, never the secret.
func EnsureTopicWithCredentials(ctx context.Context, nameServers []string, brokerAddr, topic string, queues int, cred primitive.Credentials) error {
	if cred.AccessKey == "" {
		return EnsureTopic(ctx, nameServers, brokerAddr, topic, queues)
	}
	if queues == 0 {
		queues = 4
	}
	switch {
	case len(nameServers) == 0 || brokerAddr == "" || topic == "":
		return errors.New("idemq/rocketmqadapter: EnsureTopicWithCredentials needs name servers, a broker address and a topic")
	case queues < 1 || queues > 1024:
		return fmt.Errorf("idemq/rocketmqadapter: EnsureTopicWithCredentials: queues %d must be 1 to 1024", queues)
	}
	n := strconv.Itoa(queues)
	ext := map[string]string{
		"topic": topic, "defaultTopic": "TBW102", "readQueueNums": n, "writeQueueNums": n,
		"perm": "6", "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false",
	}
	if _, err := call(ctx, brokerAddr, "UPDATE_AND_CREATE_TOPIC "+topic, reqUpdateAndCreateTopic, ext, nil, cred); err != nil {
		return fmt.Errorf("idemq/rocketmqadapter: create topic %s on %s as %q: %w", topic, brokerAddr, cred.AccessKey, err)
	}
	return waitForRoute(ctx, nameServers, topic, func() (bool, error) {
		ms, err := masterBrokers(ctx, nameServers, topic, cred)
		return err == nil && len(ms) > 0, err
	})
}

// waitForRoute polls routed every 200ms until it reports the topic routed,
// for up to 30s (a NameServer learns a new topic at the broker's next
// registration), or until ctx ends.
func waitForRoute(ctx context.Context, nameServers []string, topic string, routed func() (bool, error)) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, err := routed()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("idemq/rocketmqadapter: topic %s has no route on %v after 30s (last error: %v)", topic, nameServers, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// EnsureRetryTopic creates group's retry topic "%RETRY%<group>" (one queue)
// on the broker at brokerAddr, like EnsureTopic. The broker creates it on
// its own at the group's first heartbeat, but a client that started before
// it existed only sees its route at its next route refresh (every 30s), so
// the first redeliveries of a new group wait that long. Calling it before
// PushConsumer.Start makes them prompt.
func EnsureRetryTopic(ctx context.Context, nameServers []string, brokerAddr, group string) error {
	if group == "" {
		return errors.New("idemq/rocketmqadapter: EnsureRetryTopic needs a group")
	}
	return EnsureTopic(ctx, nameServers, brokerAddr, RetryTopicPrefix+group, 1)
}

// EnsureRetryTopicWithCredentials is EnsureRetryTopic for an ACL-enabled
// broker (see EnsureTopicWithCredentials).
func EnsureRetryTopicWithCredentials(ctx context.Context, nameServers []string, brokerAddr, group string, cred primitive.Credentials) error {
	if group == "" {
		return errors.New("idemq/rocketmqadapter: EnsureRetryTopicWithCredentials needs a group")
	}
	return EnsureTopicWithCredentials(ctx, nameServers, brokerAddr, RetryTopicPrefix+group, 1, cred)
}
