package ddstable

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/disk"
	"github.com/grovestore/grove/internal/lock"
)

// The brick's side of checkpoints (checkpoint.go): writing its replicas'
// images once settled under a freeze, driving the checkpoints it holds,
// listing its files, and restoring a dead partition from one.
//
// Files: Dir/<table>/<generation, 16 hex digits>/<checkpoint id>/<partition
// bits, hex>-<depth>.ckpt, each written whole and synced before it is
// renamed into place (disk.FS.WriteFileSync). A brick keeps the last
// completed checkpoint of a table's generation, and any newer one in
// progress (pruneCheckpointsLocked); a dropped table's files stay (an
// operator removes them).

// ckptPath is the file of partition p in checkpoint id of table tg.
func (s *Service) ckptPath(tg tableGen, id uint64, p Partition) string {
	return filepath.Join(s.ckptDir(tg, id), fmt.Sprintf("%x-%d.ckpt", p.Bits, p.Depth))
}

func (s *Service) ckptDir(tg tableGen, id uint64) string {
	return filepath.Join(s.cfg.Dir, tg.table, fmt.Sprintf("%016x", tg.gen), strconv.FormatUint(id, 10))
}

// checkpointLocked starts writing this brick's images of every frozen
// table whose replicas here are all settled under the freeze.
func (s *Service) checkpointLocked() {
	if s.cfg.Dir == "" || s.mu.inc == 0 {
		return
	}
	self := s.self()
	for name, m := range s.mu.tables {
		id := m.Freeze.ID
		tg := tableGen{name, m.Gen}
		s.pruneCheckpointsLocked(tg, m.Checkpoint.ID)
		if id == 0 || !m.Freeze.Write || s.mu.ckpt[tg] >= id || time.Now().Before(s.mu.ckptRetry[tg]) {
			continue
		}
		var imgs []*CheckpointImage
		ready := true
		for p, g := range m.RG {
			if !slices.Contains(g, self) {
				continue
			}
			r := s.mu.reps[repKey{name, m.Gen, p}]
			if r == nil || r.pt.FreezeReady(id) != nil {
				ready = false
				break
			}
			// A copy of the map (the values are never changed in place):
			// the freeze may end, and writes resume, while the file is
			// written.
			imgs = append(imgs, &CheckpointImage{Table: name, Gen: m.Gen, ID: id, Partition: p, Entries: maps.Clone(r.store)})
		}
		if !ready || s.ctx.Err() != nil {
			continue
		}
		prev := s.mu.ckpt[tg]
		s.mu.ckpt[tg] = id
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			start := time.Now()
			n, err := s.writeCheckpoint(tg, id, imgs)
			s.mu.Lock()
			defer s.mu.Unlock()
			if err != nil {
				s.mu.ckpt[tg] = prev
				s.mu.ckptRetry[tg] = time.Now().Add(time.Second)
				s.log.Error("checkpoint not written; trying again", "table", name, "checkpoint", id, "err", err)
				return
			}
			s.log.Info("checkpoint written", "table", name, "checkpoint", id, "partitions", len(imgs), "bytes", n, "took", time.Since(start).Round(time.Millisecond))
		}()
	}
}

// writeCheckpoint writes imgs, each file synced, and the directories
// down to the checkpoint's (each entry in its parent synced too, so that
// the files are reachable after a power loss).
func (s *Service) writeCheckpoint(tg tableGen, id uint64, imgs []*CheckpointImage) (int, error) {
	dir := s.ckptDir(tg, id)
	if err := (disk.OS{}).MkdirAll(dir); err != nil {
		return 0, err
	}
	total := 0
	for _, img := range imgs {
		b := EncodeCheckpoint(img)
		path := s.ckptPath(tg, id, img.Partition)
		if err := (disk.OS{}).WriteFileSync(path, b); err != nil {
			_ = os.Remove(path + ".tmp")
			return 0, err
		}
		total += len(b)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if err := syncDir(d); err != nil {
			return 0, err
		}
		if d == filepath.Clean(s.cfg.Dir) || d == filepath.Dir(d) {
			break
		}
	}
	return total, nil
}

// pruneCheckpointsLocked removes this node's files of table tg's
// checkpoints older than the last done (m.Checkpoint), once it is done:
// never the last done, nor one in progress (ids are epochs: they skip).
func (s *Service) pruneCheckpointsLocked(tg tableGen, done uint64) {
	if s.cfg.Dir == "" || done == 0 || s.mu.pruned[tg] >= done {
		return
	}
	s.mu.pruned[tg] = done
	parent := filepath.Join(s.cfg.Dir, tg.table, fmt.Sprintf("%016x", tg.gen))
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ents, err := os.ReadDir(parent)
		if err != nil {
			return
		}
		for _, e := range ents {
			if old, err := strconv.ParseUint(e.Name(), 10, 64); err == nil && old < done {
				_ = os.RemoveAll(filepath.Join(parent, e.Name()))
			}
		}
	}()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// checkpointFiles lists the checkpoint files under Dir (any incarnation's).
func (s *Service) checkpointFiles() []*pb.TableCheckpointFile {
	if s.cfg.Dir == "" {
		return nil
	}
	var out []*pb.TableCheckpointFile
	_ = filepath.WalkDir(s.cfg.Dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".ckpt") {
			return nil
		}
		rel, err := filepath.Rel(s.cfg.Dir, path)
		if err != nil {
			return nil
		}
		parts := strings.Split(rel, string(filepath.Separator))
		if len(parts) != 4 {
			return nil
		}
		gen, err1 := strconv.ParseUint(parts[1], 16, 64)
		id, err2 := strconv.ParseUint(parts[2], 10, 64)
		bits, depth, ok := strings.Cut(strings.TrimSuffix(parts[3], ".ckpt"), "-")
		b, err3 := strconv.ParseUint(bits, 16, 64)
		dp, err4 := strconv.ParseUint(depth, 10, 8)
		p := Partition{Bits: b, Depth: uint8(dp)}
		if err1 != nil || err2 != nil || err3 != nil || err4 != nil || !ok || !p.Valid() {
			return nil
		}
		size := int64(0)
		if info, err := d.Info(); err == nil {
			size = info.Size()
		}
		out = append(out, &pb.TableCheckpointFile{Table: parts[0], Gen: gen, Id: id, Partition: partPB(p), Bytes: uint64(size)})
		return nil
	})
	return out
}

// checkpoint drives checkpoint id of table k, whose freeze this brick
// holds: it waits until every member of every group is settled under the
// freeze, decrees its images written, waits until every member has
// written its files (both asked through Status), then decrees the
// checkpoint done; after settleTimeout it gives the freeze up.
func (s *Service) checkpoint(k repKey, id uint64, self BrickID) {
	start := time.Now()
	log := s.log.With("table", k.table, "checkpoint", id)
	for try := 0; s.ctx.Err() == nil; try++ {
		if try > 0 {
			time.Sleep(100 * time.Millisecond)
		}
		s.mu.Lock()
		m := s.mu.tables[k.table]
		live := s.mu.inc == self.Inc
		s.mu.Unlock()
		if m == nil || m.Gen != k.gen || m.Freeze.ID != id || m.Freeze.Holder != self || !live {
			return
		}
		if time.Since(start) > settleTimeout {
			err := s.updateTable(k, func(m *Maps) (*Maps, error) {
				c, ok := WithoutFreeze(m, self)
				if !ok || c.Freeze.ID != 0 && c.Freeze.ID != id {
					return nil, nil
				}
				return c, nil
			})
			log.Warn("checkpoint given up: not every member wrote its files", "freeze released", err == nil)
			return
		}
		need := map[uint64]map[Partition]bool{} // node → partitions it must have written
		for p, g := range m.RG {
			for _, b := range g {
				if need[b.Node] == nil {
					need[b.Node] = map[Partition]bool{}
				}
				need[b.Node][p] = true
			}
		}
		incs := map[uint64]uint64{}
		for _, g := range m.RG {
			for _, b := range g {
				incs[b.Node] = b.Inc
			}
		}
		done := true
		for node, parts := range need {
			st, err := s.statusOf(node)
			if err != nil || st.Inc != incs[node] {
				done = false
				break
			}
			if !m.Freeze.Write {
				for _, r := range st.Replicas {
					if p, ok := partOf(r.Partition); ok && r.Table == k.table && r.SettledFreeze == id {
						delete(parts, p)
					}
				}
			} else {
				for _, f := range st.Checkpoints {
					if p, ok := partOf(f.Partition); ok && f.Table == k.table && f.Gen == k.gen && f.Id == id {
						delete(parts, p)
					}
				}
			}
			if len(parts) > 0 {
				done = false
				break
			}
		}
		if !done {
			continue
		}
		if !m.Freeze.Write {
			if err := s.updateTable(k, func(m *Maps) (*Maps, error) {
				if m.Freeze.ID == id && m.Freeze.Write {
					return nil, nil // a resend found it done
				}
				return FreezeSettled(m, id, self)
			}); err != nil && (errors.Is(err, ErrFreezeLost) || errors.Is(err, ErrNoTable)) {
				log.Warn("checkpoint given up: its freeze is gone", "err", err)
				return
			}
			continue
		}
		err := s.updateTable(k, func(m *Maps) (*Maps, error) {
			if m.Checkpoint.ID >= id {
				return nil, nil // a resend found it done
			}
			return Checkpointed(m, id, self)
		})
		if err == nil {
			log.Info("checkpoint done: every member wrote its files", "writes waited", time.Since(start).Round(time.Millisecond))
			return
		}
		if errors.Is(err, ErrFreezeLost) || errors.Is(err, ErrNoTable) {
			log.Warn("checkpoint given up: its freeze is gone", "err", err)
			return
		}
	}
}

// statusOf is node's brick's status (its replicas and checkpoint files).
func (s *Service) statusOf(node uint64) (*pb.TableBrickStatus, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.CallTimeout)
	defer cancel()
	if node == s.cfg.Node {
		return s.Status(ctx, nil)
	}
	cl, err := s.client(ctx, node)
	if err != nil {
		return nil, err
	}
	return cl.Status(ctx, &pb.TableBrickStatusRequest{})
}

// Restore restarts a partition whose every member is dead from this
// node's file of the table's last checkpoint (checkpoint.go): it loads the
// file and decrees this brick the group's only member; its watch then
// installs the image as the replica.
func (s *Service) Restore(ctx context.Context, req *pb.TableRestoreRequest) (*pb.TableRestoreResponse, error) {
	p, ok := partOf(req.Partition)
	if !ok {
		return nil, status.Error(codes.InvalidArgument, "ddstable: invalid partition")
	}
	s.mu.Lock()
	self := s.self()
	m := s.mu.tables[req.Table]
	if s.mu.inc == 0 || brickOf(req.To) != self {
		s.mu.Unlock()
		return nil, errNotServing
	}
	if m == nil || m.Gen != req.Gen {
		s.mu.Unlock()
		return nil, status.Errorf(codes.NotFound, "%v: %q generation %x", ErrNoTable, req.Table, req.Gen)
	}
	dead := slices.Clone(m.RG[p])
	last := m.Checkpoint.ID
	k := repKey{req.Table, req.Gen, p}
	s.mu.Unlock()
	if dead == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "%v: %v", ErrLayout, p)
	}
	if req.Id == 0 || req.Id != last {
		return nil, status.Errorf(codes.FailedPrecondition, "%v: %d (the table's last is %d)", ErrNoCheckpoint, req.Id, last)
	}
	if s.cfg.Detector == nil {
		return nil, status.Error(codes.Unavailable, "ddstable: no failure detector here")
	}
	subs := make([]lock.Subject, len(dead))
	for i, b := range dead {
		subs[i] = lock.Subject{Node: b.Node, Inc: b.Inc}
	}
	verdicts, err := s.cfg.Detector.Dead(ctx, subs)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "ddstable: the failure detector: %v", err)
	}
	for i, d := range verdicts {
		if !d {
			return nil, status.Errorf(codes.FailedPrecondition, "%v: %v", ErrLive, dead[i])
		}
	}
	tg := tableGen{req.Table, req.Gen}
	b, err := os.ReadFile(s.ckptPath(tg, req.Id, p))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, status.Errorf(codes.NotFound, "ddstable: no file of checkpoint %d of partition %v on node %d", req.Id, p, s.cfg.Node)
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "ddstable: %v", err)
	}
	img, err := DecodeCheckpoint(b)
	if err != nil {
		return nil, status.Errorf(codes.DataLoss, "%v", err)
	}
	if img.Table != req.Table || img.Gen != req.Gen || img.ID != req.Id || img.Partition != p {
		return nil, status.Errorf(codes.DataLoss, "ddstable: checkpoint file of %q %x %d %v where %q %x %d %v was expected",
			img.Table, img.Gen, img.ID, img.Partition, req.Table, req.Gen, req.Id, p)
	}
	s.mu.Lock()
	again := s.mu.pending[k] != nil && slices.Equal(s.mu.restoring[k], dead)
	if s.mu.inc != self.Inc || s.mu.reps[k] != nil || (s.mu.pending[k] != nil && !again) {
		s.mu.Unlock()
		return nil, status.Error(codes.FailedPrecondition, "ddstable: this brick serves the partition, or is recovering or restoring it")
	}
	// (again: a restore of this brick's whose decree's answer was lost:
	// the decree is asked again, and finds it done if it landed; review
	// 124.)
	s.mu.pending[k] = img.Entries
	s.mu.restoring[k] = dead
	s.mu.Unlock()
	var epoch uint64
	err = s.updateTable(k, func(m *Maps) (*Maps, error) {
		if slices.Equal(m.RG[p], []BrickID{self}) {
			epoch = m.Epoch
			return nil, nil // a resend found it done
		}
		c, err := Restored(m, p, dead, req.Id, self)
		if err == nil {
			epoch = c.Epoch
		}
		return c, err
	})
	if err != nil {
		refused := errors.Is(err, ErrLive) || errors.Is(err, ErrNoCheckpoint) || errors.Is(err, ErrLayout) ||
			errors.Is(err, ErrCheckpointing) || errors.Is(err, ErrRecovering) || errors.Is(err, ErrReshaping) || errors.Is(err, ErrNoTable)
		if refused {
			s.mu.Lock()
			delete(s.mu.pending, k)
			delete(s.mu.restoring, k)
			s.mu.Unlock()
			return nil, status.Errorf(codes.FailedPrecondition, "%v", err)
		}
		// Not known to have landed: the image stays until the maps tell
		// (syncLocked).
		return nil, status.Errorf(codes.Unavailable, "ddstable: the restore's decree is not known to have landed (grove table stat tells): %v", err)
	}
	s.log.Warn("partition restored from a checkpoint: what was written after it is lost", "table", req.Table, "partition", p, "checkpoint", req.Id, "keys", len(img.Entries), "epoch", epoch)
	return &pb.TableRestoreResponse{Keys: uint64(len(img.Entries)), Epoch: epoch}, nil
}

// resolveRestoreLocked drops a restore's image once the maps say its
// decree did not and cannot land: the group is neither the dead one it
// replaced nor this brick.
func (s *Service) resolveRestoreLocked(k repKey) {
	m := s.mu.tables[k.table]
	if m != nil && m.Gen == k.gen && (slices.Equal(m.RG[k.part], s.mu.restoring[k]) || slices.Contains(m.RG[k.part], s.self())) {
		return
	}
	delete(s.mu.pending, k)
	delete(s.mu.restoring, k)
}
