package rocketmqadapter

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
)

// fakeRemoting is a Remoting server for unit tests of the adapter's own
// requests: answer maps a request (header, body) to a response code,
// remark and body.
func fakeRemoting(t *testing.T, answer func(h remotingHeader, body []byte) (int16, string, []byte)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				var lens [8]byte
				if _, err := io.ReadFull(c, lens[:]); err != nil {
					return
				}
				total, hlen := binary.BigEndian.Uint32(lens[:4]), binary.BigEndian.Uint32(lens[4:])
				buf := make([]byte, total-4)
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				var h remotingHeader
				if err := json.Unmarshal(buf[:hlen], &h); err != nil {
					return
				}
				code, remark, body := answer(h, buf[hlen:])
				out, _ := json.Marshal(remotingHeader{Code: code, Language: "JAVA", Opaque: h.Opaque, Flag: 1, Remark: remark})
				frame := make([]byte, 8, 8+len(out)+len(body))
				binary.BigEndian.PutUint32(frame[:4], uint32(4+len(out)+len(body))) //nolint:gosec // a test frame of a few bytes
				binary.BigEndian.PutUint32(frame[4:], uint32(len(out)))             //nolint:gosec // a test frame of a few bytes
				_, _ = c.Write(append(append(frame, out...), body...))
			}()
		}
	}()
	return l.Addr().String()
}

// The route is read from the NameServer (fastjson's unquoted broker-ID keys
// included), only masters (ID 0) are asked, every request is signed, and the
// largest store horizon of the topic's brokers wins.
func TestReadStoreRetentionFromEveryMaster(t *testing.T) {
	cred := primitive.Credentials{AccessKey: "ak", SecretKey: "sk"}
	checkSigned := func(h remotingHeader, body []byte) bool {
		got := h.ExtFields["Signature"]
		ext := map[string]string{}
		for k, v := range h.ExtFields {
			ext[k] = v
		}
		sign(ext, body, cred)
		return got != "" && h.ExtFields["AccessKey"] == "ak" && ext["Signature"] == got
	}
	brokerA := fakeRemoting(t, func(h remotingHeader, body []byte) (int16, string, []byte) {
		switch {
		case !checkSigned(h, body):
			return resNoPermission, "check signature failed.", nil
		case h.Code == reqQueryConsumerOffset:
			return resQueryNotFound, "no offset yet", nil // a new group: not a refusal
		}
		return resSuccess, "", []byte("fileReservedTime=72\ndeleteWhen=04\n")
	})
	brokerB := fakeRemoting(t, func(h remotingHeader, body []byte) (int16, string, []byte) {
		if !checkSigned(h, body) {
			return resNoPermission, "check signature failed.", nil
		}
		return resSuccess, "", []byte("fileReservedTime=120\ndeleteWhen=01;13\n")
	})
	slave := fakeRemoting(t, func(remotingHeader, []byte) (int16, string, []byte) {
		t.Error("a slave was asked")
		return 1, "", nil
	})
	route := `{"brokerDatas":[{"brokerAddrs":{0:"` + brokerB + `",1:"` + slave + `"},"brokerName":"b","cluster":"c"},` +
		`{"brokerAddrs":{"0":"` + brokerA + `"},"brokerName":"a","cluster":"c"},{"brokerAddrs":{1:"` + slave + `"},"brokerName":"z"}],"queueDatas":[]}`
	ns := fakeRemoting(t, func(h remotingHeader, _ []byte) (int16, string, []byte) {
		if h.Code != reqGetRouteInfoByTopic || h.ExtFields["topic"] != "orders" {
			return resTopicNotExist, "no route", nil
		}
		return resSuccess, "", []byte(route)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rs, err := ReadStoreRetention(ctx, []string{"127.0.0.1:1", ns}, "orders", cred) // the first name server is down
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].BrokerName != "a" || rs[0].Horizon() != 96*time.Hour || rs[1].BrokerName != "b" || rs[1].Horizon() != 132*time.Hour {
		t.Fatalf("ReadStoreRetention = %+v; want a: 72h+24h, b: 120h+12h", rs)
	}
	h, err := (Config{NameServers: []string{ns}, Topic: "orders", Credentials: cred}).FullHorizon(ctx)
	if err != nil || h != 132*time.Hour {
		t.Fatalf("FullHorizon = %s, %v; want 132h (the largest broker)", h, err)
	}
	h, err = (Config{NameServers: []string{ns}, Topic: "orders", Credentials: cred, DLQReplayWindow: 100 * time.Hour}).FullHorizon(ctx)
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "DLQReplayWindow 100h0m0s") || !strings.Contains(err.Error(), "broker a") {
		t.Fatalf("a DLQ window beyond broker a's 72h: %s, %v; want ErrInvalidConfig naming it", h, err)
	}

	wrong := primitive.Credentials{AccessKey: "ak", SecretKey: "wrong"}
	if _, err := ReadStoreRetention(ctx, []string{ns}, "orders", wrong); !errors.Is(err, ErrAccessDenied) || strings.Contains(err.Error(), "wrong") {
		t.Fatalf("wrong secret: %v; want ErrAccessDenied, without the secret", err)
	}
	if err := probeAccess(ctx, []string{ns}, "orders", "g", wrong); !errors.Is(err, ErrAccessDenied) || !strings.Contains(err.Error(), `access key "ak"`) {
		t.Fatalf("probe with a wrong secret: %v; want ErrAccessDenied naming the access key", err)
	}
	if err := probeAccess(ctx, []string{ns}, "orders", "g", cred); err != nil {
		t.Fatalf("probe with the right credentials: %v", err)
	}
	if _, err := ReadStoreRetention(ctx, []string{ns}, "missing", cred); err == nil || !strings.Contains(err.Error(), "code 17") {
		t.Fatalf("no route: %v; want the NameServer's TOPIC_NOT_EXIST", err)
	}
}
