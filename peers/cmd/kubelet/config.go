package main

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilsysctl "k8s.io/component-helpers/node/util/sysctl"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/apis/config"
)

// configure changes the kubelet's v1beta1 defaults only where a node without a container
// runtime, cgroup hierarchy of its own or network server needs it; everything else (the
// managers' policies among it: none, None, none) is what a stock kubelet runs with.
func configure(c *kubeletconfig.KubeletConfiguration, criSocket string) {
	c.ContainerRuntimeEndpoint = "unix://" + criSocket
	// The kubelet refuses cgroup v1 hosts by default (validation_linux.go); CI machines are v1.
	c.FailCgroupV1 = false
	c.FailSwapOn = false
	// Nothing is written into cgroups: no QoS hierarchy, no node-allocatable enforcement.
	c.CgroupsPerQOS = false
	c.EnforceNodeAllocatable = []string{"none"}
	c.CgroupDriver = "cgroupfs"
	c.MakeIPTablesUtilChains = false
	// No kubelet HTTP server: nothing listens on the node's address. Port must still be valid.
	c.EnableServer = false
	c.Port = 10250
	c.ReadOnlyPort = 0
	c.HealthzPort = 0
	c.Authentication.Anonymous.Enabled = true
	c.Authentication.Webhook.Enabled = false
	c.Authorization.Mode = kubeletconfig.KubeletAuthorizationModeAlwaysAllow
	// Under the private /var/lib, not the host's /usr/libexec.
	c.VolumePluginDir = "/var/lib/kubelet/volume-plugins"
	// The fake cAdvisor reports no filesystems: no image GC, no disk-pressure eviction.
	c.ImageGCHighThresholdPercent = 100
	c.EvictionHard = map[string]string{}
	// A kubelet lowers its own oom_score_adj to -999 (nothing else would be killed first on a
	// node); a test peer on a shared machine must not make itself the last to go.
	c.OOMScoreAdj = 0
	// Statuses reach the API server within seconds, as the tests wait for them.
	c.NodeStatusUpdateFrequency = metav1.Duration{Duration: 2 * time.Second}
}

// serveOn turns the kubelet's HTTP server on, on the node's own address (a container node's
// veth, inside its network namespace): the API server proxies `kubectl logs` and `exec` there.
// Anonymous and AlwaysAllow as configure sets them: only the API server and the tests reach
// that address. The serving certificate is the kubelet's own self-signed one (under its root
// dir), which the API server does not verify without --kubelet-certificate-authority.
func serveOn(c *kubeletconfig.KubeletConfiguration, nodeIP string) {
	c.EnableServer = true
	c.Address = nodeIP
	c.Port = 10250
}

// kernelTunables are the sysctls (under /proc/sys) the container manager sets, with the values
// it wants: upstream's own constants.
func kernelTunables() map[string]int {
	return map[string]int{
		utilsysctl.VMOvercommitMemory: utilsysctl.VMOvercommitMemoryAlways,
		utilsysctl.VMPanicOnOOM:       utilsysctl.VMPanicOnOOMInvokeOOMKiller,
		utilsysctl.KernelPanic:        utilsysctl.KernelPanicRebootTimeout,
		utilsysctl.KernelPanicOnOops:  utilsysctl.KernelPanicOnOopsAlways,
		utilsysctl.RootMaxKeys:        utilsysctl.RootMaxKeysSetting,
		utilsysctl.RootMaxBytes:       utilsysctl.RootMaxBytesSetting,
	}
}
