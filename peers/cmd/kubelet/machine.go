package main

import (
	cadvisorapi "github.com/google/cadvisor/lib/model"
	"k8s.io/klog/v2"
	cadvisortesting "k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"
)

// machine is upstream's fake cAdvisor with a machine of our choosing: the CPU and memory managers
// and the topology manager read the CPUs, cores and NUMA nodes from MachineInfo, and the node's
// capacity comes from it.
type machine struct {
	cadvisortesting.Fake
	nodeName  string
	cpus      int
	numaNodes int
	memory    uint64
}

func (m *machine) MachineInfo(klog.Logger) (*cadvisorapi.MachineInfo, error) {
	numa := max(m.numaNodes, 1)
	perNode := max(m.cpus/numa, 1)
	nodes := make([]cadvisorapi.Node, numa)
	cpu := 0
	for i := range nodes {
		nodes[i] = cadvisorapi.Node{Id: i, Memory: m.memory / uint64(numa)}
		for j := 0; j < perNode; j++ {
			// One thread per core, each core on the socket of its NUMA node.
			nodes[i].Cores = append(nodes[i].Cores, cadvisorapi.Core{Id: cpu, Threads: []int{cpu}, SocketID: i})
			cpu++
		}
	}
	return &cadvisorapi.MachineInfo{
		NumCores:         cpu,
		NumPhysicalCores: cpu,
		NumSockets:       numa,
		MemoryCapacity:   m.memory,
		InstanceID:       cadvisorapi.InstanceID(m.nodeName),
		MachineID:        m.nodeName,
		SystemUUID:       m.nodeName,
		BootID:           "boot-" + m.nodeName,
		Topology:         nodes,
	}, nil
}
