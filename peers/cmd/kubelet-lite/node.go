package main

import (
	"context"
	"fmt"
	"sort"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/apis/pods"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	kubepod "k8s.io/kubernetes/pkg/kubelet/pod"
)

// node is kubelet-lite's pod lifecycle: admission through the topology manager (which calls the
// device manager's Allocate for each container, as the kubelet's resource admit handler does),
// removal that frees devices, and the pods file that outlives the process.
type node struct {
	mu       sync.Mutex
	logger   klog.Logger
	pods     kubepod.Manager
	specs    map[string]podSpec // by "namespace/name"
	file     podsFile
	topology topologymanager.Manager
	devices  *devicemanager.ManagerImpl
	podsAPI  *pods.PodsServer // nil when the PodsAPI gate is off
}

// restore makes the remembered pods active again. They are not admitted anew: their devices
// come back from the device manager's checkpoint (a kubelet re-admits them, and the device
// manager then finds the checkpointed devices and allocates nothing new).
func (n *node) restore(specs []podSpec) {
	for _, spec := range specs {
		n.specs[key(spec.Namespace, spec.Name)] = spec
		n.pods.AddPod(spec.toPod())
	}
}

type admitError struct{ reason, message string }

func (e *admitError) Error() string { return e.reason + ": " + e.message }

func (n *node) admit(ctx context.Context, spec podSpec) (*v1.Pod, error) {
	if err := spec.validate(); err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.specs[key(spec.Namespace, spec.Name)]; ok {
		return nil, fmt.Errorf("pod %s/%s is already admitted", spec.Namespace, spec.Name)
	}
	pod := spec.toPod()
	// The kubelet adds a pod to its pod manager before admitting it, so the pod is among the
	// active pods while the device manager allocates (it frees devices of inactive pods first).
	n.pods.AddPod(pod)
	result := n.topology.Admit(ctx, &lifecycle.PodAdmitAttributes{
		Pod: pod, OtherPods: n.pods.GetPods(), Operation: lifecycle.AddOperation,
	})
	if !result.Admit {
		n.pods.RemovePod(pod)
		n.devices.UpdateAllocatedDevices(n.logger)
		return nil, &admitError{reason: result.Reason, message: result.Message}
	}
	n.specs[key(spec.Namespace, spec.Name)] = spec
	if err := n.file.save(n.sortedSpecs()); err != nil {
		return nil, err
	}
	if n.podsAPI != nil {
		n.podsAPI.OnPodUpdated(n.logger, pod, v1.PodStatus{Phase: v1.PodRunning}, true)
	}
	return pod, nil
}

func (n *node) remove(namespace, name string) (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	pod, ok := n.pods.GetPodByName(namespace, name)
	if !ok {
		return false, nil
	}
	n.pods.RemovePod(pod)
	delete(n.specs, key(namespace, name))
	// The kubelet frees a terminated pod's devices lazily; here the pod is gone at once.
	n.devices.UpdateAllocatedDevices(n.logger)
	if n.podsAPI != nil {
		n.podsAPI.OnPodRemoved(n.logger, pod)
	}
	return true, n.file.save(n.sortedSpecs())
}

// podView is a pod with the devices the device manager holds for each container.
type podView struct {
	podSpec
	Devices map[string]map[string][]string `json:"devices"` // container -> resource -> ids
}

func (n *node) list() []podView {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []podView
	for _, spec := range n.sortedSpecs() {
		view := podView{podSpec: spec, Devices: map[string]map[string][]string{}}
		for _, c := range spec.Containers {
			held := map[string][]string{}
			for resource, devices := range n.devices.GetDevices(spec.UID, c.Name) {
				for id := range devices {
					held[resource] = append(held[resource], id)
				}
				sort.Strings(held[resource])
			}
			view.Devices[c.Name] = held
		}
		out = append(out, view)
	}
	return out
}

func (n *node) sortedSpecs() []podSpec {
	out := make([]podSpec, 0, len(n.specs))
	for _, spec := range n.specs {
		out = append(out, spec)
	}
	sort.Slice(out, func(i, j int) bool {
		return key(out[i].Namespace, out[i].Name) < key(out[j].Namespace, out[j].Name)
	})
	return out
}

func key(namespace, name string) string { return namespace + "/" + name }
