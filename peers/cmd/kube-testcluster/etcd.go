package main

import (
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// freePort asks the kernel for a free loopback port. The port is released before etcd or the
// API server binds it; a rare collision fails the start with a clear error rather than silently.
func freePort() (int, error) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer listener.Close()
	return listener.Addr().(*net.TCPAddr).Port, nil
}

func loopbackURL(port int) url.URL {
	return url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", port)}
}

// startEtcd runs a one-member etcd in this process, data under dir/etcd, logs (errors only) in
// dir/etcd.log, and returns it once it serves clients.
func startEtcd(dir string, timeout time.Duration) (*embed.Etcd, string, error) {
	clientPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	cfg := embed.NewConfig()
	cfg.Name = "kube-testcluster"
	cfg.Dir = filepath.Join(dir, "etcd")
	clientURL, peerURL := loopbackURL(clientPort), loopbackURL(peerPort)
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.Logger = "zap"
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
	// A test cluster's data is thrown away with its directory: durability buys nothing and
	// fsync on a shared disk costs seconds.
	cfg.UnsafeNoFsync = true
	server, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("etcd: %w", err)
	}
	select {
	case <-server.Server.ReadyNotify():
		return server, clientURL.String(), nil
	case err := <-server.Err():
		server.Close()
		return nil, "", fmt.Errorf("etcd: %w", err)
	case <-time.After(timeout):
		server.Close()
		return nil, "", fmt.Errorf("etcd was not ready within %s", timeout)
	}
}
