// kubelet-lite runs the kubelet's node-local servers from upstream code, without a container
// runtime: the device manager (device plugin registration, checkpoint, ListAndWatch, Allocate),
// the pod-resources v1 and v1alpha1 servers, and the Pods API, over pods admitted through a
// control socket. See peers/README.md, "kubelet-lite".
package main

import (
	"context"
	"flag"
	"fmt"
	"github.com/pod-resources-watcher/peers/internal/peerkit"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/featuregate"
	"k8s.io/klog/v2"
	kubefeatures "k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/kubernetes/pkg/kubelet/apis/pods"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
	kubepod "k8s.io/kubernetes/pkg/kubelet/pod"
	"k8s.io/kubernetes/pkg/kubelet/server"
	"k8s.io/kubernetes/pkg/kubelet/util"
)

func main() {
	peerkit.DieWithParent()
	rootDir := flag.String("root-dir", "", "the kubelet's root directory (stands for /var/lib/kubelet)")
	numaNodes := flag.Int("numa-nodes", 2, "NUMA nodes of the machine the device manager sees")
	cpus := flag.Int("cpus", 4, "CPUs reported allocatable (ids 0..N-1)")
	control := flag.String("control", "", "the control socket (default ROOT/kubelet-lite.sock)")
	klog.InitFlags(nil)
	flag.Parse()
	if *rootDir == "" {
		fmt.Fprintln(os.Stderr, "kubelet-lite: --root-dir is required")
		os.Exit(2)
	}
	if *control == "" {
		*control = filepath.Join(*rootDir, "kubelet-lite.sock")
	}
	if err := run(*rootDir, *numaNodes, *cpus, *control); err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-lite:", err)
		os.Exit(1)
	}
}

func run(rootDir string, numaNodes, cpus int, control string) error {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	logger := klog.FromContext(ctx)
	if err := os.MkdirAll(rootDir, 0o750); err != nil {
		return err
	}
	// No gate is set: a 1.37 kubelet's defaults are these (Get and DRA reporting GA and locked
	// on, the Pods API beta and on), logged so a run shows what it served.
	for _, gate := range []featuregate.Feature{kubefeatures.KubeletPodResourcesGet, kubefeatures.KubeletPodResourcesDynamicResources, kubefeatures.KubeletPodResourcesListUseActivePods, kubefeatures.PodsAPI} {
		logger.Info("Feature gate", "name", gate, "enabled", utilfeature.DefaultFeatureGate.Enabled(gate))
	}

	topology := numaTopology(numaNodes)
	// The none policy, as a kubelet without --topology-manager-policy runs: its scope's Admit
	// calls each hint provider's Allocate per container, and it is the device manager's
	// topology-affinity store.
	topo, err := topologymanager.NewManager(logger, topology, topologymanager.PolicyNone, topologymanager.ContainerTopologyScope, nil)
	if err != nil {
		return err
	}
	devices, err := newDeviceManager(logger, filepath.Join(rootDir, "device-plugins", "kubelet.sock"), topology, topo)
	if err != nil {
		return err
	}
	topo.AddHintProvider(logger, devices)

	podManager := kubepod.NewBasicPodManager()
	n := &node{
		logger: logger, pods: podManager, specs: map[string]podSpec{},
		file: podsFile{path: filepath.Join(rootDir, "kubelet-lite-pods.json")}, topology: topo, devices: devices,
	}
	remembered, err := n.file.load()
	if err != nil {
		return err
	}
	n.restore(remembered)

	// Every source is ready at once: kubelet-lite has one pod source, its pods file, read above.
	ready := config.NewSourcesReady(func(sets.Set[string]) bool { return true })
	activePods := devicemanager.ActivePodsFunc(podManager.GetPods)
	if err := devices.Start(logger, activePods, ready, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		return err
	}

	providers := podresources.PodResourcesProviders{
		Pods:             podsProvider{manager: podManager},
		Devices:          devicesProvider{manager: devices},
		Cpus:             cpusStandIn{allocatable: cpuIDs(cpus)},
		Memory:           memoryStandIn{},
		DynamicResources: draStandIn{},
	}
	podResources, err := util.LocalEndpoint(filepath.Join(rootDir, "pod-resources"), podresources.Socket)
	if err != nil {
		return err
	}
	go server.ListenAndServePodResources(ctx, podResources, providers)
	waiting := []string{podResources}

	if utilfeature.DefaultFeatureGate.Enabled(kubefeatures.PodsAPI) {
		n.podsAPI = pods.NewPodsServer(pods.NewBroadcaster(ctx), podManager, runningStatus{manager: podManager}, ready)
		podsEndpoint, err := util.LocalEndpoint(filepath.Join(rootDir, "pods-api"), pods.Socket)
		if err != nil {
			return err
		}
		go server.ListenAndServePodsServer(ctx, podsEndpoint, n.podsAPI)
		waiting = append(waiting, podsEndpoint)
	}
	if _, err := serveControl(ctx, control, n); err != nil {
		return err
	}
	for _, endpoint := range waiting {
		if err := peerkit.AwaitSocket(ctx, strings.TrimPrefix(endpoint, "unix:"), 10*time.Second); err != nil {
			if ctx.Err() != nil {
				return nil // stopped while starting
			}
			return err
		}
	}
	// The line the tests wait for: every socket is accepting connections.
	fmt.Printf("kubelet-lite ready pods=%d\n", len(remembered))
	<-ctx.Done()
	// Like a kubelet that is stopped, leave the sockets behind: the next start replaces them.
	return nil
}

func cpuIDs(n int) []int64 {
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = int64(i)
	}
	return ids
}
