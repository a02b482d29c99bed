package forwarder

// permanentError marks an error that no retry can cure. (Kept for
// kafka.go and kafka_txn.go while they are here; the JetStream target
// moved to package forwarder/jetstream with its own.)
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }
