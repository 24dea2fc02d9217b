package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// waitReady polls until /readyz answers ok and the namespace default exists (the API server
// creates it shortly after it starts serving, and Node events live there), or fails when the
// API server exits, the signal context ends or the timeout passes.
func waitReady(ctx context.Context, server, caFile, token string, timeout time.Duration, done <-chan error) error {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	client := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	ok := func(path string) (bool, string) {
		request, err := http.NewRequestWithContext(ctx, http.MethodGet, server+path, nil)
		if err != nil {
			return false, err.Error()
		}
		request.Header.Set("Authorization", "Bearer "+token)
		response, err := client.Do(request)
		if err != nil {
			return false, err.Error()
		}
		defer response.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(response.Body, 4096))
		return response.StatusCode == http.StatusOK, fmt.Sprintf("%s: %d %s", path, response.StatusCode, body)
	}
	deadline := time.After(timeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last := "no answer yet"
	for {
		select {
		case err := <-done:
			return fmt.Errorf("kube-apiserver exited before it was ready: %v (see kube-apiserver.log)", err)
		case <-ctx.Done():
			return fmt.Errorf("stopped by a signal before the API server was ready")
		case <-deadline:
			return fmt.Errorf("the API server was not ready within %s; last answer: %s (see kube-apiserver.log)", timeout, last)
		case <-tick.C:
		}
		ready, answer := ok("/readyz")
		last = answer
		if !ready {
			continue
		}
		if ready, answer = ok("/api/v1/namespaces/default"); ready {
			return nil
		}
		last = answer
	}
}
