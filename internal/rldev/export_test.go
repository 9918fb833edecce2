package rldev

import (
	"context"
	"errors"
	"sync/atomic"

	pb "github.com/grovestore/grove/api/grovepb"
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
