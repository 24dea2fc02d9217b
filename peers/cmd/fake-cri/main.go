// fake-cri serves upstream's fake CRI runtime (k8s.io/cri-client/pkg/fake) on a unix socket, as
// a process of its own: like a node's containerd it outlives kubelet restarts, so a restarted
// kubelet finds its pods' sandboxes and containers still running instead of recreating them.
// See peers/README.md, "kubelet".
package main

import (
	"context"
	"flag"
	"fmt"
	"github.com/pod-resources-watcher/peers/internal/peerkit"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/cri-client/pkg/fake"
)

func main() {
	peerkit.DieWithParent()
	socket := flag.String("socket", "", "the unix socket to serve the CRI runtime and image services on (required)")
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), `Usage: fake-cri --socket PATH

Serves upstream's fake CRI runtime (k8s.io/cri-client/pkg/fake): sandboxes and containers are
records (StartContainer marks one RUNNING), images "pull" instantly. Prints "fake-cri ready" once
the socket accepts; SIGTERM or SIGINT stops it.

`)
		flag.PrintDefaults()
	}
	flag.Parse()
	if *socket == "" {
		fmt.Fprintln(os.Stderr, "fake-cri: --socket is required")
		os.Exit(2)
	}
	runtime := fake.NewFakeRemoteRuntime()
	// The CRI client refuses an image whose size is 0 ("Id or size of image ... is not set").
	runtime.ImageService.SetFakeImageSize(1 << 20)
	if err := runtime.Start("unix://" + *socket); err != nil {
		fmt.Fprintln(os.Stderr, "fake-cri:", err)
		os.Exit(1)
	}
	if err := peerkit.AwaitSocket(context.Background(), *socket, 10*time.Second); err != nil {
		fmt.Fprintln(os.Stderr, "fake-cri:", err)
		os.Exit(1)
	}
	fmt.Println("fake-cri ready")

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	// The fake records every call for test assertions; nobody reads it here, and the kubelet's
	// PLEG calls several times a second, so trim it or a long demo grows without bound.
	trim := time.NewTicker(time.Minute)
	defer trim.Stop()
	for {
		select {
		case <-signals:
			runtime.Stop()
			return
		case <-trim.C:
			runtime.RuntimeService.Lock()
			runtime.RuntimeService.Called = nil
			runtime.RuntimeService.Unlock()
			runtime.ImageService.Lock()
			runtime.ImageService.Called = nil
			runtime.ImageService.Unlock()
		}
	}
}
