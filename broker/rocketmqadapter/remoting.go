package rocketmqadapter

import (
	"context"
	"crypto/hmac"
	"crypto/sha1" //nolint:gosec // RocketMQ's request signature is HMAC-SHA1 (ACL 1.0, accepted by 5.x)
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
)

// Remoting request and response codes the adapter sends itself, for the
// admin requests rocketmq-client-go does not sign (its admin client never
// registers its ACL interceptor for CreateTopic) or does not offer.
const (
	reqUpdateAndCreateTopic int16 = 17  // UPDATE_AND_CREATE_TOPIC
	reqQueryConsumerOffset  int16 = 14  // QUERY_CONSUMER_OFFSET
	reqGetBrokerConfig      int16 = 26  // GET_BROKER_CONFIG
	reqGetRouteInfoByTopic  int16 = 105 // GET_ROUTEINFO_BY_TOPIC

	resSuccess             int16 = 0
	resSystemBusy          int16 = 2
	resServiceNotAvailable int16 = 14
	resNoPermission        int16 = 16
	resTopicNotExist       int16 = 17
	resQueryNotFound       int16 = 22
)

// remotingTimeout bounds one admin request (dial, write, read) when the
// context has no earlier deadline.
const remotingTimeout = 5 * time.Second

// maxFrame bounds a response frame (a broker config is a few KiB, a route a
// few KiB per broker).
const maxFrame = 16 << 20

var remotingOpaque atomic.Int32

// BrokerError is a RocketMQ broker's (or NameServer's) refusal of an admin
// request the adapter sent: its Remoting response code (16 NO_PERMISSION
// for an authentication or authorization failure, 2 SYSTEM_BUSY,
// 14 SERVICE_NOT_AVAILABLE, 17 TOPIC_NOT_EXIST, ...) and remark. Match it
// with errors.As.
type BrokerError struct {
	Addr    string // the server's "host:port"
	Request string // what was asked, e.g. "GET_BROKER_CONFIG"
	Code    int16
	Remark  string
}

// Error names the request, the server, the code and the remark.
func (e *BrokerError) Error() string {
	return fmt.Sprintf("idemq/rocketmqadapter: %s at %s refused: code %d: %s", e.Request, e.Addr, e.Code, e.Remark)
}

// ErrAccessDenied is wrapped by every error of a request the broker refused
// with NO_PERMISSION (16): the credentials are wrong (unknown access key,
// bad signature) or lack the permission. Start and EnsureTopicWithCredentials
// return it.
var ErrAccessDenied = errors.New("idemq/rocketmqadapter: access denied by the broker (check Credentials: access key, secret key and the user's permissions)")

// Is lets errors.Is(err, ErrAccessDenied) hold for a NO_PERMISSION reply.
func (e *BrokerError) Is(target error) bool {
	return target == ErrAccessDenied && e.Code == resNoPermission
}

type remotingHeader struct {
	Code      int16             `json:"code"`
	Language  string            `json:"language"`
	Version   int16             `json:"version"`
	Opaque    int32             `json:"opaque"`
	Flag      int32             `json:"flag"`
	Remark    string            `json:"remark"`
	ExtFields map[string]string `json:"extFields"`
}

// remotingVersion is the client version sent with the adapter's own
// requests: rocketmq-client-go's (V4_9_4 and later get standard JSON
// routes from the NameServer).
const remotingVersion = 431

// sign adds the ACL signature to ext as the broker checks it (ACL 1.0,
// which RocketMQ 5.x's DefaultAuthenticationProvider accepts for Remoting):
// HMAC-SHA1 with the secret key over the values of every extension field
// but Signature, in key order, followed by the body, base64 encoded.
func sign(ext map[string]string, body []byte, cred primitive.Credentials) {
	ext["AccessKey"] = cred.AccessKey
	if cred.SecurityToken != "" {
		ext["SecurityToken"] = cred.SecurityToken
	}
	keys := make([]string, 0, len(ext))
	for k := range ext {
		if k != "Signature" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	mac := hmac.New(sha1.New, []byte(cred.SecretKey))
	for _, k := range keys {
		mac.Write([]byte(ext[k]))
	}
	mac.Write(body)
	ext["Signature"] = base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// invoke sends one Remoting request (JSON header, signed when cred has an
// access key) to addr and returns the response's header and body. A
// transport failure is returned as is; the caller checks the code.
func invoke(ctx context.Context, addr string, code int16, ext map[string]string, body []byte, cred primitive.Credentials) (remotingHeader, []byte, error) {
	if ext == nil {
		ext = map[string]string{}
	}
	if cred.AccessKey != "" {
		sign(ext, body, cred)
	}
	req := remotingHeader{Code: code, Language: "GO", Version: remotingVersion, Opaque: remotingOpaque.Add(1), ExtFields: ext}
	hdr, err := json.Marshal(req)
	if err != nil {
		return remotingHeader{}, nil, err
	}
	if len(hdr)+len(body) > maxFrame {
		return remotingHeader{}, nil, fmt.Errorf("idemq/rocketmqadapter: request of %d bytes exceeds the %d-byte frame limit", len(hdr)+len(body), maxFrame)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, remotingTimeout)
		defer cancel()
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return remotingHeader{}, nil, err
	}
	defer func() { _ = conn.Close() }()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	frame := make([]byte, 8, 8+len(hdr)+len(body))
	binary.BigEndian.PutUint32(frame[0:4], uint32(4+len(hdr)+len(body))) //nolint:gosec // bounded by maxFrame above
	binary.BigEndian.PutUint32(frame[4:8], uint32(len(hdr)))             //nolint:gosec // bounded by maxFrame above; serialize type 0: JSON
	frame = append(append(frame, hdr...), body...)
	if _, err := conn.Write(frame); err != nil {
		return remotingHeader{}, nil, err
	}
	var lens [8]byte
	if _, err := io.ReadFull(conn, lens[:]); err != nil {
		return remotingHeader{}, nil, err
	}
	total := binary.BigEndian.Uint32(lens[0:4])
	hlen := binary.BigEndian.Uint32(lens[4:8]) & 0xFFFFFF
	if total > maxFrame || hlen+4 > total {
		return remotingHeader{}, nil, fmt.Errorf("idemq/rocketmqadapter: bad Remoting frame from %s (length %d, header %d)", addr, total, hlen)
	}
	buf := make([]byte, total-4)
	if _, err := io.ReadFull(conn, buf); err != nil {
		return remotingHeader{}, nil, err
	}
	var resp remotingHeader
	if err := json.Unmarshal(buf[:hlen], &resp); err != nil {
		return remotingHeader{}, nil, fmt.Errorf("idemq/rocketmqadapter: bad Remoting header from %s: %w", addr, err)
	}
	return resp, buf[hlen:], nil
}

// call is invoke that turns any response code but the accepted ones
// (default: SUCCESS) into a *BrokerError naming what.
func call(ctx context.Context, addr, what string, code int16, ext map[string]string, body []byte, cred primitive.Credentials, accept ...int16) ([]byte, error) {
	resp, out, err := invoke(ctx, addr, code, ext, body, cred)
	if err != nil {
		return nil, fmt.Errorf("idemq/rocketmqadapter: %s at %s: %w", what, addr, err)
	}
	if resp.Code == resSuccess {
		return out, nil
	}
	for _, c := range accept {
		if resp.Code == c {
			return out, nil
		}
	}
	return nil, &BrokerError{Addr: addr, Request: what, Code: resp.Code, Remark: resp.Remark}
}

// topicRoute is the part of a NameServer's TopicRouteData the adapter
// reads: the brokers serving a topic.
type topicRoute struct {
	BrokerDatas []struct {
		Cluster     string            `json:"cluster"`
		BrokerName  string            `json:"brokerName"`
		BrokerAddrs map[string]string `json:"brokerAddrs"` // broker ID ("0": master) → "host:port"
	} `json:"brokerDatas"`
}

// bareKeys matches fastjson's unquoted integer map keys ({0:"addr"}), which
// older NameServers send in routes.
var bareKeys = regexp.MustCompile(`([{,])\s*(-?\d+)\s*:`)

// masterBrokers returns the address of the master (broker ID 0) of every
// broker of topic's route, asking the name servers in turn, with the broker
// name, sorted by name.
func masterBrokers(ctx context.Context, nameServers []string, topic string, cred primitive.Credentials) ([][2]string, error) {
	var errs []error
	for _, ns := range nameServers {
		body, err := call(ctx, ns, "GET_ROUTEINFO_BY_TOPIC "+topic, reqGetRouteInfoByTopic, map[string]string{"topic": topic}, nil, cred)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var r topicRoute
		if err := json.Unmarshal(bareKeys.ReplaceAll(body, []byte(`$1"$2":`)), &r); err != nil {
			errs = append(errs, fmt.Errorf("idemq/rocketmqadapter: route of %s from %s: %w", topic, ns, err))
			continue
		}
		var out [][2]string
		for _, b := range r.BrokerDatas {
			if addr := b.BrokerAddrs["0"]; addr != "" {
				out = append(out, [2]string{b.BrokerName, addr})
			}
		}
		if len(out) == 0 {
			errs = append(errs, fmt.Errorf("idemq/rocketmqadapter: route of %s from %s lists no master broker", topic, ns))
			continue
		}
		sort.Slice(out, func(i, j int) bool { return out[i][0] < out[j][0] })
		return out, nil
	}
	return nil, errors.Join(errs...)
}

// parseProperties parses a broker's properties text ("key=value" lines, as
// GET_BROKER_CONFIG returns it).
func parseProperties(body []byte) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(string(body), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if ok {
			out[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return out
}
