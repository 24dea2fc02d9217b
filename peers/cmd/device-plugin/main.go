// device-plugin is a device plugin for the tests, on the v1beta1 device plugin API: it registers
// one resource with the kubelet, serves ListAndWatch, Allocate and GetPreferredAllocation, takes
// commands on stdin (device health, hot-plug, unplug) and registers again whenever the kubelet
// restarts. See peers/README.md, "device-plugin".
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"github.com/pod-resources-watcher/peers/internal/peerkit"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func main() {
	peerkit.DieWithParent()
	socketDir := flag.String("socket-dir", "", "the kubelet's device-plugins directory")
	resource := flag.String("resource", "example.com/gpu", "the extended resource served")
	devicesFlag := flag.String("devices", "", "devices: id[:numa[+numa]],... e.g. gpu0:0,gpu1:1")
	name := flag.String("name", "", "the plugin's socket file name (default: from the resource)")
	flag.Parse()
	if *socketDir == "" {
		fmt.Fprintln(os.Stderr, "device-plugin: --socket-dir is required")
		os.Exit(2)
	}
	devices, err := parseDevices(*devicesFlag)
	if err != nil {
		fmt.Fprintln(os.Stderr, "device-plugin:", err)
		os.Exit(2)
	}
	if *name == "" {
		*name = strings.NewReplacer("/", "_", ".", "_").Replace(*resource) + ".sock"
	}
	if err := run(*socketDir, *resource, *name, devices); err != nil {
		fmt.Fprintln(os.Stderr, "device-plugin:", err)
		os.Exit(1)
	}
}

// out is stdout, one JSON object a line: registrations and answers to commands.
var out = struct {
	sync.Mutex
	enc *json.Encoder
}{enc: json.NewEncoder(os.Stdout)}

func say(v map[string]any) {
	out.Lock()
	defer out.Unlock()
	_ = out.enc.Encode(v)
}

func run(socketDir, resource, name string, devices []*pluginapi.Device) error {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	if err := os.MkdirAll(socketDir, 0o750); err != nil {
		return err
	}
	p := &plugin{resource: resource, inv: newInventory(devices), stop: make(chan struct{})}
	path := filepath.Join(socketDir, name)
	// pluginapi.KubeletSocket is the full default path; the kubelet's socket is its base name here.
	kubeletSocket := filepath.Join(socketDir, filepath.Base(pluginapi.KubeletSocket))

	// Watch before the first registration, so a kubelet that starts in between is not missed.
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer watcher.Close()
	if err := watcher.Add(socketDir); err != nil {
		return err
	}

	var server *grpc.Server
	registrations := 0
	// serveAndRegister (re)creates the plugin's socket and registers it: at start, and each time
	// the kubelet's registration socket is created anew (a kubelet restart deletes plugin sockets).
	serveAndRegister := func() {
		if server != nil {
			server.Stop()
		}
		server, err = listen(path, p)
		if err != nil {
			say(map[string]any{"event": "error", "error": err.Error()})
			return
		}
		for attempt := 0; attempt < 50; attempt++ {
			rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
			err = register(rctx, kubeletSocket, name, resource)
			rcancel()
			if err == nil {
				registrations++
				say(map[string]any{"event": "registered", "count": registrations, "resource": resource})
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
		say(map[string]any{"event": "error", "error": "register: " + err.Error()})
	}
	if _, statErr := os.Stat(kubeletSocket); statErr == nil {
		serveAndRegister()
	} else {
		say(map[string]any{"event": "waiting", "for": kubeletSocket})
	}

	commands := make(chan command)
	go readCommands(commands)
	for {
		select {
		case <-ctx.Done():
			return shutdown(server, p, path)
		case ev := <-watcher.Events:
			if ev.Name == kubeletSocket && ev.Op&fsnotify.Create != 0 {
				serveAndRegister()
			}
		case err := <-watcher.Errors:
			say(map[string]any{"event": "error", "error": err.Error()})
		case c, ok := <-commands:
			if !ok { // stdin closed: whoever controlled the plugin is gone
				return shutdown(server, p, path)
			}
			if c.Op == "leave" {
				// The socket goes first and the streams end LingerMS later (a plugin that unlinks
				// before it stops serving): the kubelet drops the devices only when they end.
				if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
					return err
				}
				say(map[string]any{"op": c.Op, "ok": true})
				time.Sleep(time.Duration(c.LingerMS) * time.Millisecond)
				return shutdown(server, p, path)
			}
			answer := map[string]any{"op": c.Op, "id": c.ID, "ok": true}
			if err := c.apply(p.inv); err != nil {
				answer["ok"], answer["error"] = false, err.Error()
			}
			say(answer)
		}
	}
}

func shutdown(server *grpc.Server, p *plugin, path string) error {
	close(p.stop)
	if server != nil {
		server.Stop()
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// command is one line of stdin:
//
//	{"op": "health", "id": "gpu0", "healthy": false}
//	{"op": "add", "id": "gpu9", "numa": [1]}
//	{"op": "remove", "id": "gpu0"}
//	{"op": "leave", "linger_ms": 300}   (socket removed, the process ends 300 ms later)
type command struct {
	Op       string  `json:"op"`
	ID       string  `json:"id"`
	Healthy  bool    `json:"healthy"`
	NUMA     []int64 `json:"numa"`
	LingerMS int     `json:"linger_ms"`
	bad      error
}

func (c command) apply(inv *inventory) error {
	if c.bad != nil {
		return c.bad
	}
	switch c.Op {
	case "health":
		return inv.setHealth(c.ID, c.Healthy)
	case "add":
		return inv.add(newDevice(c.ID, c.NUMA))
	case "remove":
		return inv.remove(c.ID)
	}
	return fmt.Errorf("unknown op %q", c.Op)
}

func readCommands(commands chan<- command) {
	defer close(commands)
	scanner := bufio.NewScanner(os.Stdin)
	for scanner.Scan() {
		line := strings.TrimSpace(scanner.Text())
		if line == "" {
			continue
		}
		var c command
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			c.bad = err
		}
		commands <- c
	}
}
