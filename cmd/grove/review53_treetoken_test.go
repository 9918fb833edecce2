package main

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/cli"
)

// Outside review 53 of `grove tree put|del` under a write token
// (treetoken.go). Each subtest states what it expects of a correct CLI and
// fails on HEAD be0013b.

func review53Run(ctx context.Context, cmd *cobra.Command, args ...string) error {
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	return cmd.ExecuteContext(ctx)
}

func review53Code(err error) int { return cli.Code(err) }

// A value larger than the node's gRPC receive limit is refused by gRPC
// itself before any handler runs (ResourceExhausted, not marked
// NOT_APPLIED): nothing was applied, anywhere. treecall counts such an
// attempt as of unknown outcome, so the CLI resends the whole value to
// every endpoint and ends with exit 8 "may or may not have been applied";
// the untokened path (cli.DoWrite, and tree create today) exits 1 with
// gRPC's message. (The stand-in node's limit is gRPC's default 4 MiB; a
// node's is transport.MaxMessage, 33 MiB: a value read from standard
// input can exceed it.)
func TestReview53OversizeValueIsNotUnknown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := &tokStore{val: []byte("old"), recs: map[string]*pb.TreePutResponse{}}
	a, b := tokServe(t, &tokNode{st: st}), tokServe(t, &tokNode{st: st})
	big := strings.Repeat("x", 5<<20)
	err := review53Run(ctx, treePutCmd(), "t", "k", big, "--endpoints", a+","+b)
	t.Logf("a 5 MiB value over a 4 MiB limit: exit %d: %.300v", review53Code(err), err)
	if st.applied != 0 || len(st.tokens) != 0 {
		t.Fatalf("the handler ran: applied %d, attempts seen %d", st.applied, len(st.tokens))
	}
	if review53Code(err) == cli.ExitUnknown {
		t.Errorf("a write gRPC refused before any handler ran exits %d (outcome unknown), having been sent to both endpoints; want a definite failure (exit 1, or 2 as the README says of values over 1 MiB, checked before sending)", cli.ExitUnknown)
	}
}

// With --command-timeout 0 (the default of `tree put` and `tree del`:
// Register(cmd, 0), "wait until done or interrupted") the CLI makes one
// round over the endpoints: with one endpoint (the default, or --addr), a
// lost answer is never sent again although the token makes that safe, and
// the exit-8 message ends "last: <nil>" (ctx.Err() of a context that did
// not end).
func TestReview53NoTimeoutOneEndpoint(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resendFor := treeResendFor
	treeResendFor = 2 * time.Second // (30 s: its resends would take as long)
	t.Cleanup(func() { treeResendFor = resendFor })
	st := &tokStore{val: []byte("old"), recs: map[string]*pb.TreePutResponse{}}
	a := tokServe(t, &tokNode{st: st, fail: "cut"})
	err := review53Run(ctx, treePutCmd(), "t", "k", "new", "--addr", a)
	t.Logf("one endpoint losing its answer, no --command-timeout: exit %d, %d attempts: %v", review53Code(err), len(st.tokens), err)
	if review53Code(err) != cli.ExitUnknown {
		t.Fatalf("exit %d, want %d", review53Code(err), cli.ExitUnknown)
	}
	if strings.Contains(err.Error(), "<nil>") {
		t.Errorf("the message names no last error: %q", err.Error())
	}
	if len(st.tokens) < 2 {
		t.Errorf("the write was sent %d time(s) under its token, never again: with no time bound the token's window (not one round) could bound the resends", len(st.tokens))
	}
}

// An endpoint that accepts TCP but never speaks gRPC: Connect fails with
// ExitTimeout ("accepted the connection but did not answer"). cli.DoWrite
// (tree create, and tree put before HEAD) exits 4 with that message and
// its hint; treeWriteOnce folds every failure into one ExitUnavailable
// (3) "no endpoint could serve within 0s" with --command-timeout's hint.
// With --command-timeout set, the command's time ending while connecting
// is exit 4 under DoWrite, 3 here.
func TestReview53DialFailureExitCodes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, silent
		}
	}()
	ep := lis.Addr().String()

	for _, to := range []string{"0", "1s"} {
		old := review53Run(ctx, treeCreateCmd(), "t", "--addr", ep, "--dial-timeout", "300ms", "--command-timeout", to)
		neu := review53Run(ctx, treePutCmd(), "t", "k", "v", "--addr", ep, "--dial-timeout", "300ms", "--command-timeout", to)
		t.Logf("--command-timeout %s: DoWrite (tree create): exit %d: %v", to, review53Code(old), old)
		t.Logf("--command-timeout %s: treeWriteOnce (tree put): exit %d: %v", to, review53Code(neu), neu)
		if review53Code(neu) != review53Code(old) {
			t.Errorf("--command-timeout %s: tree put exits %d where the generic write path exits %d", to, review53Code(neu), review53Code(old))
		}
		if strings.Contains(neu.Error(), "within 0s") {
			t.Errorf("--command-timeout %s: the message says %q", to, "within 0s")
		}
	}
}
