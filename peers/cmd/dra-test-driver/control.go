package main

import (
	"context"
	"encoding/json"
	"github.com/pod-resources-watcher/peers/internal/peerkit"
	"net/http"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/kubernetes/test/e2e/dra/test-driver/app"
)

// healthSendTimeout bounds a /health request: upstream's HealthControlChan holds 10 updates and
// only a running WatchHealthStatus (a kubelet's open health stream) reads it.
const healthSendTimeout = 5 * time.Second

type healthRequest struct {
	Pool    string `json:"pool"`
	Device  string `json:"device"`
	Health  string `json:"health"`
	Message string `json:"message"`
}

type taintRequest struct {
	Device string `json:"device"`
	Key    string `json:"key"`
	Value  string `json:"value"`
	Effect string `json:"effect"`
}

type claimView struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}

// serveControl is the tests' handle on the driver: HTTP+JSON on a unix socket.
//
//	POST /health  {"pool", "device", "health", "message"}  an app.DeviceHealthUpdate on the plugin's
//	              HealthControlChan (409 without --health, 503 when nothing reads it within 5 s)
//	POST /taint   {"device", "key", "value", "effect"}  republish with the taint on the device
//	POST /untaint {"device", "key"}  republish without it (404 when the device has no such taint)
//	POST /mute, POST /unmute  withhold the health stream's reports, and stop withholding them
//	GET  /state   prepared claims, registration, health stream figures, taints, errors
func serveControl(ctx context.Context, path string, d *driver) (*http.Server, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /health", func(w http.ResponseWriter, r *http.Request) {
		var req healthRequest
		if !decode(w, r, &req) {
			return
		}
		if !d.opts.health {
			reply(w, http.StatusConflict, errorBody("the health service is off (started without --health)"))
			return
		}
		switch req.Health {
		case "Healthy", "Unhealthy", "Unknown":
		default:
			reply(w, http.StatusBadRequest, errorBody(`health must be "Healthy", "Unhealthy" or "Unknown"`))
			return
		}
		if req.Device == "" {
			reply(w, http.StatusBadRequest, errorBody("device is required"))
			return
		}
		if req.Pool == "" {
			req.Pool = d.opts.pool
		}
		// Not checked against the published devices: the kubelet does not check reports against
		// ResourceSlices either, and a test may want a report about a device it never saw.
		update := app.DeviceHealthUpdate{PoolName: req.Pool, DeviceName: req.Device, Health: req.Health, Message: req.Message}
		select {
		case d.plugin.HealthControlChan <- update:
			reply(w, http.StatusOK, map[string]any{"queued": true, "health_streams": d.health.streams.Load()})
		case <-time.After(healthSendTimeout):
			reply(w, http.StatusServiceUnavailable, errorBody("the health channel is full and no health stream reads it (is a kubelet watching?)"))
		case <-r.Context().Done():
		}
	})
	mux.HandleFunc("POST /taint", func(w http.ResponseWriter, r *http.Request) {
		var req taintRequest
		if !decode(w, r, &req) || !knownDevice(w, d, req.Device) {
			return
		}
		if req.Key == "" || req.Effect == "" {
			reply(w, http.StatusBadRequest, errorBody("key and effect are required"))
			return
		}
		// The effect is not checked here: the API server validates it, and its refusal shows in
		// /state's errors (publishing is asynchronous).
		taint := resourceapi.DeviceTaint{Key: req.Key, Value: req.Value, Effect: resourceapi.DeviceTaintEffect(req.Effect)}
		if err := d.setTaint(r.Context(), req.Device, taint); err != nil {
			reply(w, http.StatusInternalServerError, errorBody(err.Error()))
			return
		}
		reply(w, http.StatusOK, map[string]any{"taints": d.taintsView()})
	})
	mux.HandleFunc("POST /untaint", func(w http.ResponseWriter, r *http.Request) {
		var req taintRequest
		if !decode(w, r, &req) || !knownDevice(w, d, req.Device) {
			return
		}
		found, err := d.removeTaint(r.Context(), req.Device, req.Key)
		switch {
		case err != nil:
			reply(w, http.StatusInternalServerError, errorBody(err.Error()))
		case !found:
			reply(w, http.StatusNotFound, errorBody("the device has no taint with that key"))
		default:
			reply(w, http.StatusOK, map[string]any{"taints": d.taintsView()})
		}
	})
	mux.HandleFunc("POST /mute", func(w http.ResponseWriter, r *http.Request) {
		d.health.muted.Store(true)
		reply(w, http.StatusOK, map[string]bool{"muted": true})
	})
	mux.HandleFunc("POST /unmute", func(w http.ResponseWriter, r *http.Request) {
		d.health.muted.Store(false)
		reply(w, http.StatusOK, map[string]bool{"muted": false})
	})
	mux.HandleFunc("GET /state", func(w http.ResponseWriter, r *http.Request) {
		prepared := []claimView{}
		for _, claim := range d.plugin.GetPreparedResources() {
			prepared = append(prepared, claimView{Name: claim.Name, UID: string(claim.UID)})
		}
		reply(w, http.StatusOK, map[string]any{
			"driver":           d.opts.driverName,
			"node":             d.opts.nodeName,
			"pool":             d.opts.pool,
			"devices":          d.opts.devices,
			"registered":       d.plugin.IsRegistered(),
			"prepared":         prepared,
			"health_service":   d.opts.health,
			"muted":            d.health.muted.Load(),
			"health_streams":   d.health.streams.Load(),
			"reports_sent":     d.health.sent.Load(),
			"reports_withheld": d.health.withheld.Load(),
			"taints":           d.taintsView(),
			"errors":           d.errorsView(),
		})
	})
	return peerkit.ServeControl(ctx, path, mux)
}

func decode(w http.ResponseWriter, r *http.Request, into any) bool {
	if err := json.NewDecoder(r.Body).Decode(into); err != nil {
		reply(w, http.StatusBadRequest, errorBody(err.Error()))
		return false
	}
	return true
}

func knownDevice(w http.ResponseWriter, d *driver, device string) bool {
	if !d.known(device) {
		reply(w, http.StatusNotFound, errorBody("no such device in the published pool: "+device))
		return false
	}
	return true
}

func errorBody(message string) map[string]string {
	return map[string]string{"error": message}
}

// reply answers with status and body as JSON.
var reply = peerkit.Reply
