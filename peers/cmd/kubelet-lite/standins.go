package main

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	kubepod "k8s.io/kubernetes/pkg/kubelet/pod"
)

// The pod-resources providers kubelet-lite has no upstream manager for. The kubelet's CPU,
// memory and DRA managers need cgroups, a container runtime and a resource.k8s.io API server;
// these stand-ins report the node's CPUs as allocatable and nothing exclusive, no memory, no claims.

type cpusStandIn struct{ allocatable []int64 }

func (c cpusStandIn) GetCPUs(*v1.Pod, *v1.Container) []int64 { return nil }
func (c cpusStandIn) GetPodCPUs(string) []int64              { return nil }
func (c cpusStandIn) GetAllocatableCPUs() []int64            { return c.allocatable }

type memoryStandIn struct{}

func (memoryStandIn) GetMemory(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesapi.ContainerMemory {
	return nil
}
func (memoryStandIn) GetPodMemory(klog.Logger, string) []*podresourcesapi.ContainerMemory { return nil }
func (memoryStandIn) GetAllocatableMemory(klog.Logger) []*podresourcesapi.ContainerMemory { return nil }

type draStandIn struct{}

func (draStandIn) GetDynamicResources(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesapi.DynamicResource {
	return nil
}

// podsProvider is the kubelet's pod-resources PodsProvider over upstream's basic pod manager:
// every admitted pod is active (kubelet-lite runs no containers, so none terminates on its own).
type podsProvider struct{ manager kubepod.Manager }

func (p podsProvider) GetActivePods() []*v1.Pod { return p.manager.GetPods() }
func (p podsProvider) GetPods() []*v1.Pod       { return p.manager.GetPods() }
func (p podsProvider) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	return p.manager.GetPodByName(namespace, name)
}

// runningStatus is the Pods API's status provider (the kubelet's status manager): an admitted
// pod is Running, since kubelet-lite admits pods but starts no containers.
type runningStatus struct{ manager kubepod.Manager }

func (s runningStatus) GetPodStatus(uid types.UID) (v1.PodStatus, bool) {
	if _, ok := s.manager.GetPodByUID(uid); !ok {
		return v1.PodStatus{}, false
	}
	return v1.PodStatus{Phase: v1.PodRunning}, true
}
