package rocketmqpub

// MessagingSystem returns "rocketmq", the OpenTelemetry messaging.system of
// the relay's producer spans (outbox.MessagingSystem).
func (p *Publisher) MessagingSystem() string { return "rocketmq" }
