// Command rocketmq-orders is a RocketMQ listener that creates orders in
// Postgres, wrapped by idemq so that every order is applied exactly once
// although RocketMQ delivers at least once.
//
// Usage:
//
//	rocketmq-orders demo      run the whole redelivery story against the real
//	                          broker and Postgres, print a summary, exit 1 if
//	                          an invariant fails
//	rocketmq-orders consume   run one consumer process (used by demo and by
//	                          the integration tests; see -h)
//
// Settings come from the environment: TEST_POSTGRES_DSN (default
// postgres://idemq:idemq@127.0.0.1:5432/idemq?sslmode=disable),
// TEST_ROCKETMQ_NAMESRV (default 127.0.0.1:9876, comma-separated),
// TEST_ROCKETMQ_BROKER (default 127.0.0.1:10911) and
// IDEMQ_FINGERPRINT_SECRET (a demo default otherwise).
package main

import (
	"fmt"
	"os"

	"github.com/idemq/idemq/internal/devenv"

	"github.com/apache/rocketmq-client-go/v2/rlog"
)

func main() {
	if os.Getenv("ROCKETMQ_GO_LOG_LEVEL") == "" {
		rlog.SetLogLevel("error")
	}
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "demo":
		err = runDemo(os.Args[2:])
	case "consume":
		err = runConsume(os.Args[2:])
	case "-h", "-help", "--help", "help":
		usage()
		return
	default:
		usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "rocketmq-orders:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprint(os.Stderr, `usage: rocketmq-orders demo [-keep] [-v]
       rocketmq-orders consume -topic T -group G [-mode idemq|naive] [flags]

demo runs the redelivery story (re-sends, a retry through %RETRY%, a poison
message, a SIGKILL between commit and ack) against RocketMQ and Postgres,
with and without idemq, and prints a summary.

environment: TEST_POSTGRES_DSN, TEST_ROCKETMQ_NAMESRV, TEST_ROCKETMQ_BROKER
`)
}

func postgresDSN() string {
	return devenv.PostgresDSN()
}

func nameServers() []string {
	return devenv.Split(devenv.RocketMQNamesrv())
}

func brokerAddr() string { return devenv.RocketMQBroker() }

// fingerprintSecret would come from a secret store in production.
func fingerprintSecret() []byte {
	return []byte(devenv.Get("IDEMQ_FINGERPRINT_SECRET", "demo-only-fingerprint-secret-change-me"))
}
