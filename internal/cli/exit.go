// Package cli is the machinery every `grove` subcommand shares: where the
// cluster is (--endpoints, --addr, GROVE_ENDPOINTS), how long to wait
// (--dial-timeout, --command-timeout), how to print (-o table|json), and
// what an error means to a script (exit codes). Later layers' commands
// (rldev, chunk, tree, table, vdisk, fs) use it unchanged, so that every
// command of the binary behaves the same way.
package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Exit codes of every grove command (README: "Exit codes"). Scripts rely
// on them: never renumber one.
const (
	ExitOK          = 0   // success
	ExitFailed      = 1   // the operation was refused or failed (the message says why)
	ExitUsage       = 2   // bad usage: unknown command or flag, bad argument, bad config file
	ExitUnavailable = 3   // no endpoint answered, or the cluster cannot serve (no quorum, no master)
	ExitTimeout     = 4   // --dial-timeout or --command-timeout elapsed
	ExitNotFound    = 5   // the named object does not exist (member, lock, key...)
	ExitDegraded    = 6   // status/health: the cluster answered but is not healthy
	ExitLeaseLost   = 7   // a held lock's lease was lost (its node fenced itself or was declared dead)
	ExitUnknown     = 8   // a write's answer was lost: it may or may not have been applied (DoWrite)
	ExitInterrupted = 130 // SIGINT (128+2); SIGTERM gives 143
)

// Error is a command's failure with the exit code it maps to. Its message
// names the operation and, when one is involved, the endpoint:
// "status: 127.0.0.1:7499 refused the connection; is the cluster running? (grove up)".
type Error struct {
	Code     int
	Op       string // "status", "lock list", ...
	Endpoint string // empty if none is involved
	Msg      string // what happened, in words (not a raw gRPC status)
	Hint     string // what to do about it (optional)
	Err      error  // the underlying error, for errors.Is/As
	// Usage: the command line itself was wrong (print the usage with it).
	Usage bool
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Op != "" {
		b.WriteString(e.Op)
		b.WriteString(": ")
	}
	if e.Endpoint != "" {
		b.WriteString(e.Endpoint)
		b.WriteString(" ")
	}
	b.WriteString(e.Msg)
	if e.Hint != "" {
		b.WriteString("; ")
		b.WriteString(e.Hint)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Usagef is a bad-usage error (exit 2); the command's usage is printed
// with it.
func Usagef(format string, args ...any) error {
	return &Error{Code: ExitUsage, Msg: fmt.Sprintf(format, args...), Usage: true}
}

// Failf is an operation failure (exit 1).
func Failf(op, format string, args ...any) error {
	return &Error{Code: ExitFailed, Op: op, Msg: fmt.Sprintf(format, args...)}
}

// WithCode attaches an exit code to err (nil stays nil).
func WithCode(code int, op string, err error) error {
	if err == nil {
		return nil
	}
	var ce *Error
	if errors.As(err, &ce) {
		return err
	}
	return &Error{Code: code, Op: op, Msg: err.Error(), Err: err}
}

// ExitStatus is what a command ended with when it is not an error of its
// own: `grove lock NAME -- COMMAND` passes its command's status through.
type ExitStatus int

func (s ExitStatus) Error() string { return fmt.Sprintf("exit status %d", int(s)) }

// Interrupted is returned by a command stopped by a signal before it
// finished (exit 128+signal).
type Interrupted struct{ Signal string }

func (i Interrupted) Error() string { return "interrupted (" + i.Signal + ")" }

// Code returns the exit code for err (0 for nil).
func Code(err error) int {
	if err == nil {
		return ExitOK
	}
	var st ExitStatus
	if errors.As(err, &st) {
		return int(st)
	}
	var in Interrupted
	if errors.As(err, &in) {
		if in.Signal == "terminated" {
			return 143
		}
		return ExitInterrupted
	}
	var ce *Error
	if errors.As(err, &ce) {
		return ce.Code
	}
	return ExitFailed
}

// FromRPC turns the error of a call to endpoint into an Error naming op and
// endpoint, with the exit code its gRPC status means. timeout is the
// --command-timeout in force, for the message.
func FromRPC(op, endpoint string, timeout time.Duration, err error) error {
	if err == nil {
		return nil
	}
	var ce *Error
	if errors.As(err, &ce) {
		return err
	}
	e := &Error{Code: ExitFailed, Op: op, Endpoint: endpoint, Err: err}
	if errors.Is(err, context.DeadlineExceeded) {
		e.Code, e.Msg, e.Hint = ExitTimeout, fmt.Sprintf("did not finish within %v", timeout), "raise --command-timeout, or try another endpoint"
		return e
	}
	st, ok := status.FromError(err)
	if !ok {
		e.Msg = err.Error()
		return e
	}
	msg := st.Message()
	switch st.Code() {
	case codes.DeadlineExceeded:
		e.Code, e.Msg, e.Hint = ExitTimeout, fmt.Sprintf("did not finish within %v", timeout), "raise --command-timeout, or try another endpoint"
		if msg != "" && !strings.Contains(msg, "deadline") {
			e.Msg += " (" + msg + ")"
		}
	case codes.Unavailable:
		e.Code, e.Msg = ExitUnavailable, "cannot serve: "+msg
	case codes.NotFound:
		e.Code, e.Msg = ExitNotFound, msg
	case codes.InvalidArgument:
		e.Code, e.Msg = ExitUsage, msg
	case codes.Canceled:
		e.Code, e.Msg = ExitInterrupted, "cancelled"
	case codes.Unimplemented:
		e.Msg, e.Hint = "does not serve this call", "is it a grove node of the same version? (grove version)"
		if strings.Contains(msg, "HTTP status code") || strings.Contains(msg, "content-type") {
			e.Msg, e.Hint = "answered HTTP, not gRPC", "is it a grove node's gRPC port?"
		}
	default:
		e.Msg = msg
	}
	return e
}
