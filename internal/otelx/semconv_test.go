package otelx

import (
	"runtime/debug"
	"testing"

	"github.com/idemq/idemq/dedup"
)

func TestVersionOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		bi   debug.BuildInfo
		want string
	}{
		{"main module", debug.BuildInfo{Main: debug.Module{Path: modulePath, Version: "v1.2.3"}}, "v1.2.3"},
		{"dependency", debug.BuildInfo{Main: debug.Module{Path: "example.com/app"},
			Deps: []*debug.Module{{Path: "other", Version: "v9"}, {Path: modulePath, Version: "v0.4.0"}}}, "v0.4.0"},
		{"replaced", debug.BuildInfo{Deps: []*debug.Module{{Path: modulePath, Version: "v0.4.0", Replace: &debug.Module{Path: "../idemq", Version: "v0.5.0"}}}}, "v0.5.0"},
		{"none", debug.BuildInfo{Main: debug.Module{Path: "example.com/app"}}, develVersion},
	} {
		if got := versionOf(&tc.bi); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	if ModuleVersion() == "" {
		t.Error("ModuleVersion is empty")
	}
}

func TestSystemAndBatchProcess(t *testing.T) {
	for src, want := range map[string]string{"kafka:payments/2/1": "kafka", "rocketmq:%RETRY%g/b/1/17": "rocketmq", "test:0": "", "orders/0/1": ""} {
		if got := System(src); got != want {
			t.Errorf("System(%q) = %q, want %q", src, got, want)
		}
	}
	name, attrs := BatchProcess([]*dedup.Message{{Topic: "a", Source: "kafka:a/0/1"}, {Topic: "a", Source: "kafka:a/1/1"}}, "g")
	got := map[string]string{}
	for _, a := range attrs {
		got[string(a.Key)] = a.Value.String()
	}
	if name != "process a" || got["messaging.system"] != "kafka" || got["messaging.destination.name"] != "a" || got["messaging.batch.message_count"] != "2" || got["messaging.operation.type"] != "process" {
		t.Errorf("one topic: %q %v", name, got)
	}
	name, attrs = BatchProcess([]*dedup.Message{{Topic: "a", Source: "kafka:a/0/1"}, {Topic: "b", Source: "rocketmq:b/x/0/1"}}, "g")
	got = map[string]string{}
	for _, a := range attrs {
		got[string(a.Key)] = a.Value.String()
	}
	if _, ok := got["messaging.destination.name"]; name != "process" || ok || got["messaging.system"] != "" {
		t.Errorf("mixed: %q %v", name, got)
	}
}
