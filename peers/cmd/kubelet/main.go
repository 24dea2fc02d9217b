// kubelet runs upstream's whole kubelet (k8s.io/kubernetes/cmd/kubelet/app.Run, with the real
// container manager: device, DRA, CPU, memory and topology managers, the status manager, PLEG,
// the pod-resources and Pods API servers) without a container runtime or a machine to manage:
// the CRI is fake-cri's socket and cAdvisor a fake describing the CPUs and NUMA nodes given by
// flag. It runs in a private mount namespace of its own so the host paths the kubelet hard-codes
// (/var/lib/kubelet/device-plugins, /var/log/containers, six /proc/sys entries) are the test
// directory's, and nothing on the host changes. With --node-namespaces it runs instead in
// namespaces its caller prepared (testkit/container_node.py: a node's mount, network, pid and
// cgroup namespaces, with containerd as the CRI runtime) and serves its HTTP API on --node-ip.
// See peers/README.md, "kubelet".
package main

import (
	"flag"
	"fmt"
	"github.com/pod-resources-watcher/peers/internal/peerkit"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	genericapiserver "k8s.io/apiserver/pkg/server"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/cmd/kubelet/app"
	"k8s.io/kubernetes/cmd/kubelet/app/options"
)

// nsMarker tells the re-executed process it already runs in its own mount namespace.
const nsMarker = "PRW_KUBELET_PRIVATE_MOUNTS"

type settings struct {
	dir        string
	kubeconfig string
	nodeName   string
	nodeIP     string
	criSocket  string
	cpus       int
	numaNodes  int
	memory     uint64
	// The caller entered prepared namespaces (a container node): no re-exec, no mounts of ours,
	// and the kubelet's server on nodeIP.
	nodeNamespaces bool
}

func main() {
	peerkit.DieWithParent()
	var s settings
	flag.StringVar(&s.dir, "dir", "", "the node's directory on the host (required): DIR/var-lib is the kubelet's /var/lib (its root dir is DIR/var-lib/kubelet), DIR/var-log its /var/log")
	flag.StringVar(&s.kubeconfig, "kubeconfig", "", "kubeconfig of a user allowed to act as the node (required)")
	flag.StringVar(&s.nodeName, "node-name", "", "the Node's name (required)")
	flag.StringVar(&s.nodeIP, "node-ip", "127.0.0.1", "the address the Node publishes; nothing is served on it (the kubelet's server is off) unless --node-namespaces")
	flag.StringVar(&s.criSocket, "cri-socket", "", "the CRI runtime's unix socket (fake-cri's, or containerd's with --node-namespaces; required)")
	flag.BoolVar(&s.nodeNamespaces, "node-namespaces", false, "the caller already runs this process in a node's prepared namespaces (nsenter into the mount, network, pid and cgroup namespaces testkit/container_node.py makes, where DIR/var-lib is /var/lib and the sysctls are covered): no unshare re-exec, no mounts of ours; the kubelet's server (port 10250, anonymous, AlwaysAllow) listens on --node-ip so the API server can reach it for logs")
	flag.IntVar(&s.cpus, "cpus", 4, "CPUs the fake cAdvisor reports, spread evenly over the NUMA nodes")
	flag.IntVar(&s.numaNodes, "numa-nodes", 2, "NUMA nodes the fake cAdvisor reports")
	flag.Uint64Var(&s.memory, "memory", 8<<30, "memory bytes the fake cAdvisor reports, spread evenly over the NUMA nodes")
	klog.InitFlags(nil)
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), `Usage: kubelet --dir DIR --kubeconfig FILE --node-name NAME --cri-socket PATH [flags]

Runs upstream's kubelet (v1.37, cmd/kubelet/app.Run with the real container manager) against a
fake CRI and a fake cAdvisor, as root, in a private mount namespace it enters by re-executing
itself under unshare(1): DIR/var-lib is bind-mounted over /var/lib, DIR/var-log over /var/log, and
files holding the values the kubelet wants over the six /proc/sys entries it would otherwise
rewrite. Prints "kubelet ready pid=N" once the pod-resources and Pods API sockets accept.
SIGTERM or SIGINT stops it; a restart is a new process on the same DIR.

With --node-namespaces (a container node, testkit/container_node.py) the caller has already
entered the node's namespaces, where those mounts exist: the binary neither re-executes nor
mounts, --cri-socket is containerd's, and the kubelet's server listens on --node-ip:10250.

`)
		flag.PrintDefaults()
	}
	flag.Parse()
	for name, value := range map[string]string{"dir": s.dir, "kubeconfig": s.kubeconfig, "node-name": s.nodeName, "cri-socket": s.criSocket} {
		if value == "" {
			fmt.Fprintf(os.Stderr, "kubelet: --%s is required\n", name)
			os.Exit(2)
		}
	}
	if os.Getenv(nsMarker) == "" && !s.nodeNamespaces {
		reexecPrivate()
	}
	if err := run(s); err != nil {
		fmt.Fprintln(os.Stderr, "kubelet:", err)
		os.Exit(1)
	}
}

// reexecPrivate replaces this process (same pid, so a caller's SIGKILL reaches the kubelet
// itself) by unshare(1) running this binary again in a new mount namespace whose mounts do not
// propagate back to the host.
func reexecPrivate() {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubelet: unshare(1) from util-linux is needed to run in a private mount namespace:", err)
		os.Exit(1)
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubelet:", err)
		os.Exit(1)
	}
	argv := append([]string{"unshare", "--mount", "--propagation", "private", "--", self}, os.Args[1:]...)
	env := append(os.Environ(), nsMarker+"=1")
	err = syscall.Exec(unshare, argv, env)
	fmt.Fprintln(os.Stderr, "kubelet: exec unshare:", err)
	os.Exit(1)
}

func run(s settings) error {
	dir, err := filepath.Abs(s.dir)
	if err != nil {
		return err
	}
	if !s.nodeNamespaces {
		if err := privateMounts(dir); err != nil {
			return fmt.Errorf("private mounts: %w", err)
		}
	}
	flags := options.NewKubeletFlags()
	flags.KubeConfig = s.kubeconfig
	flags.HostnameOverride = s.nodeName
	flags.NodeIP = s.nodeIP
	config, err := options.NewKubeletConfiguration()
	if err != nil {
		return err
	}
	configure(config, s.criSocket)
	if s.nodeNamespaces {
		serveOn(config, s.nodeIP)
	}
	server := &options.KubeletServer{KubeletFlags: *flags, KubeletConfiguration: *config}

	ctx := genericapiserver.SetupSignalContext()
	deps, err := app.UnsecuredDependencies(ctx, server, utilfeature.DefaultFeatureGate)
	if err != nil {
		return fmt.Errorf("kubelet dependencies: %w", err)
	}
	deps.CAdvisorInterface = &machine{nodeName: s.nodeName, cpus: s.cpus, numaNodes: s.numaNodes, memory: s.memory}
	// ContainerManager stays nil: app.run then builds the real one (cm.NewContainerManager).

	failed := make(chan error, 1)
	go func() { failed <- app.Run(ctx, server, deps, utilfeature.DefaultFeatureGate) }()
	root := flags.RootDirectory
	ready := make(chan error, 1)
	go func() {
		// The kubelet starts its servers well after its API client: up to two minutes on a busy machine.
		for _, socket := range []string{filepath.Join(root, "pod-resources", "kubelet.sock"), filepath.Join(root, "pods-api", "pods-api.sock")} {
			if err := peerkit.AwaitSocket(ctx, socket, 2*time.Minute); err != nil {
				ready <- err
				return
			}
		}
		ready <- nil
	}()
	select {
	case err := <-failed:
		return err
	case err := <-ready:
		if err != nil {
			return err
		}
	}
	// The line the tests wait for.
	fmt.Printf("kubelet ready pid=%d\n", os.Getpid())
	select {
	case err := <-failed:
		return err
	case <-ctx.Done():
		// The kubelet's goroutines do not all stop on cancellation; like a stopped kubelet,
		// leave its sockets and state files behind for the next start.
		time.Sleep(200 * time.Millisecond)
		return nil
	}
}

// privateMounts points the kubelet's hard-coded host paths at DIR inside this (private) mount
// namespace.
func privateMounts(dir string) error {
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	for source, target := range map[string]string{filepath.Join(dir, "var-lib"): "/var/lib", filepath.Join(dir, "var-log"): "/var/log"} {
		if err := os.MkdirAll(source, 0o755); err != nil {
			return err
		}
		if err := syscall.Mount(source, target, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s over %s: %w", source, target, err)
		}
	}
	// The kubelet's container manager rewrites these sysctls when they differ from the values it
	// wants (cm.setupKernelTunables); files holding exactly those values keep the host's as they are.
	sysctls := filepath.Join(dir, "sysctl")
	if err := os.MkdirAll(sysctls, 0o755); err != nil {
		return err
	}
	for name, value := range kernelTunables() {
		file := filepath.Join(sysctls, strings.ReplaceAll(name, "/", "."))
		if err := os.WriteFile(file, []byte(strconv.Itoa(value)+"\n"), 0o644); err != nil {
			return err
		}
		if err := syscall.Mount(file, filepath.Join("/proc/sys", name), "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind over /proc/sys/%s: %w", name, err)
		}
	}
	return nil
}
