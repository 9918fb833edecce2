// Package disk is Grove's access to local storage: a small FS interface with
// the durability contract written into it, the real implementation on the
// operating system's files, and a crashable in-memory one for simulations
// (a crash keeps only what was synced, as a power cut would).
//
// Later layers (RLDev segments, the chunk store) extend it additively with
// block devices, checksums and fault injection.
package disk

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
)

// FS is the small file interface protocol code writes through.
type FS interface {
	// ReadFile returns a file's contents; fs.ErrNotExist if there is none.
	ReadFile(path string) ([]byte, error)
	// WriteFileSync replaces path with data atomically and durably: when it
	// returns nil, a crash at any later point leaves exactly data at path;
	// a crash before it returns leaves either the old or the new contents.
	WriteFileSync(path string, data []byte) error
	// MkdirAll creates a directory and its parents.
	MkdirAll(path string) error
}

// OS is the real file system.
type OS struct{}

var _ FS = OS{}

func (OS) ReadFile(path string) ([]byte, error) { return os.ReadFile(path) }
func (OS) MkdirAll(path string) error           { return os.MkdirAll(path, 0o755) }

// WriteFileSync writes a temporary file, fsyncs it, renames it over path and
// fsyncs the directory, so that the rename itself is durable.
func (OS) WriteFileSync(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer dir.Close()
	return dir.Sync()
}

// Mem is an in-memory FS for simulations. Every WriteFileSync is durable by
// contract, so a Crash loses nothing written through it; FailWrites makes
// writes fail (a full or broken disk) to test that callers stop rather than
// proceed without durability.
type Mem struct {
	mu         sync.Mutex
	files      map[string][]byte
	failWrites error
}

var _ FS = (*Mem)(nil)

// NewMem returns an empty in-memory FS.
func NewMem() *Mem { return &Mem{files: map[string][]byte{}} }

// ErrFull is what FailWrites(ErrFull) makes writes return.
var ErrFull = errors.New("disk: no space left on device")

// FailWrites makes every later write return err (nil to heal).
func (m *Mem) FailWrites(err error) {
	m.mu.Lock()
	m.failWrites = err
	m.mu.Unlock()
}

func (m *Mem) ReadFile(path string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.files[filepath.Clean(path)]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: path, Err: fs.ErrNotExist}
	}
	return append([]byte(nil), b...), nil
}

func (m *Mem) WriteFileSync(path string, data []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failWrites != nil {
		return m.failWrites
	}
	m.files[filepath.Clean(path)] = append([]byte(nil), data...)
	return nil
}

func (m *Mem) MkdirAll(string) error { return nil }
