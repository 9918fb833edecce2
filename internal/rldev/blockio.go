package rldev

import "github.com/grovestore/grove/internal/disk"

// The I/O of the engine's block effects, shared by the runtime and the
// simulators (the engine's files do no I/O).

// ReadRun carries out a DiskRead of a run of blocks at off of dev: one
// read, then the checks (BlockRun.Decode).
func ReadRun(dev disk.Device, off int64, run BlockRun) (RunData, error) {
	raw := make([]byte, int(run.N)*PhysBlockSize)
	if _, err := dev.ReadAt(raw, off); err != nil {
		return RunData{}, err
	}
	return run.Decode(raw), nil
}

// DoWrite carries out a DiskWrite on dev: its data, or Encode's.
func DoWrite(dev disk.Device, w DiskWrite) error {
	data := w.Data
	if w.Encode != nil {
		data = w.Encode()
	}
	_, err := dev.WriteAt(data, w.Off)
	return err
}
