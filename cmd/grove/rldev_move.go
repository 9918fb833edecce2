package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/grovestore/grove/internal/cli"
	"github.com/grovestore/grove/internal/rldev"
	"github.com/grovestore/grove/internal/units"
)

func rldevMoveCmd() *cobra.Command {
	var c cli.Client
	var out cli.Output
	var segName, to string
	var cancelMove, noWait bool
	cmd := &cobra.Command{
		Use:   "move ID --segment primary|secondary --to NODE[:DISK]",
		Short: "Move a segment of an RLDev to another node or disk, online",
		Long: `Move one segment of an RLDev to a disk of another node while it serves reads
and writes: the primary copies every block to the new place and forwards it
every write meanwhile, then the moving replica stops serving and the table is
switched to the new place by decree, and the old extent is wiped and freed.
The RLDev keeps both of its copies up to date throughout.

The command asks for the move, then follows it with a progress bar (on
standard error) until the segment serves from its new place. The move goes on
without it: after Ctrl-C, a timeout or a crash of any node, run the same
command again to follow it (it never asks twice), or --cancel it. If the
disk of the replica that moves fails meanwhile, its segment is rebuilt at the
target from the other copy, and the command follows that copy too; if its
node dies, the move waits for it to come back (its copy is kept: it may be
all that is left should the other copy fail too).

A stale segment of a degraded RLDev (its node down, perhaps for good) is
re-placed at once: its new place becomes the segment, copied whole from the
primary, and its old copy is given up. To move the segment of a node gone
for good whose move waits: --cancel, then move it again.

NODE must not hold the RLDev's other segment (the two copies stay on two
nodes); DISK is the index of one of its disks (default: the first with room).
To empty a disk (before replacing it), move each segment on it to another disk
of the same node: NODE:DISK, the disk named. An RLDev created with
--no-dirty-log cannot be moved (its client writes each replica itself).`,
		Example: `  grove rldev move 3 --segment secondary --to 4
  grove rldev move 3 --segment primary --to 5:1
  grove rldev move 3 --segment secondary --to 2:1   # its node 2's disk 1
  grove rldev move 3 --cancel`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			var node uint64
			disk := -1
			seg := segName
			if !cancelMove {
				if seg != "primary" && seg != "secondary" {
					return cli.Usagef("--segment %q: want primary or secondary", seg)
				}
				if node, disk, err = parseNodeDisk(to); err != nil {
					return err
				}
			} else if to != "" || segName != "" {
				return cli.Usagef("--cancel takes no --segment or --to")
			}
			ctx, cancel := commandCtx(cmd.Context(), &c)
			defer cancel()
			s, err := openRLDev(ctx, &c, "rldev move")
			if err != nil {
				return err
			}
			defer s.Close()
			if cancelMove {
				if err := s.clerk.CancelMove(ctx, id); err != nil {
					return moveErr(&c, err)
				}
				d := &cli.Doc{}
				d.Field("rldev", id)
				d.Field("move", "cancelled")
				return out.Print(os.Stdout, d)
			}
			t, err := s.clerk.Table(ctx, true)
			if err != nil {
				return rldevErr("rldev move", &c, err)
			}
			rec := t.RLDevs[id]
			if rec == nil {
				return rldevErr("rldev move", &c, fmt.Errorf("%w: rldev %d", rldev.ErrUnknown, id))
			}
			idx := rec.Primary
			if seg == "secondary" {
				idx = rec.Secondary()
			}
			if m := rec.Move; m != nil && m.To.Node == node && (disk < 0 || int(m.To.Disk) == disk) {
				idx = m.Seg // following a move asked earlier (the primary may have changed since)
			}
			var dst rldev.Segment
			final := rec
			if i, ok := movedThere(rec, idx, node, disk); ok {
				// Run again after the move ended, or ended as a rebuild
				// (its moving replica was lost): it is followed, not
				// asked again.
				idx, dst = i, rec.Segs[i]
				fmt.Fprintf(os.Stderr, "rldev %d: segment %d is at %v already\n", id, idx, dst)
				if disk < 0 {
					fmt.Fprintf(os.Stderr, "rldev %d: to move it to another disk of node %d, name the disk (--to %d:DISK)\n", id, node, node)
				}
			} else {
				mv, err := s.clerk.Move(ctx, id, idx, node, disk)
				if err != nil {
					return moveErr(&c, err)
				}
				if mv.Move == nil {
					// A stale segment of a degraded RLDev is re-placed at
					// once (Table.StartMove): rebuilt there by a full copy.
					dst, final = mv.Segs[idx], mv
					fmt.Fprintf(os.Stderr, "rldev %d: segment %d (%s, %v) is stale and the RLDev degraded: re-placed at %v, to be copied whole from the primary (its old copy is given up)\n", id, idx, seg, rec.Segs[idx], dst)
				} else {
					dst, final = mv.Move.To, mv
					fmt.Fprintf(os.Stderr, "rldev %d: moving segment %d (%s, %v) to %v\n", id, idx, seg, rec.Segs[idx], dst)
				}
			}
			if !noWait {
				if final, err = followMove(ctx, s, id, idx, dst); err != nil {
					if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
						fmt.Fprintf(os.Stderr, "rldev %d: the move goes on without this command: run it again to follow it, or grove rldev move %d --cancel\n", id, id)
					}
					return moveErr(&c, err)
				}
			}
			d := &cli.Doc{}
			d.Field("rldev", id)
			d.Field("segment", idx)
			d.Field("to", dst.String())
			state := "asked"
			if !noWait {
				state = "moved"
			}
			d.Field("move", state)
			d.Field("state", final.State.String())
			d.Field("primary_node", final.Segs[final.Primary].Node)
			d.Field("secondary_node", final.Segs[final.Secondary()].Node)
			return out.Print(os.Stdout, d)
		},
	}
	f := cmd.Flags()
	f.StringVar(&segName, "segment", "", "the segment to move: `primary` or secondary")
	f.StringVar(&to, "to", "", "where: `NODE[:DISK]` (a node without the other segment; the first disk with room by default, named for another disk of the segment's node)")
	f.BoolVar(&cancelMove, "cancel", false, "abandon the RLDev's move in progress (the target's extent is freed)")
	f.BoolVar(&noWait, "no-wait", false, "return once the move is asked, without following it")
	c.Register(cmd, 0)
	out.Register(cmd)
	return cmd
}

// movedThere finds the segment of rec a move to NODE[:DISK] (disk < 0:
// any) asked earlier put there, when the command runs again to follow it
// and no move is in progress: segment idx at NODE[:DISK] (the command run
// again after a move to another node ended said "name the disk", exit 1,
// though the move it followed was done), or either
// segment at NODE[:DISK] that is being rebuilt there (its move's moving
// replica was lost: the target took its place, to be copied whole; after
// a failover the segment may be the other one than named).
func movedThere(rec *rldev.Record, idx int, node uint64, disk int) (int, bool) {
	if rec.Move != nil {
		return 0, false
	}
	for _, i := range []int{idx, 1 - idx} {
		sg := rec.Segs[i]
		at := sg.Node == node && (disk < 0 || sg.Disk == uint32(disk))
		if at && (rec.Stale[i] && rec.FullCopy || i == idx) {
			return i, true
		}
	}
	return 0, false
}

// parseNodeDisk parses NODE[:DISK].
func parseNodeDisk(s string) (uint64, int, error) {
	if s == "" {
		return 0, 0, cli.Usagef("--to is required: NODE[:DISK]")
	}
	ns, ds, hasDisk := strings.Cut(s, ":")
	node, err := strconv.ParseUint(ns, 10, 64)
	if err != nil || node == 0 {
		return 0, 0, cli.Usagef("--to %q: NODE is a node id (grove status lists them)", s)
	}
	disk := -1
	if hasDisk {
		d, err := strconv.ParseUint(ds, 10, 32)
		if err != nil {
			return 0, 0, cli.Usagef("--to %q: DISK is a disk index (0 for the node's first disk)", s)
		}
		disk = int(d)
	}
	return node, disk, nil
}

func moveErr(c *cli.Client, err error) error {
	switch {
	case errors.Is(err, rldev.ErrMove), errors.Is(err, rldev.ErrNoSpace):
		return &cli.Error{Code: cli.ExitFailed, Op: "rldev move", Msg: err.Error(), Hint: "grove rldev list shows where segments are and what is moving", Err: err}
	}
	return rldevErr("rldev move", c, err)
}

// errMoveAbandoned: the move ended without the segment at its target.
var errMoveAbandoned = errors.New("the move was abandoned")

// followMove watches the table until segment idx of RLDev id serves from
// dst (the RLDev normal), showing the copy's progress.
func followMove(ctx context.Context, s *rldevSession, id uint64, idx int, dst rldev.Segment) (*rldev.Record, error) {
	p := newProgress(os.Stderr, fmt.Sprintf("rldev %d", id))
	defer p.Finish()
	hinted := false
	for fresh := false; ; {
		// The watched table, which may lag the decree that asked for the
		// move: an end it shows is confirmed by a read from the leader.
		t, err := s.clerk.Table(ctx, fresh)
		if err != nil {
			return nil, err
		}
		rec := t.RLDevs[id]
		if ended := rec == nil || rec.Move == nil && (rec.Segs[idx] != dst || rec.State == rldev.Normal); ended && !fresh {
			fresh = true
			continue
		}
		fresh = false
		if rec == nil {
			return nil, fmt.Errorf("%w: rldev %d is gone", errMoveAbandoned, id)
		}
		m := rec.Move
		switch {
		case m == nil && rec.Segs[idx] != dst:
			return nil, fmt.Errorf("%w: rldev %d's segment %d is at %v, not %v (cancelled, or the target failed: see its node's log)", errMoveAbandoned, id, idx, rec.Segs[idx], dst)
		case m == nil && rec.State == rldev.Normal:
			p.Set("moved", rec.Blocks, rec.Blocks)
			return rec, nil
		case m == nil:
			p.Set(fmt.Sprintf("rebuilding at the target (%v)", rec.State), rec.Progress, progressTotal(rec))
		case rec.State != rldev.Normal:
			if rec.State == rldev.Degraded && rec.Stale[m.Seg] && !hinted {
				hinted = true
				// (The stale segment of a degraded RLDev is its secondary:
				// named, since a "primary" asked for first is now the
				// survivor's segment; outside review 82.)
				fmt.Fprintf(os.Stderr, "rldev %d: the moving segment is stale (node %d down?): the move waits for it to be resynced. If node %d is gone for good: grove rldev move %d --cancel, then grove rldev move %d --segment secondary --to %s, to rebuild the segment there (its old copy is given up)\n",
					id, rec.Segs[m.Seg].Node, rec.Segs[m.Seg].Node, id, id, fmt.Sprintf("%d:%d", m.To.Node, m.To.Disk))
			}
			p.Set(fmt.Sprintf("waiting: the RLDev is %v", rec.State), 0, rec.Blocks)
		case m.Switch:
			p.Set("switching", rec.Blocks, rec.Blocks)
		case m.Inc == 0:
			p.Set(fmt.Sprintf("waiting for node %d to take the target", m.To.Node), 0, rec.Blocks)
		default:
			p.Set("copying", rec.Progress, progressTotal(rec))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// progressTotal is what a copy of rec copies: the blocks it reported, or
// (none reported yet) the whole RLDev.
func progressTotal(rec *rldev.Record) uint64 {
	if rec.ProgressTotal == 0 {
		return rec.Blocks
	}
	return rec.ProgressTotal
}

// progress shows a copy's progress on w: a bar on a terminal, a line
// every few seconds (and at each change of phase) otherwise.
type progress struct {
	w       io.Writer
	what    string
	bar     *progressbar.ProgressBar
	phase   string
	printed time.Time
}

func newProgress(w io.Writer, what string) *progress {
	p := &progress{w: w, what: what}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.bar = progressbar.NewOptions64(1, progressbar.OptionSetWriter(w), progressbar.OptionShowBytes(true),
			progressbar.OptionSetWidth(30), progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish(),
			progressbar.OptionSetDescription(what))
	}
	return p
}

// Set shows the phase and blocks done of total.
func (p *progress) Set(phase string, done, total uint64) {
	if p.bar != nil {
		p.bar.ChangeMax64(int64(total * rldev.BlockSize))
		p.bar.Describe(p.what + ": " + phase)
		_ = p.bar.Set64(int64(done * rldev.BlockSize))
		return
	}
	if phase == p.phase && time.Since(p.printed) < 5*time.Second {
		return
	}
	p.phase, p.printed = phase, time.Now()
	fmt.Fprintf(p.w, "%s: %s, %s of %s (%d%%)\n", p.what, phase, units.FormatSize(int64(done*rldev.BlockSize)),
		units.FormatSize(int64(total*rldev.BlockSize)), 100*done/max(total, 1))
}

// Finish ends the bar.
func (p *progress) Finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}
