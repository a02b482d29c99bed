// Package worker runs a background task as a loop that paces itself.
//
// [Run] calls [Action.Execute] over and over until its context is cancelled.
// Each call returns a [Directive] telling the loop what to do next:
//
//   - [Proceed]: work was done and more is likely. Wait the pacing delay
//     (ActiveInterval after an idle spell, ramping down by RampStep per
//     further Proceed to MinInterval; see [tune.Pacing]) and call again.
//   - [Idle]: nothing to do. Wait until the [Poker] is poked or
//     IdleInterval passes, whichever comes first, and call again.
//   - [Sleep]: wait exactly the given duration (an explicit backoff chosen by
//     the action, e.g. after a handler asked for a retry) and call again.
//     Pokes do not cut a Sleep short; a poke that arrives meanwhile is kept
//     and wakes the worker the next time it is idle.
//
// If Execute returns an error or panics, the loop backs off exponentially
// (Backoff.Base·2^(n-1) for the n-th consecutive failure, capped at
// Backoff.Max), reports the failure through [Config.OnFailure], and calls
// again; the first successful call resets the backoff. A panic is recovered
// and reported as a [*PanicError]. The loop never stops on its own.
//
// Cancelling the context stops the loop promptly: a wait ends at once, a
// pending [Bulkhead] acquisition is abandoned, and an Execute in flight sees
// the cancelled context (Run returns as soon as that call returns).
//
// A [Bulkhead] shared by several workers limits how many of them execute at
// the same time, e.g. how many partition workers query the database at once.
// The permit is held only while Execute runs, never while waiting.
//
// A [Poker] wakes an idle worker early. Pokes coalesce: any number of pokes
// while the worker is busy result in one extra call. Poking never blocks.
//
// Run starts no goroutines of its own; it runs entirely on the caller's
// goroutine.
package worker
