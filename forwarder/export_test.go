package forwarder

// BeforeCommit makes t call f before each Kafka transaction commits.
func BeforeCommit(t *KafkaTarget, f func()) { t.beforeCommit = f }

// WithoutTailRead makes t forget, when it (re)gains a partition, what the
// partition already wrote to Kafka: transactions alone.
func WithoutTailRead(t *KafkaTarget) { t.noTailRead = true }
