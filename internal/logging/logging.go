// Package logging gives a Grove process one log: slog in text or JSON, at a
// chosen level, in one file per node, with the libraries' own loggers
// (hashicorp/raft's hclog) routed into it in the same format, rate-limited
// so that a flood of identical lines costs one line per interval.
package logging

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"

	"github.com/grovestore/grove/internal/ratelog"
)

// Formats and levels the flags accept.
var (
	Formats = []string{"text", "json"}
	Levels  = []string{"debug", "info", "warn", "error"}
)

// ParseLevel parses --log-level.
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info", "":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("log level %q: want one of %s", s, strings.Join(Levels, ", "))
}

// CheckFormat checks --log-format.
func CheckFormat(s string) error {
	if s == "text" || s == "json" {
		return nil
	}
	return fmt.Errorf("log format %q: want text or json", s)
}

// New returns a logger writing to w.
func New(w io.Writer, format, level string) (*slog.Logger, error) {
	lv, err := ParseLevel(level)
	if err != nil {
		return nil, err
	}
	if err := CheckFormat(format); err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: lv}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}

// OpenFile opens (appending) a node's log file, creating its directory.
// "-" is standard error.
func OpenFile(path string) (io.WriteCloser, error) {
	if path == "-" {
		return nopCloser{os.Stderr}, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	return os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// HCLog adapts l to hashicorp's hclog interface (what hashicorp/raft logs
// through), so that raft's lines land in the node's log in the node's
// format. Lines are rate-limited by message through limit (nil: not
// limited); onMsg, if set, sees every message, passed or not (for counting
// garbage). level is the least level passed on.
func HCLog(l *slog.Logger, name string, level hclog.Level, limit *ratelog.Limiter, onMsg func(msg string)) hclog.Logger {
	h := &hcl{l: l, name: name, limit: limit, onMsg: onMsg}
	h.level.Store(int32(level))
	return h
}

type hcl struct {
	l       *slog.Logger
	name    string
	implied []any
	level   atomic.Int32
	limit   *ratelog.Limiter
	onMsg   func(string)
}

var _ hclog.Logger = (*hcl)(nil)

func slogLevel(l hclog.Level) slog.Level {
	switch {
	case l <= hclog.Debug:
		return slog.LevelDebug
	case l == hclog.Info:
		return slog.LevelInfo
	case l == hclog.Warn:
		return slog.LevelWarn
	}
	return slog.LevelError
}

func (h *hcl) Log(level hclog.Level, msg string, args ...any) {
	if h.onMsg != nil {
		h.onMsg(msg)
	}
	if level < hclog.Level(h.level.Load()) || level == hclog.Off {
		return
	}
	if h.limit != nil {
		ok, n := h.limit.Allow(h.name + ": " + msg)
		if !ok {
			return
		}
		if n > 0 {
			args = append(args, "suppressed", n)
		}
	}
	all := make([]any, 0, 2+len(h.implied)+len(args))
	all = append(all, "component", h.name)
	all = append(all, h.implied...)
	all = append(all, args...)
	h.l.Log(context.Background(), slogLevel(level), msg, all...)
}

func (h *hcl) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *hcl) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *hcl) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *hcl) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *hcl) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }
func (h *hcl) IsTrace() bool                 { return hclog.Level(h.level.Load()) <= hclog.Trace }
func (h *hcl) IsDebug() bool                 { return hclog.Level(h.level.Load()) <= hclog.Debug }
func (h *hcl) IsInfo() bool                  { return hclog.Level(h.level.Load()) <= hclog.Info }
func (h *hcl) IsWarn() bool                  { return hclog.Level(h.level.Load()) <= hclog.Warn }
func (h *hcl) IsError() bool                 { return hclog.Level(h.level.Load()) <= hclog.Error }
func (h *hcl) ImpliedArgs() []any            { return h.implied }
func (h *hcl) Name() string                  { return h.name }
func (h *hcl) SetLevel(l hclog.Level)        { h.level.Store(int32(l)) }
func (h *hcl) GetLevel() hclog.Level         { return hclog.Level(h.level.Load()) }

func (h *hcl) clone() *hcl {
	c := &hcl{l: h.l, name: h.name, implied: append([]any{}, h.implied...), limit: h.limit, onMsg: h.onMsg}
	c.level.Store(h.level.Load())
	return c
}

func (h *hcl) With(args ...any) hclog.Logger {
	c := h.clone()
	c.implied = append(c.implied, args...)
	return c
}

func (h *hcl) Named(name string) hclog.Logger {
	c := h.clone()
	if c.name != "" {
		name = c.name + "." + name
	}
	c.name = name
	return c
}

func (h *hcl) ResetNamed(name string) hclog.Logger {
	c := h.clone()
	c.name = name
	return c
}

func (h *hcl) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(opts), "", 0)
}

// StandardWriter turns lines written by a standard library logger into
// entries, at the level of a "[WARN]"-style tag when one is present.
func (h *hcl) StandardWriter(*hclog.StandardLoggerOptions) io.Writer { return &stdWriter{h: h} }

type stdWriter struct {
	h  *hcl
	mu sync.Mutex
}

func (w *stdWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, line := range bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n")) {
		s := strings.TrimSpace(string(line))
		lv := hclog.Info
		for tag, l := range map[string]hclog.Level{"[TRACE]": hclog.Trace, "[DEBUG]": hclog.Debug, "[INFO]": hclog.Info, "[WARN]": hclog.Warn, "[ERR]": hclog.Error, "[ERROR]": hclog.Error} {
			if i := strings.Index(s, tag); i >= 0 {
				lv, s = l, strings.TrimSpace(s[i+len(tag):])
				break
			}
		}
		if s != "" {
			w.h.Log(lv, s)
		}
	}
	return len(b), nil
}
