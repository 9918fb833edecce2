package rldev

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
)

// Review 42 (outside review of the recycled buffers): a read given up
// while its (large) reply was still streaming, steadily, cost the
// connection after settleGrace (100 ms), and with it every other request
// on it: here a write sent on the same connection, which the node answers
// right after the read's reply, failed with ErrConnLost ("may have
// landed"). The reply streams at about 1 MB/s (4 KiB every 4 ms); an 8
// MiB reply on a shared link can take longer than the grace too. Now the
// reader checks before each read of the reply whether the call still wants
// the blocks, and reads the rest of an abandoned reply into nothing: the
// given-up read returns within one read (here about 4 ms), and the write
// succeeds.
func TestReview42SlowReplyGivenUpCutsOtherRequests(t *testing.T) {
	node, clerk := net.Pipe()
	defer node.Close()
	d := &dataConn{addr: "pipe", w: newFrameWriter(clerk), wait: map[uint64]*pendingCall{}}
	go d.readLoop(clerk)
	defer d.fail(net.ErrClosed)

	const n = 64 * BlockSize // 256 KiB, sent over ~250 ms
	// The steps are ordered by signals, not sleeps (a 2-core CI machine
	// under the race detector delays goroutines by tens of ms): the read's
	// frame, then the write's, then the reply streaming, then the read
	// given up mid-stream.
	gotRead, gotWrite, streaming := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		br := bufio.NewReader(node)
		rf, err := readFrame(br, nil, 0)
		if err != nil {
			return
		}
		close(gotRead)
		wf, err := readFrame(br, nil, 0)
		if err != nil {
			return
		}
		close(gotWrite)
		hdr, _ := encodeFrame(frameReadResp, rf.id, &pb.RLDevServiceReadResponse{}, n)
		if _, err := node.Write(hdr); err != nil {
			return
		}
		for i := 0; i < n/BlockSize; i++ { // steady, never stalled
			if _, err := node.Write(bytes.Repeat([]byte{0x77}, BlockSize)); err != nil {
				return
			}
			if i == 4 {
				close(streaming)
			}
			time.Sleep(4 * time.Millisecond)
		}
		whdr, _ := encodeFrame(frameWriteResp, wf.id, &pb.RLDevServiceWriteResponse{}, 0)
		node.Write(whdr)
	}()

	dst := make([]byte, n)
	rctx, rcancel := context.WithCancel(context.Background())
	defer rcancel()
	readErr := make(chan error, 1)
	go func() {
		_, err := d.Read(rctx, &pb.RLDevServiceReadRequest{Rldev: 1, Length: n}, dst)
		readErr <- err
	}()
	<-gotRead // the read's frame goes first
	wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer wcancel()
	writeErr := make(chan error, 1)
	go func() {
		_, err := d.Write(wctx, &pb.RLDevServiceWriteRequest{Rldev: 1, Data: make([]byte, BlockSize)})
		writeErr <- err
	}()
	<-gotWrite
	<-streaming
	start := time.Now()
	rcancel() // given up mid-reply
	if err := <-readErr; err == nil {
		t.Fatal("the read succeeded")
	}
	t.Logf("the read given up mid-reply returned %v later", time.Since(start))
	if err := <-writeErr; err != nil {
		t.Errorf("a write on the same connection, which the node answered, failed: %v (ErrConnLost: %v)", err, errors.Is(err, ErrConnLost))
	}
}
