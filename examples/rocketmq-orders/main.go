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
