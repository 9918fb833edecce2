package rldev

import (
	"context"
	"errors"
	"sync"

	pb "github.com/grovestore/grove/api/grovepb"
	"google.golang.org/protobuf/proto"
)

// HoldFirstWriteAttempt (review 40) makes c's first write attempt a
// request held in the network: the clerk is told its call broke (nothing
// was sent yet), and the request reaches the node only when the returned
// function is called (a gRPC request read after its retry was answered).
func HoldFirstWriteAttempt(c *Clerk) (deliver func(context.Context) error) {
	var mu sync.Mutex
	var held *pb.RLDevServiceWriteRequest
	var to dataClient
	taken := false
	c.wrapData = func(d dataClient) dataClient {
		return holdFirst{dataClient: d, take: func(r *pb.RLDevServiceWriteRequest) bool {
			mu.Lock()
			defer mu.Unlock()
			if taken {
				return false
			}
			taken, held, to = true, proto.Clone(r).(*pb.RLDevServiceWriteRequest), d
			return true
		}}
	}
	return func(ctx context.Context) error {
		mu.Lock()
		r, d := held, to
		mu.Unlock()
		if r == nil {
			return errors.New("no write held")
		}
		resp, err := d.Write(ctx, r)
		if err != nil {
			return err
		}
		return ResultError(resp.Result)
	}
}

type holdFirst struct {
	dataClient
	take func(*pb.RLDevServiceWriteRequest) bool
}

func (h holdFirst) Write(ctx context.Context, r *pb.RLDevServiceWriteRequest) (*pb.RLDevServiceWriteResponse, error) {
	if h.take(r) {
		return nil, errors.New("test: the connection broke with the request in the network")
	}
	return h.dataClient.Write(ctx, r)
}
