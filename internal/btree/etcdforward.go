package btree

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/grovestore/grove/api/etcdpb"
	"github.com/grovestore/grove/internal/transport"
)

// The etcd endpoint's forwarding (see EtcdKV): a node keeps one gRPC stream
// to each home node it forwards to, and sends each call as one message with
// an id; the home serves every call at once, in its own goroutine, and
// answers it as it completes. A forwarded call thus costs a share of two
// messages on an open stream — no stream set-up, no headers; the calls
// (answers) ready when a message goes out travel together, so that under
// load one socket write carries several — where a unary call cost a
// stream of its own. One slow call (a put waiting for a dead server's
// recovery) holds up no other.
//
// Outcomes: a call not sent (the connection or the stream could not be
// had) is served by the receiving node itself, as before; a call sent
// whose answer never came (the stream broke, the caller's time ran out) is
// Unavailable for a read (the node may then serve it itself) and Unknown
// for a write, whose outcome the home alone knew.

// forwardLink is this node's stream to one home node.
type forwardLink struct {
	cc    *grpc.ClientConn
	close context.Context // ends with the endpoint

	mu     sync.Mutex
	stream *forwardStream // nil: none open
	sent   *atomic.Uint64 // the endpoint's count
	// cancelled counts the cancellations sent (the endpoint's; nil: none
	// kept).
	cancelled *atomic.Uint64
}

// forwardStream is one open stream and the calls waiting on it.
type forwardStream struct {
	s      etcdpb.GroveForward_ForwardClient
	cancel context.CancelFunc
	out    *outbox[*etcdpb.ForwardCall]

	mu    sync.Mutex
	next  uint64
	waits map[uint64]forwardWait
	err   error // set once it broke: no more calls
}

// forwardWait is a call's caller, waiting.
type forwardWait struct {
	ch       chan forwardResult
	deadline time.Time // zero: none
}

type forwardResult struct {
	ans *etcdpb.ForwardAnswer
	err error
}

// errNotSent: the call was not sent (no stream to the home could be had).
var errNotSent = errors.New("etcd endpoint: no stream to the tree's home node")

// outbox gathers what is ready to go and sends it, up to
// forwardBatchBytes per message (a message must stay well under the nodes'
// transport.MaxMessage; an item alone is never larger: see forwardCallMax,
// forwardAnswerMax). There is no sender goroutine: the goroutine that
// queues an item while nobody sends becomes the sender and sends until
// the outbox is empty, taking along what others queue meanwhile (they
// return at once). A call thus leaves without a hand-off to another
// goroutine — each cost a wake-up on every forwarded call's path, twice
// (the call, its answer) — and under load one message still carries
// many. Once a send fails nothing more is sent: the failing sender
// reports the error and what was left unsent (failed), and put answers
// false for anything queued later.
type outbox[T proto.Message] struct {
	send   func([]T) error
	failed func(err error, unsent []T)
	mu     sync.Mutex
	items  []T
	busy   bool  // a goroutine is sending
	err    error // a send failed
}

func newOutbox[T proto.Message](send func([]T) error, failed func(error, []T)) *outbox[T] {
	return &outbox[T]{send: send, failed: failed}
}

// put queues x and sends, unless another goroutine is sending (it takes x
// along). False: x will not be sent (a send failed before).
func (o *outbox[T]) put(x T) bool {
	o.mu.Lock()
	if o.err != nil {
		o.mu.Unlock()
		return false
	}
	o.items = append(o.items, x)
	o.flushLocked()
	return true
}

// flushLocked sends what is queued unless another goroutine is sending
// (o.mu held; released on return).
func (o *outbox[T]) flushLocked() {
	if o.busy {
		o.mu.Unlock()
		return
	}
	o.busy = true
	for {
		items := o.takeLocked()
		if len(items) == 0 {
			o.busy = false
			o.mu.Unlock()
			return
		}
		o.mu.Unlock()
		err := o.send(items)
		o.mu.Lock()
		if err != nil {
			o.err, o.busy = err, false
			unsent := o.items
			o.items = nil
			o.mu.Unlock()
			if o.failed != nil {
				o.failed(err, unsent)
			}
			return
		}
	}
}

// takeLocked takes what fits in one message.
func (o *outbox[T]) takeLocked() []T {
	n, size := 0, 0
	for ; n < len(o.items); n++ {
		sz := proto.Size(o.items[n])
		if n > 0 && size+sz > forwardBatchBytes {
			break
		}
		size += sz
	}
	items := o.items[:n:n]
	if o.items = o.items[n:]; len(o.items) == 0 {
		o.items = nil
	}
	return items
}

const (
	forwardBatchBytes = 4 << 20
	// forwardCallMax bounds a call sent on the stream: a larger one (a
	// put of a value near MaxValue) is served where it landed (any
	// server may: the tree stays coherent through the locks; one too
	// large for the tree is refused there), so that it never holds the
	// stream's small calls up behind it.
	forwardCallMax = 1 << 20
	// forwardAnswerMax bounds an answer: a larger one is replaced by an
	// error (the unary path would have failed it too).
	forwardAnswerMax = transport.MaxMessage - 64<<10
)

// streamLocked returns the open stream, opening one if there is none.
func (l *forwardLink) streamLocked(self uint64) (*forwardStream, error) {
	if l.stream != nil {
		l.stream.mu.Lock()
		broken := l.stream.err != nil
		l.stream.mu.Unlock()
		if !broken {
			return l.stream, nil
		}
		l.stream = nil
	}
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(l.close, forwardedKey, uintString(self)))
	s, err := etcdpb.NewGroveForwardClient(l.cc).Forward(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	fs := &forwardStream{s: s, cancel: cancel, waits: map[uint64]forwardWait{}}
	fs.out = newOutbox(fs.sendCalls, func(err error, unsent []*etcdpb.ForwardCall) {
		// The calls of the failed message may have gone out (they learn
		// the stream's error: Unavailable, a read may be served here, a
		// write's outcome is unknown); those still queued were not sent.
		fs.broke(status.Errorf(codes.Unavailable, "etcd endpoint: sending to the tree's home node: %v", err), unsent)
	})
	l.stream = fs
	go fs.receive()
	return fs, nil
}

// sendCalls sends one message of calls.
func (fs *forwardStream) sendCalls(calls []*etcdpb.ForwardCall) error {
	// A call whose caller gave up is not sent (gRPC would not send an
	// expired unary call either); the others carry the time left now.
	now := time.Now()
	live := calls[:0:0]
	fs.mu.Lock()
	for _, c := range calls {
		w, ok := fs.waits[c.Id]
		switch {
		case c.Cancel:
			// (If its call was dropped here unsent, the home knows no
			// such call and ignores it.)
			live = append(live, c)
		case !ok:
		case w.deadline.IsZero():
			live = append(live, c)
		case now.Before(w.deadline):
			c.TimeoutUs = max(w.deadline.Sub(now).Microseconds(), 1)
			live = append(live, c)
		}
	}
	fs.mu.Unlock()
	if len(live) == 0 {
		return nil
	}
	return fs.s.Send(&etcdpb.ForwardCalls{Calls: live})
}

// broke ends the stream: every call waiting learns err, but those never
// sent, which learn errNotSent.
func (fs *forwardStream) broke(err error, unsent []*etcdpb.ForwardCall) {
	fs.mu.Lock()
	if fs.err == nil {
		fs.err = err
	}
	for _, c := range unsent {
		if w, ok := fs.waits[c.Id]; ok {
			w.ch <- forwardResult{err: errNotSent}
			delete(fs.waits, c.Id)
		}
	}
	for id, w := range fs.waits {
		w.ch <- forwardResult{err: fs.err}
		delete(fs.waits, id)
	}
	fs.mu.Unlock()
	fs.cancel()
}

// receive hands each answer to its waiting call until the stream breaks.
func (fs *forwardStream) receive() {
	for {
		m, err := fs.s.Recv()
		if err != nil {
			fs.broke(status.Errorf(codes.Unavailable, "etcd endpoint: the stream to the tree's home node broke: %v", err), nil)
			return
		}
		fs.mu.Lock()
		for _, ans := range m.Answers {
			if w, ok := fs.waits[ans.Id]; ok {
				delete(fs.waits, ans.Id)
				w.ch <- forwardResult{ans: ans}
			}
		}
		fs.mu.Unlock()
	}
}

// call forwards c and waits for its answer. errNotSent: nothing was sent.
func (l *forwardLink) call(ctx context.Context, self uint64, c *etcdpb.ForwardCall) (*etcdpb.ForwardAnswer, error) {
	l.mu.Lock()
	fs, err := l.streamLocked(self)
	l.mu.Unlock()
	if err != nil {
		return nil, errNotSent
	}
	if proto.Size(c) > forwardCallMax {
		return nil, errNotSent // (served where it landed)
	}
	ch := make(chan forwardResult, 1)
	d, _ := ctx.Deadline()
	fs.mu.Lock()
	if fs.err != nil {
		fs.mu.Unlock()
		return nil, errNotSent
	}
	fs.next++
	c.Id = fs.next
	fs.waits[c.Id] = forwardWait{ch: ch, deadline: d}
	fs.mu.Unlock()
	if !fs.out.put(c) {
		// A send failed first: the stream is broken, and broke told
		// every waiting call (this one too, unless it comes after).
		fs.mu.Lock()
		if _, waiting := fs.waits[c.Id]; waiting {
			delete(fs.waits, c.Id)
			fs.mu.Unlock()
			return nil, errNotSent
		}
		fs.mu.Unlock()
	}
	l.sent.Add(1)
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, r.err
		}
		if fe := r.ans.GetError(); fe != nil {
			if fe.NotApplied {
				return nil, NotAppliedError(codes.Code(fe.Code), fe.Message)
			}
			return nil, status.Error(codes.Code(fe.Code), fe.Message)
		}
		return r.ans, nil
	case <-ctx.Done():
		fs.mu.Lock()
		_, waiting := fs.waits[c.Id]
		delete(fs.waits, c.Id)
		broken := fs.err != nil
		fs.mu.Unlock()
		if waiting && !broken {
			// The home stops the call (it would run to its own deadline,
			// or the home's operation timeout, for nobody): sent after
			// the call on the same stream, so it never arrives first.
			fs.out.put(&etcdpb.ForwardCall{Id: c.Id, Cancel: true})
			if l.cancelled != nil {
				l.cancelled.Add(1)
			}
		}
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// closeLink ends the link's stream (the endpoint closes).
func (l *forwardLink) closeLink() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stream != nil {
		l.stream.cancel()
		l.stream = nil
	}
}

// Forward serves the calls another node forwards to this one, the tree's
// home (GroveForward). Each runs at once, in its own goroutine, with the
// caller's remaining time; its answer goes back when it completes, with
// whatever other answers are ready then.
func (e *EtcdKV) Forward(stream etcdpb.GroveForward_ForwardServer) error {
	ctx := stream.Context()
	// A failed send breaks the stream (its caller learns it); the
	// answers after it are dropped.
	out := newOutbox(func(answers []*etcdpb.ForwardAnswer) error {
		return stream.Send(&etcdpb.ForwardAnswers{Answers: answers})
	}, nil)
	// Every answer is sent by the goroutine that served its call (or one
	// that sent it along): once they are all done, nothing is left to
	// send, and nothing is sent after the handler returns.
	var wg sync.WaitGroup
	defer wg.Wait()
	// The calls running, by id, for the caller's cancellations.
	var runMu sync.Mutex
	running := map[uint64]context.CancelFunc{}
	for {
		m, err := stream.Recv()
		if err != nil {
			return nil
		}
		for _, c := range m.Calls {
			if c.Cancel {
				runMu.Lock()
				if stop := running[c.Id]; stop != nil {
					// Counted first: whoever sees the call end
					// sees it counted (TestEtcdForwardStream failed
					// once under the race detector reading the count
					// between the two).
					e.forwardCancelled.Add(1)
					stop()
				}
				runMu.Unlock()
				continue
			}
			wg.Add(1)
			e.forwardedIn.Add(1)
			var cctx context.Context
			var cancel context.CancelFunc
			if c.TimeoutUs > 0 {
				cctx, cancel = context.WithTimeout(ctx, time.Duration(c.TimeoutUs)*time.Microsecond)
			} else {
				cctx, cancel = context.WithCancel(ctx)
			}
			runMu.Lock()
			running[c.Id] = cancel
			runMu.Unlock()
			e.workers.run(func() {
				defer wg.Done()
				ans := e.serveForwarded(cctx, c)
				runMu.Lock()
				delete(running, c.Id)
				runMu.Unlock()
				cancelled := cctx.Err() == context.Canceled && ctx.Err() == nil
				cancel()
				if cancelled {
					return // its caller gave up: nobody reads an answer
				}
				ans.Id = c.Id
				if proto.Size(ans) > forwardAnswerMax {
					msg := "etcd endpoint: the answer is larger than a message may be (read the range with a limit)"
					if _, read := c.Op.(*etcdpb.ForwardCall_Range); !read {
						// A delete of a range with its previous values:
						// done, only its answer cannot be sent.
						msg = "etcd endpoint: the request was applied, but its answer (with the previous values) is larger than a message may be"
					}
					ans.Result = &etcdpb.ForwardAnswer_Error{Error: &etcdpb.ForwardError{Code: uint32(codes.ResourceExhausted), Message: msg}}
				}
				out.put(ans)
			})
		}
	}
}

// workerPool runs functions at once, each on a goroutine of its own: an
// idle worker's if one waits, a new one otherwise, which then waits for
// more work (up to max resident, each for up to idle). The point is the
// stack: a served call's path (gRPC, the tree, the chunk clerk) is deep,
// and a fresh goroutine grew its stack through it every time (copystack,
// ≈12 % of the home's CPU under the etcd endpoint's get load).
type workerPool struct {
	ch       chan func()
	resident atomic.Int32
	max      int32
	idle     time.Duration
}

func newWorkerPool(max int32, idle time.Duration) *workerPool {
	return &workerPool{ch: make(chan func()), max: max, idle: idle}
}

func (p *workerPool) run(f func()) {
	select {
	case p.ch <- f: // an idle worker took it
	default:
		go p.work(f)
	}
}

func (p *workerPool) work(f func()) {
	f()
	if p.resident.Add(1) > p.max {
		p.resident.Add(-1)
		return
	}
	defer p.resident.Add(-1)
	t := time.NewTimer(p.idle)
	defer t.Stop()
	for {
		select {
		case f := <-p.ch:
			f()
			t.Reset(p.idle)
		case <-t.C:
			return
		}
	}
}

// serveForwarded runs one forwarded call here (ctx carries the forwarded
// mark: it is not forwarded again).
func (e *EtcdKV) serveForwarded(ctx context.Context, c *etcdpb.ForwardCall) *etcdpb.ForwardAnswer {
	if h := e.testServeHook.Load(); h != nil {
		(*h)(ctx)
	}
	var err error
	ans := &etcdpb.ForwardAnswer{}
	switch op := c.Op.(type) {
	case *etcdpb.ForwardCall_Range:
		var r *etcdpb.RangeResponse
		if r, err = e.Range(ctx, op.Range); err == nil {
			ans.Result = &etcdpb.ForwardAnswer_Range{Range: r}
		}
	case *etcdpb.ForwardCall_Put:
		var r *etcdpb.PutResponse
		if r, err = e.Put(ctx, op.Put); err == nil {
			ans.Result = &etcdpb.ForwardAnswer_Put{Put: r}
		}
	case *etcdpb.ForwardCall_DeleteRange:
		var r *etcdpb.DeleteRangeResponse
		if r, err = e.DeleteRange(ctx, op.DeleteRange); err == nil {
			ans.Result = &etcdpb.ForwardAnswer_DeleteRange{DeleteRange: r}
		}
	default:
		err = status.Error(codes.InvalidArgument, "etcd endpoint: a forwarded call without an operation")
	}
	if err != nil {
		st := status.Convert(err)
		ans.Result = &etcdpb.ForwardAnswer_Error{Error: &etcdpb.ForwardError{Code: uint32(st.Code()), Message: st.Message(), NotApplied: IsNotApplied(st)}}
	}
	return ans
}
