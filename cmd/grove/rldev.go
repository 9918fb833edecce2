package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/cli"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/units"
)

func rldevCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rldev",
		Short: "Replicated logical devices: list, create, move, read, write, accept-stale, forget-node",
		Long: `RLDevs are fixed-size block devices, each two segments on disks of two nodes
(Boxwood's replicated logical devices): writes go to the primary and are
acknowledged once durable on both (on the survivor alone, in degraded mode,
after the failure detector declared the other dead); reads come from either.`,
		Example: `  grove rldev create --size 64MiB --count 3
  grove rldev list
  grove rldev write 1 0 pattern.bin
  grove rldev read 1 0 1MiB | cmp - pattern.bin`,
	}
	cmd.AddCommand(rldevListCmd(), rldevCreateCmd(), rldevMoveCmd(), rldevReadCmd(), rldevWriteCmd(), rldevAcceptCmd(), rldevForgetCmd())
	return cmd
}

// rldevSession is what an rldev command talks through: a config-service
// client on the members the endpoint reports, and a clerk on it.
type rldevSession struct {
	meta  *meta.Client
	clerk *rldev.Clerk
}

func openRLDev(ctx context.Context, c *cli.Client, op string) (*rldevSession, error) {
	r, _, err := fetchStatus(ctx, c, op)
	if err != nil {
		return nil, err
	}
	var ms []meta.Member
	for _, m := range r.Members {
		if m.GrpcAddr != "" {
			ms = append(ms, meta.Member{ID: m.Id, RaftAddr: m.RaftAddr, GRPCAddr: m.GrpcAddr})
		}
	}
	if len(ms) == 0 {
		return nil, &cli.Error{Code: cli.ExitUnavailable, Op: op, Msg: "no config-service member is known", Hint: "is the cluster running? (grove up)"}
	}
	mc := meta.NewClient(ms)
	return &rldevSession{meta: mc, clerk: rldev.NewClerk(mc)}, nil
}

// checkSpan refuses, before any I/O, an unknown RLDev or a range
// [off, off+n) that runs past its end: a read of too much wrote what it
// could read to the output before failing, a write of too much wrote its
// first parts.
func (s *rldevSession) checkSpan(ctx context.Context, c *cli.Client, op string, id, off, n uint64) error {
	t, err := s.clerk.Table(ctx, false)
	if err != nil {
		return rldevErr(op, c, err)
	}
	rec := t.RLDevs[id]
	if rec == nil {
		return rldevErr(op, c, fmt.Errorf("rldev %d: %w", id, rldev.ErrUnknown))
	}
	size := rec.Blocks * rldev.BlockSize
	if off > size || n > size-off {
		return cli.Usagef("%d bytes at %d: outside rldev %d (%s, %d bytes); nothing was read or written", n, off, id, units.FormatSize(int64(size)), size)
	}
	return nil
}

func (s *rldevSession) Close() {
	s.clerk.Close()
	s.meta.Close()
}

// commandCtx bounds ctx by --command-timeout.
func commandCtx(ctx context.Context, c *cli.Client) (context.Context, context.CancelFunc) {
	if c.CommandTimeout > 0 {
		return context.WithTimeout(ctx, c.CommandTimeout)
	}
	return context.WithCancel(ctx)
}

// rldevErr maps an RLDev error to the exit codes.
func rldevErr(op string, c *cli.Client, err error) error {
	var ce *cli.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ce):
		return err
	case errors.Is(err, context.DeadlineExceeded):
		return &cli.Error{Code: cli.ExitTimeout, Op: op, Msg: err.Error(), Hint: "raise --command-timeout", Err: err}
	case errors.Is(err, context.Canceled):
		return cli.Interrupted{Signal: "interrupt"}
	case errors.Is(err, rldev.ErrUnknown):
		return &cli.Error{Code: cli.ExitNotFound, Op: op, Msg: err.Error(), Hint: "grove rldev list shows the RLDevs", Err: err}
	case errors.Is(err, rldev.ErrBadRequest):
		return &cli.Error{Code: cli.ExitUsage, Op: op, Msg: err.Error(), Err: err}
	case errors.Is(err, rldev.ErrUnavailable):
		return &cli.Error{Code: cli.ExitUnavailable, Op: op, Msg: err.Error(), Hint: "grove rldev list says which node's copy the blocks wait for", Err: err}
	case errors.Is(err, rldev.ErrNotServing), errors.Is(err, rldev.ErrNotPrimary), errors.Is(err, rldev.ErrWrongEpoch):
		return &cli.Error{Code: cli.ExitUnavailable, Op: op, Msg: err.Error(), Hint: "grove rldev list shows the RLDev's state", Err: err}
	}
	return &cli.Error{Code: cli.ExitFailed, Op: op, Msg: err.Error(), Err: err}
}

func parseID(s string) (uint64, error) {
	id, err := strconv.ParseUint(s, 10, 64)
	if err != nil || id == 0 {
		return 0, cli.Usagef("%q is not an RLDev id (a positive number: grove rldev list)", s)
	}
	return id, nil
}

func parseBytes(what, s string) (uint64, error) {
	n, err := units.ParseSize(s)
	if err != nil {
		return 0, cli.Usagef("%s: %v", what, err)
	}
	if n%rldev.BlockSize != 0 {
		return 0, cli.Usagef("%s %s: RLDevs are read and written in whole %d-byte blocks", what, s, rldev.BlockSize)
	}
	return uint64(n), nil
}

// ------------------------------------------------------------------ list

func rldevListCmd() *cobra.Command {
	var c cli.Client
	var out cli.Output
	cmd := &cobra.Command{
		Use:   "list",
		Short: "Show every RLDev: size, state, where its segments are, resync and scrub progress",
		Long: `Show every RLDev: its size, state (normal, degraded: one segment stale and the
primary serving alone, resyncing: the stale segment being copied), the node of
each segment (the primary first; "stale" marks the one that may have missed
writes), the epoch, resync progress, and the scrubber's passes and repairs as
the nodes report them, and a segment move in progress (grove rldev move: which
segment, to which node, its phase and copy progress). A segment waiting for
something (its node down, its disk failed, the only up-to-date copy gone) says
so in NOTE; so does an old extent of a moved segment not yet freed.`,
		Example: `  grove rldev list
  grove rldev list -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			ctx, cancel := commandCtx(cmd.Context(), &c)
			defer cancel()
			s, err := openRLDev(ctx, &c, "rldev list")
			if err != nil {
				return err
			}
			defer s.Close()
			t, err := s.clerk.Table(ctx, true)
			if err != nil {
				return rldevErr("rldev list", &c, err)
			}
			return out.Print(os.Stdout, rldevListDoc(t, nodeStatuses(ctx, s, t)))
		},
	}
	c.Register(cmd, cli.DefaultCommandTimeout)
	out.Register(cmd)
	return cmd
}

// nodeStatuses asks every node that holds a segment for its replicas'
// status (2 s each, at once; a node that does not answer is left out).
func nodeStatuses(ctx context.Context, s *rldevSession, t *rldev.Table) map[uint64]*pb.RLDevServiceStatusResponse {
	nodes := map[uint64]bool{}
	for _, r := range t.RLDevs {
		nodes[r.Segs[0].Node], nodes[r.Segs[1].Node] = true, true
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	out := map[uint64]*pb.RLDevServiceStatusResponse{}
	for n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			if r, err := s.clerk.Status(sctx, n); err == nil {
				mu.Lock()
				out[n] = r
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out
}

// replicaStatus is node's status of its segment of RLDev id (not of a
// move's target there: a move to another disk of the node has both).
func replicaStatus(st map[uint64]*pb.RLDevServiceStatusResponse, node, id uint64) *pb.RLDevReplicaStatus {
	for _, r := range st[node].GetReplicas() {
		if r.Rldev == id && !r.MoveTarget {
			return r
		}
	}
	return nil
}

func rldevListDoc(t *rldev.Table, st map[uint64]*pb.RLDevServiceStatusResponse) *cli.Doc {
	d := &cli.Doc{}
	d.Field("version", t.Version)
	// Nodes forgotten (grove rldev forget-node): their disks, listed only
	// when there are some; a node whose disks are marked while RLDevs are
	// still on it is listed apart (forget-node --re-place stopped
	// half-way: outside review 96).
	forgot, forgetting := map[string][]uint32{}, map[string][]uint32{}
	var ftext, gtext []string
	for _, k := range slices.SortedFunc(maps.Keys(t.Disks), func(a, b rldev.DiskKey) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.Index, b.Index))
	}) {
		if t.Disks[k].Forgotten {
			n := strconv.FormatUint(k.Node, 10)
			m, text := forgot, &ftext
			if t.Forgetting(k.Node) {
				m, text = forgetting, &gtext
			}
			if m[n] == nil {
				*text = append(*text, "node "+n)
			}
			m[n] = append(m[n], k.Index)
		}
	}
	if len(forgot) > 0 {
		d.FieldText("forgotten", forgot, strings.Join(ftext, ", ")+" (grove rldev forget-node: nothing is placed on their disks)")
	}
	if len(forgetting) > 0 {
		d.FieldText("forgetting", forgetting, strings.Join(gtext, ", ")+" (their disks are forgotten but RLDevs are still on them: run grove rldev forget-node NODE --re-place --gone-for-good again to finish)")
	}
	tb := d.Table("rldevs", "RLDEV", "SIZE", "STATE", "PRIMARY", "SECONDARY", "EPOCH", "RESYNC", "MOVE", "SCRUB", "NOTE")
	for _, id := range t.IDs() {
		r := t.RLDevs[id]
		seg := func(i int) (string, map[string]any) {
			sg := r.Segs[i]
			txt := strconv.FormatUint(sg.Node, 10)
			lost, mixed := false, false
			rs := replicaStatus(st, sg.Node, id)
			if rs != nil && rs.Lost && !r.Stale[i] {
				// Its node knows it holds nothing, though no decree could
				// say so (its peer is stale too): not up to date.
				lost = true
				txt += " (lost)"
			}
			if r.Stale[i] {
				txt += " (stale)"
				if rs != nil && rs.Overwritten && !rs.Lost && !rs.Incomplete {
					// A full copy onto it began and did not end: part of
					// each history (accept-stale wants --mixed).
					mixed = true
					txt += " (part-copied)"
				}
			}
			return txt, map[string]any{"node": sg.Node, "disk": sg.Disk, "offset": sg.Offset, "stale": r.Stale[i], "lost": lost, "part_copied": mixed, "incarnation": r.Inc[i]}
		}
		pt, pj := seg(r.Primary)
		stt, sj := seg(1 - r.Primary)
		resync := ""
		if r.State == rldev.Resyncing && r.ProgressTotal > 0 {
			resync = fmt.Sprintf("%d%% of %s", 100*r.Progress/r.ProgressTotal, units.FormatSize(int64(r.ProgressTotal*rldev.BlockSize)))
		}
		move, mj := "", map[string]any{}
		if m := r.Move; m != nil {
			phase := "copying"
			switch {
			case r.State != rldev.Normal:
				phase = "waiting for the RLDev to be normal"
			case m.Switch:
				phase = "switching"
			case m.Inc == 0:
				phase = fmt.Sprintf("waiting for node %d", m.To.Node)
			}
			move = fmt.Sprintf("%s to %d: %s", r.SegmentName(m.Seg), m.To.Node, phase)
			if phase == "copying" && r.ProgressTotal > 0 {
				move += fmt.Sprintf(" %d%%", 100*r.Progress/r.ProgressTotal)
			}
			mj = map[string]any{"segment": m.Seg, "to": map[string]any{"node": m.To.Node, "disk": m.To.Disk, "offset": m.To.Offset},
				"target_incarnation": m.Inc, "switch": m.Switch, "phase": phase, "copied_blocks": r.Progress, "total_blocks": r.ProgressTotal}
		}
		if len(r.Retiring) > 0 {
			var ex []string
			for _, sg := range r.Retiring {
				ex = append(ex, sg.String())
			}
			mj["retiring"] = ex
		}
		var scrub []string
		var notes []string
		passes, repaired := uint64(0), uint64(0)
		for i := range 2 {
			node := r.Segs[i].Node
			rs := replicaStatus(st, node, id)
			switch {
			case st[node] == nil:
				notes = append(notes, fmt.Sprintf("node %d does not answer", node))
				continue
			case rs == nil:
				notes = append(notes, fmt.Sprintf("node %d has not loaded its segment", node))
				continue
			case rs.State == "failed" && rs.Wait != "":
				notes = append(notes, fmt.Sprintf("node %d: segment failed: %s; %s", node, rs.Error, rs.Wait))
			case rs.State == "failed":
				notes = append(notes, fmt.Sprintf("node %d: segment failed: %s", node, rs.Error))
			case rs.Wait != "":
				notes = append(notes, fmt.Sprintf("node %d: %s: %s", node, rs.State, rs.Wait))
			case rs.State != "ready":
				notes = append(notes, fmt.Sprintf("node %d: %s", node, rs.State))
			case rs.Owed > 0 && r.Stale[1-i]:
				notes = append(notes, fmt.Sprintf("node %d: %d ranges wait for node %d's copy, unavailable until it is back (if it is gone for good: grove rldev forget-node %d --re-place)", node, rs.Owed, r.Segs[1-i].Node, r.Segs[1-i].Node))
			case rs.Recovering > 0:
				notes = append(notes, fmt.Sprintf("node %d: recovering %d dirty regions from its peer", node, rs.Recovering))
			case rs.Lost && !r.Stale[i] && r.Stale[1-i]:
				notes = append(notes, fmt.Sprintf("node %d's copy is lost (its disk was replaced) and node %d's is stale: the RLDev waits for an operator (grove rldev accept-stale %d)", node, r.Segs[1-i].Node, id))
			case rs.Stale && r.State == rldev.Degraded:
				if st[r.Segs[1-i].Node] == nil {
					notes = append(notes, fmt.Sprintf("node %d waits to be resynced: the only up-to-date copy (node %d) is down (if it is gone for good: grove rldev accept-stale %d)", node, r.Segs[1-i].Node, id))
				} else {
					notes = append(notes, fmt.Sprintf("node %d waits to be resynced", node))
				}
			}
			passes += rs.ScrubPasses
			repaired += rs.ScrubRepaired
			scrub = append(scrub, fmt.Sprintf("%d:%d", node, rs.ScrubPasses))
		}
		if m := r.Move; m != nil {
			for _, ts := range st[m.To.Node].GetReplicas() {
				if ts.Rldev == id && ts.MoveTarget && ts.Wait != "" {
					notes = append(notes, fmt.Sprintf("move target on node %d: %s", m.To.Node, ts.Wait))
				}
			}
		}
		if len(r.Retiring) > 0 {
			notes = append(notes, fmt.Sprintf("%d old extents to free", len(r.Retiring)))
		}
		scrubText := ""
		if len(scrub) > 0 {
			scrubText = fmt.Sprintf("passes %s, %d repaired", strings.Join(scrub, " "), repaired)
		}
		tb.Row(id, cli.C(units.FormatSize(int64(r.Blocks*rldev.BlockSize)), r.Blocks*rldev.BlockSize), strings.ToLower(r.State.String()),
			cli.C(pt, pj), cli.C(stt, sj), r.Epoch, cli.C(resync, map[string]any{"copied_blocks": r.Progress, "total_blocks": r.ProgressTotal}), cli.C(move, mj),
			cli.C(scrubText, map[string]any{"passes": passes, "repaired": repaired}), cli.C(strings.Join(notes, "; "), notes))
	}
	return d
}

// ------------------------------------------------------------------ create

func rldevCreateCmd() *cobra.Command {
	var c cli.Client
	var out cli.Output
	size := units.Size(1 << 30)
	var count int
	var noDRL, noWait bool
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create RLDevs (placed by chained declustering over the store nodes)",
		Long: `Create --count RLDevs of --size each by decree. Their segments are placed by
chained declustering: RLDev i's primary on store node k, its secondary on node
k+1, so that a failed node's load spreads over its neighbours. The command
waits until every segment's node has taken it (use --no-wait not to).`,
		Example: `  grove rldev create
  grove rldev create --size 64MiB --count 4
  grove rldev create --no-dirty-log   # for a client that keeps its own log`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			if size <= 0 || size%rldev.BlockSize != 0 {
				return cli.Usagef("--size %v: want a positive multiple of %d bytes", int64(size), rldev.BlockSize)
			}
			if count < 1 || count > 1000 {
				return cli.Usagef("--count %d: want 1..1000", count)
			}
			ctx, cancel := commandCtx(cmd.Context(), &c)
			defer cancel()
			s, err := openRLDev(ctx, &c, "rldev create")
			if err != nil {
				return err
			}
			defer s.Close()
			recs, err := s.clerk.Create(ctx, uint64(size), count, noDRL)
			if err != nil {
				return rldevErr("rldev create", &c, err)
			}
			var t *rldev.Table
			for !noWait {
				if t, err = s.clerk.Table(ctx, true); err != nil {
					return rldevErr("rldev create", &c, fmt.Errorf("created %d RLDevs; waiting for their nodes: %w", len(recs), err))
				}
				if joined(t, recs) {
					break
				}
				select {
				case <-ctx.Done():
					return rldevErr("rldev create", &c, fmt.Errorf("created RLDevs %v, but their nodes have not all taken their segments: %w", ids(recs), ctx.Err()))
				case <-time.After(100 * time.Millisecond):
				}
			}
			d := &cli.Doc{}
			tb := d.Table("created", "RLDEV", "SIZE", "PRIMARY", "SECONDARY")
			for _, r := range recs {
				tb.Row(r.ID, cli.C(units.FormatSize(int64(r.Blocks*rldev.BlockSize)), r.Blocks*rldev.BlockSize), r.Segs[0].Node, r.Segs[1].Node)
			}
			return out.Print(os.Stdout, d)
		},
	}
	f := cmd.Flags()
	f.Var(&size, "size", "make each RLDev `SIZE` (1GiB, 64MiB...; whole 4 KiB blocks)")
	f.IntVar(&count, "count", 1, "create `N` RLDevs")
	f.BoolVar(&noDRL, "no-dirty-log", false, "turn the dirty-region log off: the client keeps its own log and reconciles replicas itself")
	f.BoolVar(&noWait, "no-wait", false, "return once the decree commits, without waiting for the nodes to take the segments")
	c.Register(cmd, 30*time.Second)
	out.Register(cmd)
	return cmd
}

func joined(t *rldev.Table, recs []*rldev.Record) bool {
	for _, r := range recs {
		x := t.RLDevs[r.ID]
		if x == nil || x.Inc[0] == 0 || x.Inc[1] == 0 {
			return false
		}
	}
	return true
}

func ids(recs []*rldev.Record) []uint64 {
	var out []uint64
	for _, r := range recs {
		out = append(out, r.ID)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// ------------------------------------------------------------------ read, write

func rldevReadCmd() *cobra.Command {
	var c cli.Client
	var outFile string
	var replica int
	cmd := &cobra.Command{
		Use:   "read ID OFFSET LENGTH",
		Short: "Read bytes of an RLDev to stdout (or --out FILE)",
		Long: `Read LENGTH bytes at OFFSET of RLDev ID (both whole 4 KiB blocks; sizes such as
1MiB are accepted) to stdout, or to --out FILE. The read goes to the primary,
or the other replica if the primary cannot serve; --replica 1 or 2 reads
segment 0 or 1 only.`,
		Example: `  grove rldev read 1 0 4096 | xxd | head
  grove rldev read 1 0 1GiB --out rldev1.img`,
		Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			off, err := parseBytes("OFFSET", args[1])
			if err != nil {
				return err
			}
			n, err := parseBytes("LENGTH", args[2])
			if err != nil {
				return err
			}
			if replica < 0 || replica > 2 {
				return cli.Usagef("--replica %d: want 0 (any), 1 or 2", replica)
			}
			ctx, cancel := commandCtx(cmd.Context(), &c)
			defer cancel()
			s, err := openRLDev(ctx, &c, "rldev read")
			if err != nil {
				return err
			}
			defer s.Close()
			if err := s.checkSpan(ctx, &c, "rldev read", id, off, n); err != nil {
				return err
			}
			w := io.Writer(os.Stdout)
			if outFile != "" { // once the read is known to fit: an existing file is not emptied for nothing
				f, err := os.Create(outFile)
				if err != nil {
					return cli.Failf("rldev read", "%v", err)
				}
				defer f.Close()
				w = f
			}
			buf := make([]byte, min(n, rldev.MaxIO)) // used again for every request
			for done := uint64(0); done < n; {
				k := min(n-done, rldev.MaxIO)
				data := buf[:k]
				err := s.clerk.ReadInto(ctx, id, off+done, data, replica)
				if err != nil {
					return rldevErr("rldev read", &c, err)
				}
				if _, err := w.Write(data); err != nil {
					return cli.Failf("rldev read", "writing the output: %v", err)
				}
				done += k
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&outFile, "out", "", "write to `FILE` instead of stdout")
	cmd.Flags().IntVar(&replica, "replica", 0, "read `N`: 0 any replica, 1 or 2 segment 0 or 1 only")
	c.Register(cmd, cli.DefaultCommandTimeout)
	return cmd
}

func rldevWriteCmd() *cobra.Command {
	var c cli.Client
	var out cli.Output
	var pad bool
	cmd := &cobra.Command{
		Use:   "write ID OFFSET [FILE|-]",
		Short: "Write a file (or stdin) into an RLDev",
		Long: `Write FILE (or stdin, with - or no FILE) at OFFSET of RLDev ID. OFFSET and the
input's length must be whole 4 KiB blocks (--pad fills the last block with
zeros). The command returns once every byte is durable on both replicas (on
the survivor alone in degraded mode). A write that fails part way may have
landed in part: the error says so.`,
		Example: `  grove rldev write 1 0 pattern.bin
  head -c 1MiB /dev/urandom | grove rldev write 1 8MiB -`,
		Args: cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			off, err := parseBytes("OFFSET", args[1])
			if err != nil {
				return err
			}
			r := io.Reader(os.Stdin)
			var length uint64 // a file's, to check before writing; stdin's is known at its end
			if len(args) == 3 && args[2] != "-" {
				f, err := os.Open(args[2])
				if err != nil {
					return cli.Failf("rldev write", "%v", err)
				}
				defer f.Close()
				r = f
				if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
					length = uint64(st.Size())
					if pad {
						length = (length + rldev.BlockSize - 1) / rldev.BlockSize * rldev.BlockSize
					}
				}
			}
			ctx, cancel := commandCtx(cmd.Context(), &c)
			defer cancel()
			s, err := openRLDev(ctx, &c, "rldev write")
			if err != nil {
				return err
			}
			defer s.Close()
			if err := s.checkSpan(ctx, &c, "rldev write", id, off, length); err != nil {
				return err
			}
			buf := make([]byte, rldev.MaxIO)
			written := uint64(0)
			for {
				k, rerr := io.ReadFull(r, buf)
				if k == 0 && (rerr == io.EOF || rerr == io.ErrUnexpectedEOF) {
					break
				}
				if rerr != nil && rerr != io.ErrUnexpectedEOF {
					return cli.Failf("rldev write", "reading the input: %v", rerr)
				}
				if k%rldev.BlockSize != 0 {
					if !pad {
						return cli.Usagef("the input's length is not a multiple of %d bytes (%d bytes left after %d): use --pad to fill the last block with zeros",
							rldev.BlockSize, k, written)
					}
					for k%rldev.BlockSize != 0 {
						buf[k] = 0
						k++
					}
				}
				if err := s.clerk.Write(ctx, id, off+written, buf[:k], rldev.WriteOptions{}); err != nil {
					if written > 0 {
						err = fmt.Errorf("%w (the first %d bytes are written)", err, written)
					}
					return rldevErr("rldev write", &c, err)
				}
				written += uint64(k)
				if rerr == io.ErrUnexpectedEOF {
					break
				}
			}
			d := &cli.Doc{}
			d.FieldText("written", written, fmt.Sprintf("wrote %s (%d bytes) to rldev %d at %d", units.FormatSize(int64(written)), written, id, off))
			d.Field("rldev", id)
			d.Field("offset", off)
			return out.Print(os.Stdout, d)
		},
	}
	cmd.Flags().BoolVar(&pad, "pad", false, "fill the input's last block with zeros instead of refusing a length that is not whole blocks")
	c.Register(cmd, 60*time.Second)
	out.Register(cmd)
	return cmd
}
