// Package peerkit holds what several test peers do alike: wait for a unix socket to accept, and
// serve the tests' control requests (HTTP with JSON bodies) on a unix socket.
package peerkit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"syscall"
	"time"
)

// AwaitSocket dials the unix socket at path until it accepts, for at most timeout; a cancelled
// ctx ends the wait with ctx's error.
func AwaitSocket(ctx context.Context, path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		conn, err := net.Dial("unix", path)
		if err == nil {
			return conn.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s never accepted: %w", path, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ServeControl serves mux on a new unix socket at path (a stale one from an earlier process is
// replaced), its requests' contexts derived from ctx.
func ServeControl(ctx context.Context, path string, mux *http.ServeMux) (*http.Server, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	server := &http.Server{Handler: mux, BaseContext: func(net.Listener) context.Context { return ctx }}
	go func() { _ = server.Serve(l) }()
	return server, nil
}

// Reply answers with status and body as JSON.
func Reply(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// DieWithParent asks the kernel to send this process SIGTERM when the thread that started it
// ends: a test runner killed (or a crashed `make real-node`) leaves no peer running, a root
// kubelet least of all. It survives the kubelet's re-exec under unshare(1). Call it first in main.
func DieWithParent() {
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0)
}
