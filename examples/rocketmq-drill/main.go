package main

import (
	"os"

	"github.com/apache/rocketmq-client-go/v2/rlog"
	"github.com/idemq/idemq/internal/devenv"
)

const usage = `rocketmq-drill run [-modes push,pull] [-messages N] [-kills K] [-interval D] [-handler-delay D] [-keep]
       rocketmq-drill consume -mode push|pull -topic T -group G -schema S (a consumer process; run starts them)`

func main() {
	if os.Getenv("ROCKETMQ_GO_LOG_LEVEL") == "" {
		rlog.SetLogLevel("error")
	}
	devenv.Main("rocketmq-drill", usage, map[string]devenv.Command{"run": runDrill, "consume": runConsume})
}

func postgresDSN() string   { return devenv.PostgresDSN() }
func nameServers() []string { return devenv.Split(devenv.RocketMQNamesrv()) }
func brokerAddr() string    { return devenv.RocketMQBroker() }

// fingerprintSecret would come from a secret store in production.
func fingerprintSecret() []byte {
	return []byte(devenv.Get("IDEMQ_FINGERPRINT_SECRET", "drill-only-fingerprint-secret-change-me"))
}
