package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// inventory is the plugin's devices in the order they were added, and the ListAndWatch streams
// waiting to hear of a change.
type inventory struct {
	mu      sync.Mutex
	order   []string
	devices map[string]*pluginapi.Device
	waiters map[chan struct{}]struct{}
}

func newInventory(devices []*pluginapi.Device) *inventory {
	inv := &inventory{devices: map[string]*pluginapi.Device{}, waiters: map[chan struct{}]struct{}{}}
	for _, d := range devices {
		inv.order = append(inv.order, d.ID)
		inv.devices[d.ID] = d
	}
	return inv
}

// snapshot is the current list and a channel closed at the next change.
func (inv *inventory) snapshot() ([]*pluginapi.Device, chan struct{}) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	out := make([]*pluginapi.Device, 0, len(inv.order))
	for _, id := range inv.order {
		out = append(out, proto.Clone(inv.devices[id]).(*pluginapi.Device))
	}
	changed := make(chan struct{})
	inv.waiters[changed] = struct{}{}
	return out, changed
}

func (inv *inventory) forget(changed chan struct{}) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	delete(inv.waiters, changed)
}

func (inv *inventory) changedLocked() {
	for w := range inv.waiters {
		close(w)
		delete(inv.waiters, w)
	}
}

func (inv *inventory) setHealth(id string, healthy bool) error {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	d, ok := inv.devices[id]
	if !ok {
		return fmt.Errorf("no device %q", id)
	}
	d.Health = pluginapi.Unhealthy
	if healthy {
		d.Health = pluginapi.Healthy
	}
	inv.changedLocked()
	return nil
}

func (inv *inventory) add(d *pluginapi.Device) error {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if _, ok := inv.devices[d.ID]; ok {
		return fmt.Errorf("device %q exists", d.ID)
	}
	inv.order = append(inv.order, d.ID)
	inv.devices[d.ID] = d
	inv.changedLocked()
	return nil
}

func (inv *inventory) remove(id string) error {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if _, ok := inv.devices[id]; !ok {
		return fmt.Errorf("no device %q", id)
	}
	delete(inv.devices, id)
	for i, known := range inv.order {
		if known == id {
			inv.order = append(inv.order[:i], inv.order[i+1:]...)
			break
		}
	}
	inv.changedLocked()
	return nil
}

func (inv *inventory) has(id string) bool {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	_, ok := inv.devices[id]
	return ok
}

// numaOf is a device's first NUMA node, or -1 without topology: the preferred allocation
// keeps a container's devices on as few nodes as it can.
func (inv *inventory) numaOf(id string) int64 {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	d, ok := inv.devices[id]
	if !ok || len(d.GetTopology().GetNodes()) == 0 {
		return -1
	}
	return d.Topology.Nodes[0].ID
}

// preferred picks `size` of `available`: those it must include, then the rest grouped by NUMA
// node (the node with most candidates first), then by id.
func (inv *inventory) preferred(available, mustInclude []string, size int) []string {
	chosen := append([]string(nil), mustInclude...)
	taken := map[string]bool{}
	for _, id := range mustInclude {
		taken[id] = true
	}
	perNode := map[int64]int{}
	for _, id := range available {
		perNode[inv.numaOf(id)]++
	}
	rest := make([]string, 0, len(available))
	for _, id := range available {
		if !taken[id] {
			rest = append(rest, id)
		}
	}
	sort.Slice(rest, func(i, j int) bool {
		a, b := inv.numaOf(rest[i]), inv.numaOf(rest[j])
		if perNode[a] != perNode[b] {
			return perNode[a] > perNode[b]
		}
		if a != b {
			return a < b
		}
		return rest[i] < rest[j]
	})
	for _, id := range rest {
		if len(chosen) >= size {
			break
		}
		chosen = append(chosen, id)
	}
	return chosen
}

// parseDevices reads "id[:numa[+numa...]],..." (e.g. gpu0:0,gpu1:1,gpu2).
func parseDevices(spec string) ([]*pluginapi.Device, error) {
	var out []*pluginapi.Device
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		id, nodes, _ := strings.Cut(item, ":")
		var numa []int64
		if nodes != "" {
			for _, n := range strings.Split(nodes, "+") {
				v, err := strconv.ParseInt(n, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("device %q: NUMA node %q: %w", id, n, err)
				}
				numa = append(numa, v)
			}
		}
		out = append(out, newDevice(id, numa))
	}
	return out, nil
}

func newDevice(id string, numa []int64) *pluginapi.Device {
	d := &pluginapi.Device{ID: id, Health: pluginapi.Healthy}
	if len(numa) > 0 {
		d.Topology = &pluginapi.TopologyInfo{}
		for _, n := range numa {
			d.Topology.Nodes = append(d.Topology.Nodes, &pluginapi.NUMANode{ID: n})
		}
	}
	return d
}
