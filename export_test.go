package outbox

// Jitter exposes the backoff jitter to the tests.
var Jitter = jitter
