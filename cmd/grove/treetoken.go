package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/btree"
	"github.com/grovestore/grove/internal/cli"
	"github.com/grovestore/grove/internal/treecall"
)

// treeWriteOnce runs a put or delete under a write token (PutOnce,
// DeleteOnce), by the Go client's rules (package treecall): after an
// attempt of unknown outcome (the node died mid-call, the connection broke,
// the attempt's third of --command-timeout passed) it sends the write again,
// to the next endpoint, under the same token, and the node answers from the
// write's completion record if an earlier attempt took effect. So a lost
// answer no longer ends the command with ExitUnknown while the cluster
// serves: only when the command's time ends after such an attempt, or when
// the write's record is gone. The endpoints are tried in turn, round after
// round (a pause between rounds), until the command's time ends (with no
// --command-timeout, until treeResendFor after the first send). A cluster
// that takes no tokens (TOKENS_OFF, or a node of a build from before them:
// Unimplemented) gets the write untokened, and it is then sent again only
// where treeWrite would. send makes one attempt: tok nil means untokened
// (Put, Delete).
//
// The token names the tree (its anchor, looked up before the first send):
// a node refuses an attempt that reaches a tree made again under the name
// since (TREE_CHANGED), which would otherwise apply afresh.
func treeWriteOnce(ctx context.Context, c *cli.Client, op, tree string, send func(ctx context.Context, tc pb.TreeServiceClient, tok *pb.TreeWriteToken) error) error {
	ctx, cancel, err := c.Begin(ctx)
	defer cancel()
	if err != nil {
		return err
	}
	// Each attempt has a third of the command's time; with none (the
	// default: until done or interrupted), treeAttempt, and rounds of
	// resends stop treeResendFor after the first send, within the token's
	// window (review 53: with no time, one round, and one endpoint never
	// got a resend).
	attemptTimeout := c.CommandTimeout / 3
	if c.CommandTimeout <= 0 {
		attemptTimeout = treeAttempt
	}
	// The token is made at the first send (its stamp is that send's time:
	// the window counts from it, not from the command's start).
	var tok *pb.TreeWriteToken
	var firstSend time.Time
	call := &treecall.Call{Kind: treecall.Write, Tokened: true}
	fails := map[string]*cli.Error{} // the last failure per endpoint
	var order []string
	fail := func(ep string, err error) {
		var ce *cli.Error
		if !errors.As(err, &ce) {
			ce = &cli.Error{Code: cli.ExitFailed, Endpoint: ep, Msg: err.Error()}
		}
		if _, ok := fails[ep]; !ok {
			order = append(order, ep)
		}
		fails[ep] = ce
	}
	var last error
	interrupted := func() error {
		if call.Ended() == treecall.Unknown {
			e := unknownOutcome(op, "", last, call).(*cli.Error)
			e.Msg += " (interrupted)"
			return e
		}
		return cli.Interrupted{Signal: "interrupt"}
	}
	attempt := func(conn *cli.Conn) error {
		tc := pb.NewTreeServiceClient(conn)
		if !call.Tokened {
			return send(ctx, tc, nil)
		}
		if tok == nil {
			lctx, lcancel := context.WithTimeout(ctx, attemptTimeout)
			anchor, _, err := btree.LookupAnchor(lctx, tc, tree)
			lcancel()
			if err != nil {
				return err // (nothing sent; the tree's absence is the answer)
			}
			id := make([]byte, 16)
			if _, err := rand.Read(id); err != nil {
				return &cli.Error{Code: cli.ExitFailed, Op: op, Msg: "a write token's client id: " + err.Error()}
			}
			tok = &pb.TreeWriteToken{Client: id, Seq: 1, Stamp: time.Now().UnixNano(), TreeCm: anchor.CM, TreeId: anchor.ID}
			if firstSend.IsZero() {
				firstSend = time.Now()
			}
		}
		tok.Attempt = call.Attempt()
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		defer cancel()
		return send(actx, tc, tok)
	}
	backoff := 50 * time.Millisecond
	endpoints := slices.Clone(c.Endpoints)
	gateways := map[string]bool{} // endpoints that serve no trees but list the nodes
	for {
		for i := 0; i < len(endpoints); i++ {
			ep := endpoints[i]
			if ctx.Err() != nil {
				break
			}
			if gateways[ep] {
				continue // its nodes are in the list
			}
			conn, err := c.Connect(ctx, ep)
			if err != nil {
				fail(ep, err) // nothing sent
				continue
			}
			if !call.Tokened && firstSend.IsZero() {
				firstSend = time.Now()
			}
			for {
				err = attempt(conn)
				if cli.UnknownService(err) {
					// A grove up gateway (it serves no trees): the
					// nodes it lists go next (cli.Client.Do does the
					// same), and it is passed over in later rounds.
					// Unimplemented applied nothing: it is not an
					// attempt of unknown outcome (review 74: after a
					// node lost an answer, the gateway's answer ended
					// the command with exit 8).
					if missing, ok := cli.GatewayNodes(ctx, conn, endpoints); ok {
						gateways[ep] = true
						endpoints = slices.Insert(endpoints, i+1, missing...)
						if call.Ambiguous == 0 {
							// No attempt of unknown outcome anywhere:
							// the write starts afresh at the nodes, a
							// new token looked up there (one made here
							// names no tree: the gateway's lookup
							// answered as an old node's would; review
							// 75).
							tok, call = nil, &treecall.Call{Kind: treecall.Write, Tokened: true}
						}
						break
					}
				}
				var ce *cli.Error
				if err == nil || errors.As(err, &ce) {
					// Done, or the command's own answer (a condition
					// that does not hold, an absent key).
					conn.Close()
					return err
				}
				if errors.Is(ctx.Err(), context.Canceled) {
					conn.Close()
					return interrupted()
				}
				last = err
				d := call.Failed(status.Convert(err), ctx.Err() != nil)
				switch d.Step {
				case treecall.Again:
					if d.NewToken {
						tok = nil // a new one at the next send
					}
					continue
				case treecall.Answer:
					conn.Close()
					if treecall.HasReason(status.Convert(err), treecall.TokenExpired) {
						return &cli.Error{Code: cli.ExitUnavailable, Op: op, Endpoint: ep,
							Msg:  "every new write token was refused as too old: " + status.Convert(err).Message(),
							Hint: "is this machine's clock far from the nodes'?"}
					}
					return cli.FromRPC(op, ep, c.CommandTimeout, err)
				case treecall.Unknown:
					conn.Close()
					return unknownOutcome(op, ep, err, call)
				}
				fail(ep, cli.FromRPC("", ep, c.CommandTimeout, err)) // Next, or Unavailable: nothing applied
				break
			}
			conn.Close()
		}
		if ctx.Err() != nil || c.CommandTimeout <= 0 && (firstSend.IsZero() || time.Since(firstSend) > treeResendFor) {
			break // (no time bound: nothing was sent this round, or the window is spent)
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return interrupted()
	}
	if call.Ended() == treecall.Unknown {
		return unknownOutcome(op, "", last, call)
	}
	list := make([]*cli.Error, 0, len(order))
	for _, ep := range order {
		list = append(list, fails[ep])
	}
	return cli.Combine(op, list, errors.Is(ctx.Err(), context.DeadlineExceeded), c.CommandTimeout)
}

// With no --command-timeout, a tokened write's attempt gets treeAttempt,
// and no round of resends starts treeResendFor after its first send: both
// within the token's window (btree.TokenWindow, 60 s), past which a resend
// is refused. (Variables: tests shorten them.)
var (
	treeAttempt   = 15 * time.Second
	treeResendFor = 30 * time.Second
)

// checkTreeEntry refuses, before sending, a put or delete the nodes would
// refuse (exit 2): a request over gRPC's size limit would be refused by
// gRPC before any handler, an answer that proves nothing to the retry
// rules (review 53).
func checkTreeEntry(op string, key, val, expect []byte) error {
	msg := ""
	switch {
	case len(key) == 0 || len(key) > btree.MaxKey:
		msg = fmt.Sprintf("a key is 1 to %d bytes (this one %d)", btree.MaxKey, len(key))
	case len(val) > btree.MaxValue:
		msg = fmt.Sprintf("a value is at most %d bytes (this one %d)", btree.MaxValue, len(val))
	case len(expect) > btree.MaxValue:
		msg = fmt.Sprintf("a compared value is at most %d bytes (this one %d)", btree.MaxValue, len(expect))
	default:
		return nil
	}
	return &cli.Error{Code: cli.ExitUsage, Op: op, Msg: msg}
}

// unknownOutcome is the error of a write that may or may not have been
// applied.
func unknownOutcome(op, ep string, err error, call *treecall.Call) error {
	msg := fmt.Sprintf("the write may or may not have been applied (%d attempts of unknown outcome, sent under one write token; last: %v)", call.Ambiguous, err)
	if !call.Tokened {
		msg = fmt.Sprintf("the call lost its answer (%s): the write may or may not have been applied, and was not sent again (the cluster takes no write tokens)", status.Convert(err).Message())
	}
	return &cli.Error{Code: cli.ExitUnknown, Op: op, Endpoint: ep, Msg: msg, Hint: "read it back before trying again"}
}
