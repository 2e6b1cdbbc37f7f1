package server

import (
	"log/slog"
	"sync"
	"time"
)

// failLog keeps a background task's repeated failures to two log lines
// per streak: a WARN for the first failure, and, with the first success
// after it, an INFO saying how long it failed and how many failures it
// did not log. A ten-minute Redis outage is then two lines per task,
// however often the task runs.
type failLog struct {
	warn, back string // the messages of the first failure's line and of the recovery's

	mu         sync.Mutex
	since      time.Time // the streak's first failure; zero while it succeeds
	suppressed int       // failures since the first, not logged
}

// fail records a failure: logged if it starts a streak, counted otherwise.
func (f *failLog) fail(log *slog.Logger, now time.Time, err error) {
	f.mu.Lock()
	first := f.since.IsZero()
	if first {
		f.since = now
	} else {
		f.suppressed++
	}
	f.mu.Unlock()
	if first {
		log.Warn(f.warn, "err", err)
	}
}

// ok records a success: the end of a streak, if one was under way, is
// logged with the count of failures not logged.
func (f *failLog) ok(log *slog.Logger, now time.Time) {
	f.mu.Lock()
	since, n := f.since, f.suppressed
	f.since, f.suppressed = time.Time{}, 0
	f.mu.Unlock()
	if !since.IsZero() {
		log.Info(f.back, "failed_for", now.Sub(since).Round(time.Millisecond).String(), "failures_not_logged", n)
	}
}
