package main

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	resourceapi "k8s.io/api/resource/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/kubernetes/test/e2e/dra/test-driver/app"
)

// driver is what the control socket acts on: upstream's plugin, the devices and taints it
// publishes, and the health stream's mute.
type driver struct {
	opts   options
	plugin *app.ExamplePlugin
	health *healthMute

	mu     sync.Mutex
	taints map[string][]resourceapi.DeviceTaint // device -> its taints, in the order added
	errors []reportedError                      // the last few, for /state
}

// reportedError is one HandleError call: the ResourceSlice controller's publishing failures
// (the API server refusing a taint, say) arrive here asynchronously, after /taint answered.
type reportedError struct {
	Time    time.Time `json:"time"`
	Message string    `json:"message"`
	Error   string    `json:"error"`
}

const keptErrors = 20

func newDriver(o options) *driver {
	return &driver{opts: o, health: &healthMute{}, taints: map[string][]resourceapi.DeviceTaint{}}
}

// resources is the one pool with one slice that the plugin publishes: every device, each with its
// taints. The caller holds d.mu, or nothing else runs yet.
func (d *driver) resources() *resourceslice.DriverResources {
	devices := make([]resourceapi.Device, len(d.opts.devices))
	for i, name := range d.opts.devices {
		devices[i] = resourceapi.Device{Name: name, Taints: slices.Clone(d.taints[name])}
	}
	return &resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{d.opts.pool: {Slices: []resourceslice.Slice{{Devices: devices}}}},
	}
}

func (d *driver) known(device string) bool {
	return slices.Contains(d.opts.devices, device)
}

// setTaint adds the taint to the device, replacing one with the same key (as `kubectl taint`
// does for nodes), and republishes. TimeAdded is left unset: the API server fills it in and
// upstream's ResourceSlice controller keeps the stored one instead of fighting over it.
func (d *driver) setTaint(ctx context.Context, device string, taint resourceapi.DeviceTaint) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	kept := slices.DeleteFunc(slices.Clone(d.taints[device]), func(t resourceapi.DeviceTaint) bool { return t.Key == taint.Key })
	d.taints[device] = append(kept, taint)
	return d.plugin.PublishResources(ctx, *d.resources())
}

// removeTaint drops the device's taint with the key and republishes; false when it had none.
func (d *driver) removeTaint(ctx context.Context, device, key string) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	before := len(d.taints[device])
	d.taints[device] = slices.DeleteFunc(d.taints[device], func(t resourceapi.DeviceTaint) bool { return t.Key == key })
	if len(d.taints[device]) == before {
		return false, nil
	}
	return true, d.plugin.PublishResources(ctx, *d.resources())
}

func (d *driver) taintsView() map[string][]resourceapi.DeviceTaint {
	d.mu.Lock()
	defer d.mu.Unlock()
	view := map[string][]resourceapi.DeviceTaint{}
	for device, taints := range d.taints {
		if len(taints) > 0 {
			view[device] = slices.Clone(taints)
		}
	}
	return view
}

// handleError replaces upstream's default (log it) because /state should show it too; it still
// logs the way upstream does.
func (d *driver) handleError(ctx context.Context, err error, msg string) {
	utilruntime.HandleErrorWithContext(ctx, err, msg)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.errors = append(d.errors, reportedError{Time: time.Now(), Message: msg, Error: err.Error()})
	if len(d.errors) > keptErrors {
		d.errors = d.errors[len(d.errors)-keptErrors:]
	}
}

func (d *driver) errorsView() []reportedError {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]reportedError{}, d.errors...)
}

// healthMute sits on the gRPC server as a stream interceptor and, while muted, withholds the
// health stream's messages from the kubelet: the stream stays open and the plugin registered, but
// no report arrives, which is what the kubelet sees of a driver that stops reporting.
//
// Upstream's ExamplePlugin cannot be wrapped instead: StartPlugin hands its own *ExamplePlugin to
// kubeletplugin.Start, so a type embedding it and overriding WatchHealthStatus would never be
// called. The interceptor option is public and StartPlugin passes it on. Upstream's driver keeps
// building a report every 2 s meanwhile (and applies /health updates to its state), so the first
// report after /unmute (within 2 s) carries the health as it is then.
type healthMute struct {
	muted    atomic.Bool
	streams  atomic.Int64 // health streams open now
	sent     atomic.Int64 // reports that went to the kubelet
	withheld atomic.Int64 // reports dropped while muted
}

func (h *healthMute) intercept(srv any, stream grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	// Both DRAResourceHealth versions (v1 and v1alpha1) have this one streaming method; the
	// registration and DRA services have none, but only the health stream is muted regardless.
	if !strings.HasSuffix(info.FullMethod, "/NodeWatchResources") {
		return handler(srv, stream)
	}
	h.streams.Add(1)
	defer h.streams.Add(-1)
	return handler(srv, &mutedStream{ServerStream: stream, mute: h})
}

type mutedStream struct {
	grpc.ServerStream
	mute *healthMute
}

// SendMsg is where the helper's healthServerBridge sends each report (through the generated
// stream's Send). A withheld report reads as sent to the helper: its own stale-report check then
// stays quiet, as it would for a driver whose reports are lost on the way.
func (s *mutedStream) SendMsg(m any) error {
	if s.mute.muted.Load() {
		s.mute.withheld.Add(1)
		return nil
	}
	err := s.ServerStream.SendMsg(m)
	if err == nil {
		s.mute.sent.Add(1)
	}
	return err
}
