package chunk

// Reads and writes of a chunk's bytes on its RLDev, in callback style so
// that the node runtime and the simulator run the same code. A chunk takes
// whole RLDev blocks; a write that starts or ends inside a block (and does
// not end at the chunk's end, past which a block is padding) reads that
// block first and writes it back whole: writes of one chunk through one
// manager are serialized by its runtime, and writers of one chunk through
// both managers must order their writes themselves (a lock), as with any
// shared disk.

// blockIO is the RLDev access chunk I/O needs.
type blockIO interface {
	readBlocks(rldev, block, blocks uint64, done func([]byte, error))
	writeBlocks(rldev, block uint64, data []byte, done func(error))
}

// readChunk reads n bytes at off of the chunk at e (the range checked by
// Admit).
func readChunk(io blockIO, e Extent, off, n uint64, done func([]byte, error)) {
	if n == 0 {
		done(nil, nil)
		return
	}
	first := off / BlockSize
	last := (off + n - 1) / BlockSize
	io.readBlocks(e.RLDev, e.Block+first, last-first+1, func(b []byte, err error) {
		if err != nil {
			done(nil, err)
			return
		}
		s := off - first*BlockSize
		done(b[s:s+n], nil)
	})
}

// writeChunk writes data at off of the chunk at e (the range checked by
// Admit).
func writeChunk(io blockIO, e Extent, off uint64, data []byte, done func(error)) {
	n := uint64(len(data))
	if n == 0 {
		done(nil)
		return
	}
	first := off / BlockSize
	last := (off + n - 1) / BlockSize
	buf := make([]byte, (last-first+1)*BlockSize)
	head := off - first*BlockSize
	end := off + n
	tailPartial := end%BlockSize != 0 && end < e.Len
	var need []uint64 // blocks (relative) to read first
	if head != 0 {
		need = append(need, first)
	}
	if tailPartial && (last != first || head == 0) {
		need = append(need, last)
	}
	finish := func() {
		copy(buf[head:], data)
		io.writeBlocks(e.RLDev, e.Block+first, buf, done)
	}
	if len(need) == 0 {
		finish()
		return
	}
	pending := len(need)
	var rerr error
	for _, b := range need {
		b := b
		io.readBlocks(e.RLDev, e.Block+b, 1, func(got []byte, err error) {
			if err != nil && rerr == nil {
				rerr = err
			}
			if err == nil {
				copy(buf[(b-first)*BlockSize:], got)
			}
			if pending--; pending > 0 {
				return
			}
			if rerr != nil {
				done(rerr)
				return
			}
			finish()
		})
	}
}
