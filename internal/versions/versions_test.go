package versions

import (
	"strings"
	"testing"
)

func TestVersionsAgree(t *testing.T) {
	if want := "V" + strings.ReplaceAll(RocketMQ, ".", "_"); RocketMQVersionDesc != want {
		t.Errorf("RocketMQVersionDesc = %q, want %q (from RocketMQ %q)", RocketMQVersionDesc, want, RocketMQ)
	}
	for _, c := range []struct{ image, repo, tag string }{
		{KafkaImage, "apache/kafka", Kafka},
		{RocketMQImage, "apache/rocketmq", RocketMQ},
		{PostgresImage, "postgres", PostgresMajor},
		{RedisImage, "redis", RedisMajor},
	} {
		if c.image != c.repo+":"+c.tag {
			t.Errorf("image %q, want %s:%s", c.image, c.repo, c.tag)
		}
	}
	if !strings.HasSuffix(RocketMQHome, "-"+RocketMQ) {
		t.Errorf("RocketMQHome %q does not end in the version %s", RocketMQHome, RocketMQ)
	}
}
