package kafkapub

// MessagingSystem returns "kafka", the OpenTelemetry messaging.system of
// the relay's producer spans (outbox.MessagingSystem).
func (p *Publisher) MessagingSystem() string { return "kafka" }
