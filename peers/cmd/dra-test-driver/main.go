// dra-test-driver runs upstream's DRA test driver (k8s.io/kubernetes/test/e2e/dra/test-driver/app,
// app.StartPlugin on k8s.io/dynamic-resource-allocation/kubeletplugin) as a kubelet plugin for the
// tests, with a control socket of ours: upstream drives its driver from inside the e2e test
// process, and the tests here are another process. See peers/README.md, "dra-test-driver".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/pod-resources-watcher/peers/internal/peerkit"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/test/e2e/dra/test-driver/app"
)

type options struct {
	kubeconfig, nodeName, driverName, kubeletRoot, cdiDir, pool, control string
	devices                                                              []string
	health                                                               bool
}

func main() {
	peerkit.DieWithParent()
	var o options
	var devices string
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig for the API server the ResourceSlices are published to (required)")
	flag.StringVar(&o.nodeName, "node-name", "", "the node the plugin serves; its Node object must exist (required)")
	flag.StringVar(&o.driverName, "driver-name", "", "the DRA driver name, e.g. gpu.test.example.com (required)")
	flag.StringVar(&o.kubeletRoot, "kubelet-root", "", "the kubelet's root directory as this process sees it (required)")
	flag.StringVar(&o.cdiDir, "cdi-dir", "", "where prepared claims' CDI specs are written (default ROOT/cdi)")
	flag.StringVar(&o.pool, "pool", "", "the pool the devices are published in (default the node name)")
	flag.StringVar(&devices, "devices", "dev0", "the devices published, comma-separated")
	flag.BoolVar(&o.health, "health", false, "serve the DRAResourceHealth service (without it the driver serves no health)")
	flag.StringVar(&o.control, "control", "", "the control socket (default ROOT/plugins/DRIVER/control.sock)")
	klog.InitFlags(nil)
	flag.Parse()
	for name, value := range map[string]string{"kubeconfig": o.kubeconfig, "node-name": o.nodeName, "driver-name": o.driverName, "kubelet-root": o.kubeletRoot} {
		if value == "" {
			fmt.Fprintf(os.Stderr, "dra-test-driver: --%s is required\n", name)
			os.Exit(2)
		}
	}
	for _, device := range strings.Split(devices, ",") {
		if device = strings.TrimSpace(device); device != "" {
			o.devices = append(o.devices, device)
		}
	}
	if o.cdiDir == "" {
		o.cdiDir = filepath.Join(o.kubeletRoot, "cdi")
	}
	if o.pool == "" {
		o.pool = o.nodeName // as upstream's own kubelet-plugin command names its pool
	}
	if o.control == "" {
		o.control = filepath.Join(o.kubeletRoot, "plugins", o.driverName, "control.sock")
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "dra-test-driver:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	config, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	// The helper listens in both directories but creates neither: without the data directory
	// its listen fails with "bind: no such file or directory".
	dataDir := filepath.Join(o.kubeletRoot, "plugins", o.driverName)
	registryDir := filepath.Join(o.kubeletRoot, "plugins_registry")
	for _, dir := range []string{dataDir, registryDir, o.cdiDir, filepath.Dir(o.control)} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}

	d := newDriver(o)
	plugin, err := app.StartPlugin(ctx, o.cdiDir, o.driverName, client, o.nodeName,
		app.FileOperations{DriverResources: d.resources(), HandleError: d.handleError},
		app.Options{EnableHealthService: o.health},
		kubeletplugin.PluginDataDirectoryPath(dataDir),
		kubeletplugin.RegistrarDirectoryPath(registryDir),
		// StartPlugin appends its own recording interceptor after this one, and hands its own
		// ExamplePlugin to kubeletplugin.Start, so the health stream is reached here: /mute.
		kubeletplugin.GRPCStreamInterceptor(d.health.intercept),
	)
	if err != nil {
		return err
	}
	d.plugin = plugin

	server, err := serveControl(ctx, o.control, d)
	if err != nil {
		plugin.Stop()
		return err
	}
	// The line the tests wait for: the plugin's sockets and the control socket are listening
	// (StartPlugin returns after both of its listens), so connections to each are accepted.
	fmt.Println("dra-test-driver ready")
	<-ctx.Done()
	_ = server.Close()
	// Upstream's Stop closes both gRPC listeners, which removes their sockets: the kubelet's
	// plugin watcher sees the registration socket go, as with a driver pod that ends.
	plugin.Stop()
	if err := os.Remove(o.control); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
