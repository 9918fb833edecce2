package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
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
// round (a pause between rounds), until the command's time ends. A cluster
// that takes no tokens (TOKENS_OFF, or a node of a build from before them:
// Unimplemented) gets the write untokened, and it is then sent again only
// where treeWrite would. send makes one attempt: tok nil means untokened
// (Put, Delete).
func treeWriteOnce(ctx context.Context, c *cli.Client, op string, send func(ctx context.Context, tc pb.TreeServiceClient, tok *pb.TreeWriteToken) error) error {
	if err := c.Resolve(); err != nil {
		return err
	}
	if c.CommandTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.CommandTimeout)
		defer cancel()
	}
	newToken := func() (*pb.TreeWriteToken, error) {
		id := make([]byte, 16)
		if _, err := rand.Read(id); err != nil {
			return nil, fmt.Errorf("a write token's client id: %w", err)
		}
		return &pb.TreeWriteToken{Client: id, Seq: 1, Attempt: 1, Stamp: time.Now().UnixNano()}, nil
	}
	tok, err := newToken()
	if err != nil {
		return err
	}
	call := &treecall.Call{Kind: treecall.Write, Tokened: true}
	var fails []string
	backoff := 50 * time.Millisecond
	attempt := func(conn *cli.Conn) error {
		tc := pb.NewTreeServiceClient(conn)
		if !call.Tokened {
			return send(ctx, tc, nil)
		}
		tok.Attempt = call.Attempt()
		actx := ctx
		if c.CommandTimeout > 0 {
			var cancel context.CancelFunc
			actx, cancel = context.WithTimeout(ctx, c.CommandTimeout/3)
			defer cancel()
		}
		return send(actx, tc, tok)
	}
	for round := 0; ; round++ {
		for _, ep := range c.Endpoints {
			if ctx.Err() != nil {
				break
			}
			conn, err := c.Connect(ctx, ep)
			if err != nil {
				fails = append(fails, err.Error()) // nothing sent
				continue
			}
			for {
				err = attempt(conn)
				var ce *cli.Error
				if err == nil || errors.As(err, &ce) {
					// Done, or the command's own answer (a condition
					// that does not hold, an absent key).
					conn.Close()
					return err
				}
				d := call.Failed(status.Convert(err), ctx.Err() != nil)
				switch d.Step {
				case treecall.Again:
					if d.NewToken {
						if tok, err = newToken(); err != nil {
							conn.Close()
							return err
						}
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
				case treecall.Unavailable:
					conn.Close()
					return cli.FromRPC(op, ep, c.CommandTimeout, err)
				}
				fails = append(fails, fmt.Sprintf("%s: %s", ep, status.Convert(err).Message()))
				break // Next
			}
			conn.Close()
		}
		if ctx.Err() != nil || c.CommandTimeout <= 0 {
			break // (no time bound: one round)
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
	if call.Ended() == treecall.Unknown {
		return unknownOutcome(op, "", ctx.Err(), call)
	}
	if len(fails) > 8 {
		fails = append(fails[:4], fmt.Sprintf("... %d more", len(fails)-4))
	}
	return &cli.Error{Code: cli.ExitUnavailable, Op: op,
		Msg:  fmt.Sprintf("no endpoint could serve within %v: %s (the write was not applied)", c.CommandTimeout, strings.Join(fails, "; ")),
		Hint: "raise --command-timeout, or check `grove status`"}
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
