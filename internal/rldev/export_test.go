package rldev

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"google.golang.org/protobuf/proto"
)

// LoseWriteAnswers makes c's next n writes reach their RLDev and then lose
// their answer (the write is done; the clerk is told it failed). Call it
// before c's first call.
func LoseWriteAnswers(c *Clerk, n int64) {
	left := &atomic.Int64{}
	left.Store(n)
	c.wrapData = func(d dataClient) dataClient { return loseAnswers{dataClient: d, left: left} }
}

type loseAnswers struct {
	dataClient
	left *atomic.Int64
}

func (l loseAnswers) Write(ctx context.Context, r *pb.RLDevServiceWriteRequest) (*pb.RLDevServiceWriteResponse, error) {
	resp, err := l.dataClient.Write(ctx, r)
	if err == nil && l.left.Add(-1) >= 0 {
		return nil, errors.New("test: the write's answer was lost")
	}
	return resp, err
}

// DelayWriteAttempts makes some of c's write attempts requests held in
// the network: for each, fate says how long (0: none); a held attempt's
// call fails at once (the clerk is told its call broke, as when a gRPC
// stream breaks with the request sent) and the request reaches the node
// that much later, its answer going to nobody. wait waits for every held
// attempt to have arrived. Call it before c's first call.
func DelayWriteAttempts(c *Clerk, fate func() time.Duration) (wait func()) {
	var wg sync.WaitGroup
	c.wrapData = func(d dataClient) dataClient { return delayAttempts{dataClient: d, fate: fate, wg: &wg} }
	return wg.Wait
}

type delayAttempts struct {
	dataClient
	fate func() time.Duration
	wg   *sync.WaitGroup
}

func (h delayAttempts) Write(ctx context.Context, r *pb.RLDevServiceWriteRequest) (*pb.RLDevServiceWriteResponse, error) {
	d := h.fate()
	if d <= 0 {
		return h.dataClient.Write(ctx, r)
	}
	req := proto.Clone(r).(*pb.RLDevServiceWriteRequest)
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		time.Sleep(d)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		h.dataClient.Write(ctx, req)
	}()
	return nil, errors.New("test: the call broke with the request in the network")
}

// AnswerFirstWriteMaybe makes c's first write attempt reach its RLDev
// (it lands) and its answer, whatever it was, replaced by a "not serving,
// maybe written" one from incarnation first(the answering engine's): as a
// node fencing itself answers the writes it had in progress; the later
// answers are told as from incarnation later(the engine's). seen gets
// each real answer's incarnation. Call it before c's first call.
func AnswerFirstWriteMaybe(c *Clerk, first, later func(real uint64) uint64, seen func(uint64)) {
	f := &atomic.Bool{}
	f.Store(true)
	c.wrapData = func(d dataClient) dataClient {
		return answerMaybe{dataClient: d, isFirst: f, first: first, later: later, seen: seen}
	}
}

type answerMaybe struct {
	dataClient
	isFirst      *atomic.Bool
	first, later func(uint64) uint64
	seen         func(uint64)
}

func (a answerMaybe) Write(ctx context.Context, r *pb.RLDevServiceWriteRequest) (*pb.RLDevServiceWriteResponse, error) {
	resp, err := a.dataClient.Write(ctx, r)
	if err != nil {
		return resp, err
	}
	real := resp.GetResult().GetIncarnation()
	a.seen(real)
	if a.isFirst.Swap(false) {
		maybe := fmt.Errorf("%w: test: the node fenced itself (%w)", ErrNotServing, ErrMaybeWritten)
		return &pb.RLDevServiceWriteResponse{Result: ResultOf(maybe, 0, a.first(real))}, nil
	}
	resp = proto.Clone(resp).(*pb.RLDevServiceWriteResponse)
	resp.Result.Incarnation = a.later(real)
	return resp, nil
}
