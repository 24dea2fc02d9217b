package main

import (
	_ "unsafe" // for go:linkname

	cadvisorapi "github.com/google/cadvisor/lib/model"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
)

// newDeviceManager is upstream's unexported devicemanager.newManagerImpl: the constructor that
// takes the registration socket's path (the exported NewManagerImpl fixes it to
// /var/lib/kubelet/device-plugins/kubelet.sock, and upstream's own tests call this one). A
// go:linkname pull reaches it with no change to upstream's source; `go build -overlay` would need
// a generated overlay file and its JSON at every build, so `make peers` would no longer be a plain
// `go build`. The signature must match upstream's exactly: a mismatch links but misbehaves, so
// it is pinned with the module's one upstream release (see peers/README.md).
//
//go:linkname newDeviceManager k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.newManagerImpl
func newDeviceManager(logger klog.Logger, socketPath string, topology []cadvisorapi.Node, store topologymanager.Store) (*devicemanager.ManagerImpl, error)

// numaTopology is a machine with `nodes` NUMA nodes, all the device manager reads of cadvisor's
// machine info (the node ids).
func numaTopology(nodes int) []cadvisorapi.Node {
	topology := make([]cadvisorapi.Node, nodes)
	for i := range topology {
		topology[i] = cadvisorapi.Node{Id: i}
	}
	return topology
}

// devicesProvider is the pod-resources DevicesProvider over the device manager: what the
// kubelet's container manager is, converting the manager's per-resource device instances into
// one ContainerDevices entry per device and NUMA node.
type devicesProvider struct {
	manager *devicemanager.ManagerImpl
}

func (d devicesProvider) UpdateAllocatedDevices(logger klog.Logger) {
	d.manager.UpdateAllocatedDevices(logger)
}

func (d devicesProvider) GetDevices(podUID, containerName string) []*podresourcesapi.ContainerDevices {
	return toContainerDevices(d.manager.GetDevices(podUID, containerName))
}

func (d devicesProvider) GetAllocatableDevices(logger klog.Logger) []*podresourcesapi.ContainerDevices {
	return toContainerDevices(d.manager.GetAllocatableDevices(logger))
}

func toContainerDevices(instances devicemanager.ResourceDeviceInstances) []*podresourcesapi.ContainerDevices {
	var out []*podresourcesapi.ContainerDevices
	for resource, devices := range instances {
		for id, device := range devices {
			nodes := device.GetTopology().GetNodes()
			if len(nodes) == 0 {
				// A plugin need not report topology; the kubelet lists such a device without it.
				out = append(out, &podresourcesapi.ContainerDevices{ResourceName: resource, DeviceIds: []string{id}})
				continue
			}
			for _, node := range nodes {
				out = append(out, &podresourcesapi.ContainerDevices{
					ResourceName: resource,
					DeviceIds:    []string{id},
					Topology:     &podresourcesapi.TopologyInfo{Nodes: []*podresourcesapi.NUMANode{{ID: node.GetID()}}},
				})
			}
		}
	}
	return out
}
