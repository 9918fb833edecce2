// Package ratelog keeps repeated log lines from flooding a node's log: a
// line with a given key is let through at most once per interval, and the
// next one that passes says how many were held back meanwhile. A flood of
// garbage packets, a retry loop against a config service that is down, or
// every clerk losing its master at once then costs a line per interval.
package ratelog

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// MaxKeys bounds the keys remembered; past it the oldest half is forgotten
// (keys are reasons and addresses: few, but not trusted to stay few).
const MaxKeys = 1024

// Limiter decides which lines pass. The zero value is unusable; use New.
// Safe for concurrent use.
type Limiter struct {
	every time.Duration
	mu    sync.Mutex
	seen  map[string]*entry
}

type entry struct {
	last  time.Time
	quiet int
}

// New returns a limiter that lets each key through once per every.
func New(every time.Duration) *Limiter {
	return &Limiter{every: every, seen: map[string]*entry{}}
}

// Allow reports whether a line with key may be logged now and, if so, how
// many lines with that key were held back since the last one.
func (l *Limiter) Allow(key string) (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	e := l.seen[key]
	if e == nil {
		if len(l.seen) >= MaxKeys {
			l.forgetOldest()
		}
		l.seen[key] = &entry{last: now}
		return true, 0
	}
	if now.Sub(e.last) < l.every {
		e.quiet++
		return false, 0
	}
	n := e.quiet
	e.last, e.quiet = now, 0
	return true, n
}

func (l *Limiter) forgetOldest() {
	cut := time.Now().Add(-l.every)
	for k, e := range l.seen {
		if e.last.Before(cut) {
			delete(l.seen, k)
		}
	}
	if len(l.seen) >= MaxKeys { // all recent: drop arbitrary half
		i := 0
		for k := range l.seen {
			if i%2 == 0 {
				delete(l.seen, k)
			}
			i++
		}
	}
}

// Writer rate-limits a line-oriented log stream (a library's own logger,
// such as hashicorp/raft's): lines are keyed by their text after the level
// tag ("] ") up to the first '=' (so timestamps and field values do not
// make every line unique). onLine, if set, sees every key, passed or not
// (for counting). Each Write must hold whole lines, as loggers write them.
func Writer(w io.Writer, l *Limiter, onLine func(key string)) io.Writer {
	return &writer{w: w, l: l, onLine: onLine}
}

type writer struct {
	w      io.Writer
	l      *Limiter
	onLine func(string)
}

func (w *writer) Write(b []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line == "" {
			continue
		}
		key := line
		if i := strings.Index(key, "] "); i >= 0 {
			key = key[i+2:]
		}
		if i := strings.IndexByte(key, '='); i >= 0 {
			key = key[:i]
		}
		key = strings.TrimSpace(key)
		if w.onLine != nil {
			w.onLine(key)
		}
		ok, n := w.l.Allow(key)
		if !ok {
			continue
		}
		if n > 0 {
			line = strings.TrimRight(line, "\n") + fmt.Sprintf(" (%d similar lines suppressed)\n", n)
		}
		if _, err := io.WriteString(w.w, line); err != nil {
			return 0, err
		}
	}
	return len(b), nil
}
