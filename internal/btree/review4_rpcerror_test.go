package btree

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A write refused because a node's chunk could not be read (locate's
// error, marked by refused) carries, in production, the chunk clerk's
// error, which wraps the last attempt's gRPC status (chunk/clerk.go
// retry: "gave up (%w); the last attempt, on node %d: %w"). rpcError's
// first check returns any error that wraps a gRPC status as it is, so the
// NOT_APPLIED mark is dropped: the client reports ErrUnknownOutcome for a
// write that provably did nothing. (The simulator's chunk errors are plain
// errors, so it exercises the other branch.)
func TestReview4RefusedWrappingGRPCStatusLosesMark(t *testing.T) {
	last := status.Error(codes.Unavailable, "connection error: desc = \"transport: Error while dialing: dial tcp 127.0.0.1:7001: connect: connection refused\"")
	clerkErr := fmt.Errorf("reading 8192 bytes at 0 of chunk 1:7: gave up (%w); the last attempt, on node 2: %w", context.DeadlineExceeded, last)
	err := refused(fmt.Errorf("btree: reading node 1:7: %w", clerkErr))
	st := status.Convert(rpcError(err))
	if !IsNotApplied(st) {
		t.Fatalf("refused(chunk read failure) answers %v %q without NOT_APPLIED", st.Code(), st.Message())
	}
}
