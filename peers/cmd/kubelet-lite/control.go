package main

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/pod-resources-watcher/peers/internal/peerkit"
	"net/http"
)

// serveControl is the tests' handle on kubelet-lite: HTTP+JSON on a unix socket.
//
//	GET    /pods                  the admitted pods with their devices
//	POST   /pods                  admit a pod (podSpec); 200 with its devices, 409 with the
//	                              admission's reason and message when the kubelet rejects it
//	DELETE /pods/{namespace}/{name}  remove it (404 when unknown)
func serveControl(ctx context.Context, path string, n *node) (*http.Server, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /pods", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK, n.list())
	})
	mux.HandleFunc("POST /pods", func(w http.ResponseWriter, r *http.Request) {
		var spec podSpec
		if err := json.NewDecoder(r.Body).Decode(&spec); err != nil {
			reply(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		if _, err := n.admit(r.Context(), spec); err != nil {
			var rejected *admitError
			if errors.As(err, &rejected) {
				reply(w, http.StatusConflict, map[string]string{"reason": rejected.reason, "message": rejected.message})
				return
			}
			reply(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		for _, view := range n.list() {
			if view.Namespace == spec.Namespace && view.Name == spec.Name {
				reply(w, http.StatusOK, view)
				return
			}
		}
	})
	mux.HandleFunc("DELETE /pods/{namespace}/{name}", func(w http.ResponseWriter, r *http.Request) {
		found, err := n.remove(r.PathValue("namespace"), r.PathValue("name"))
		switch {
		case err != nil:
			reply(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		case !found:
			reply(w, http.StatusNotFound, map[string]string{"error": "no such pod"})
		default:
			reply(w, http.StatusOK, map[string]bool{"removed": true})
		}
	})
	return peerkit.ServeControl(ctx, path, mux)
}

// reply answers with status and body as JSON.
var reply = peerkit.Reply
