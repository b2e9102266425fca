package main

import (
	"github.com/idemq/idemq/internal/devenv"
)

func main() {
	devenv.Main("http-payments", "http-payments demo | http-payments serve [flags]", map[string]devenv.Command{
		"demo":  runDemo,
		"serve": runServe,
	})
}

// redisAddr is TEST_REDIS_ADDR or the local default.
func redisAddr() string { return devenv.Get("TEST_REDIS_ADDR", "127.0.0.1:6379") }
