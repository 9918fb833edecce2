package btree

import (
	"context"
	"time"
)

// FailForTest makes the server fail as a failed log would (the cache's
// sticky error, its leases still standing).
func (s *Server) FailForTest(err error) { s.cache.fail(err) }

// FailDropDecreesForTest makes BeginDrop's decree fail with err (nil: no
// more), before it is made.
func (s *Server) FailDropDecreesForTest(err error) {
	s.testDecreeFails = nil
	if err != nil {
		s.testDecreeFails = func() error { return err }
	}
}

// SetOpenLookedForTest calls f in Open after its directory lookup.
func (s *Server) SetOpenLookedForTest(f func(name string)) { s.testOpenLooked = f }

// AnchorForTest is the anchor of the tree t was opened as.
func (t *Tree) AnchorForTest() Handle { return t.anchor }

// DropPassForTest runs one pass of the dropper.
func (s *Server) DropPassForTest(ctx context.Context) { s.dropPass(ctx) }

// SetWriteBackParallelForTest sets how many write-backs a WriteBack runs
// at once, and returns the undo.
func SetWriteBackParallelForTest(n int) (undo func()) {
	old := writeBackParallel
	writeBackParallel = n
	return func() { writeBackParallel = old }
}

// SetReplayParallelForTest sets how many node writes a recovery run has
// in flight, and returns the undo.
func SetReplayParallelForTest(n int) (undo func()) {
	old := replayParallel
	replayParallel = n
	return func() { replayParallel = old }
}

// ReplaysForTest is how many logs this server's recovery runs replayed,
// and how long the last replay took.
func (s *Server) ReplaysForTest() (int64, time.Duration) {
	return s.replays.Load(), time.Duration(s.replayTook.Load())
}

// PretendStartingForTest makes the service look as if its B-tree server
// were starting (no server, not ready) until undo: calls wait in Server
// as they do after a restart, while the server stays running underneath.
func (s *Service) PretendStartingForTest() (undo func()) {
	s.mu.Lock()
	srv, ready := s.mu.srv, s.mu.ready
	s.mu.srv, s.mu.ready = nil, make(chan struct{})
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.mu.srv, s.mu.ready = srv, ready
		s.mu.Unlock()
	}
}

// SetForwardServeHookForTest runs f before each forwarded call this
// endpoint serves as the home (nil: none).
func (e *EtcdKV) SetForwardServeHookForTest(f func(ctx context.Context)) {
	if f == nil {
		e.testServeHook.Store(nil)
		return
	}
	e.testServeHook.Store(&f)
}

// SetAfterStartForTest runs f with each server the service starts, before
// the service looks whether the server's incarnation is still on (nil:
// none).
func (s *Service) SetAfterStartForTest(f func(*Server)) {
	if f == nil {
		s.testAfterStart.Store(nil)
		return
	}
	s.testAfterStart.Store(&f)
}

// SetLateStopForTest tells f how the service stopped a server that
// finished starting after its incarnation ended (clean: closed cleanly,
// with err; otherwise stopped as a fenced one).
func (s *Service) SetLateStopForTest(f func(clean bool, err error)) { s.testLateStop.Store(&f) }

// FenceForTest fences the service's current incarnation.
func (s *Service) FenceForTest() {
	s.mu.Lock()
	inc := s.mu.inc
	s.mu.Unlock()
	s.Fence(inc)
}

// SetCreateStopForTest ends CreateTree at a stage as if the server died
// there (Server.testCreateStop).
func (s *Server) SetCreateStopForTest(f func(stage string, anchor, root Handle) bool) {
	s.testCreateStop = f
}

// SetRecoverWithoutDirectoryForTest makes this server's recovery runs
// collect a dead server's orphans without the tree directory.
func (s *Server) SetRecoverWithoutDirectoryForTest() { s.unsafeRecoverWithoutDirectory.Store(true) }

// SetDeltasForTest turns the logging of node changes as deltas on or off
// for the server's cache (on by default).
func (s *Server) SetDeltasForTest(on bool) { s.cache.noDeltas = !on }

// LogEndForTest is the server's log's end (LSN: bytes ever appended, with
// the flushes' padding).
func (s *Server) LogEndForTest() uint64 { return uint64(s.wal.Stats().End) }

// LateCollectionsForTest is how many collections of dead servers' orphans
// this server's recovery runs left to its background, and that ran.
func (s *Server) LateCollectionsForTest() int64 { return s.lateCollections.Load() }
