package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	schedulinginformers "k8s.io/client-go/informers/scheduling/v1beta1"
	"k8s.io/client-go/kubernetes"
	restclient "k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/controller/devicetainteviction"
	"k8s.io/kubernetes/pkg/controller/job"
	"k8s.io/kubernetes/pkg/controller/resourceclaim"
	"k8s.io/kubernetes/pkg/features"
)

// The controller-manager's defaults for these two (RecommendedDefault...Configuration in each
// controller's config/v1alpha1 package), so the queues drain as they do there.
const (
	resourceClaimWorkers = 50
	jobWorkers           = 5
	// DeviceTaintEvictionControllerConfiguration's ConcurrentSyncs default.
	deviceTaintEvictionWorkers = 8
)

// Controller names, as kube-controller-manager's --controllers accepts them (its aliases).
const (
	resourceClaimName       = "resourceclaim"
	jobName                 = "job"
	daemonSetName           = "daemonset"
	garbageCollectorName    = "garbagecollector"
	rootCACertPublisherName = "root-ca-cert-publisher"
	namespaceName           = "namespace"
	deviceTaintEvictionName = "device-taint-eviction-controller"
)

// knownControllers in the order they are built; defaultControllers is what the peer ran before
// --controllers existed (and what the tests sharing one kube-controllers rely on).
var (
	knownControllers   = []string{resourceClaimName, jobName, daemonSetName, garbageCollectorName, rootCACertPublisherName, namespaceName, deviceTaintEvictionName}
	defaultControllers = []string{resourceClaimName, jobName}
)

// parseControllers checks a --controllers value: names from knownControllers, comma-separated.
func parseControllers(value string) ([]string, error) {
	var names []string
	for _, name := range strings.Split(value, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if !slices.Contains(knownControllers, name) {
			return nil, fmt.Errorf("unknown controller %q (known: %s)", name, strings.Join(knownControllers, ", "))
		}
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("--controllers names none")
	}
	return names, nil
}

// kubeControllers are the chosen controllers on one shared informer factory, as the
// controller-manager runs its controllers; each is a function run until ctx ends.
type kubeControllers struct {
	factory informers.SharedInformerFactory
	// Started with the factory (the garbage collector's metadata informers), may be nil.
	extraStart func(ctx context.Context)
	// Closed once every informer factory has started (the garbage collector waits for it).
	informersStarted chan struct{}
	runs             map[string]func(ctx context.Context)
	shutdown         []func()
}

// clientFor is the controller-manager's ClientBuilder in short: one client per controller, told
// apart by its user agent in the API server's logs. All use the one kubeconfig's user, where the
// controller-manager uses a service account per controller.
func clientFor(config *restclient.Config, name string) (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(restclient.AddUserAgent(config, name))
}

func newControllers(ctx context.Context, kubeconfig string, names []string) (*kubeControllers, error) {
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	// The controller-manager's --kube-api-qps and --kube-api-burst defaults; client-go's own
	// (5 and 10) would make a burst of test objects wait on the client's rate limiter.
	config.QPS, config.Burst = 20, 30
	informerClient, err := clientFor(config, "shared-informers")
	if err != nil {
		return nil, err
	}
	// No periodic resync: every change reaches the handlers as an event; the controller-manager's
	// 12 h or more would not show within a test anyway.
	factory := informers.NewSharedInformerFactory(informerClient, 0)
	c := &kubeControllers{factory: factory, informersStarted: make(chan struct{}), runs: map[string]func(context.Context){}}
	for _, name := range names {
		var run func(context.Context)
		switch name {
		case resourceClaimName:
			run, err = newResourceClaim(ctx, config, factory)
		case jobName:
			run, err = newJob(ctx, config, factory)
		case daemonSetName:
			run, err = newDaemonSet(ctx, config, factory)
		case garbageCollectorName:
			run, err = c.newGarbageCollector(ctx, config, factory)
		case rootCACertPublisherName:
			run, err = newRootCACertPublisher(config, factory)
		case namespaceName:
			run, err = newNamespace(ctx, config, factory)
		case deviceTaintEvictionName:
			run, err = newDeviceTaintEviction(config, factory)
		}
		if err != nil {
			return nil, fmt.Errorf("%s controller: %w", name, err)
		}
		c.runs[name] = run
	}
	return c, nil
}

func newResourceClaim(ctx context.Context, config *restclient.Config, factory informers.SharedInformerFactory) (func(context.Context), error) {
	claimClient, err := clientFor(config, "resource-claim-controller")
	if err != nil {
		return nil, err
	}
	// The PodGroup informer is only started when a feature gate that uses it is on (the
	// controller asks the factory for it then), as in the controller-manager.
	resourceClaim, err := resourceclaim.NewController(
		klog.FromContext(ctx),
		claimClient,
		factory.Core().V1().Pods(),
		factory.Scheduling().V1beta1().PodGroups(),
		factory.Resource().V1().ResourceClaims(),
		factory.Resource().V1().ResourceClaimTemplates(),
	)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) { resourceClaim.Run(ctx, resourceClaimWorkers) }, nil
}

func newJob(ctx context.Context, config *restclient.Config, factory informers.SharedInformerFactory) (func(context.Context), error) {
	jobClient, err := clientFor(config, "job-controller")
	if err != nil {
		return nil, err
	}
	// As the controller-manager: the scheduling.k8s.io/v1beta1 informers only with WorkloadWithJob
	// (alpha, off): otherwise that group may not even be served, and they would never sync.
	var workloads schedulinginformers.WorkloadInformer
	var podGroups schedulinginformers.PodGroupInformer
	if utilfeature.DefaultFeatureGate.Enabled(features.WorkloadWithJob) {
		workloads = factory.Scheduling().V1beta1().Workloads()
		podGroups = factory.Scheduling().V1beta1().PodGroups()
	}
	jobController, err := job.NewController(ctx, jobClient, factory.Core().V1().Pods(), factory.Batch().V1().Jobs(), workloads, podGroups)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) { jobController.Run(ctx, jobWorkers) }, nil
}

// newDeviceTaintEviction: resource.go, newDeviceTaintEvictionController. It evicts the pods whose
// allocated devices carry a NoExecute taint (a ResourceSlice's or a DeviceTaintRule's): it writes
// the pod's DisruptionTarget condition, a DeviceTaintManagerEviction Event, then deletes the pod.
// Opt-in (--controllers), so the tests sharing one kube-controllers see no eviction they did not ask for.
func newDeviceTaintEviction(config *restclient.Config, factory informers.SharedInformerFactory) (func(context.Context), error) {
	client, err := clientFor(config, deviceTaintEvictionName)
	if err != nil {
		return nil, err
	}
	controller := devicetainteviction.New(
		client,
		factory.Core().V1().Pods(),
		factory.Resource().V1().ResourceClaims(),
		factory.Resource().V1().ResourceSlices(),
		factory.Resource().V1().DeviceTaintRules(),
		factory.Resource().V1().DeviceClasses(),
		deviceTaintEvictionName,
	)
	return func(ctx context.Context) {
		// As the controller-manager: a start-up failure is logged, and the loop waits for the end.
		if err := controller.Run(ctx, deviceTaintEvictionWorkers); err != nil {
			klog.FromContext(ctx).Error(err, "Device taint processing leading to Pod eviction failed and is now paused")
		}
		<-ctx.Done()
	}, nil
}

// startInformers starts every informer the controllers asked the factories for.
func (c *kubeControllers) startInformers(ctx context.Context) {
	c.factory.Start(ctx.Done())
	if c.extraStart != nil {
		c.extraStart(ctx)
	}
	close(c.informersStarted)
}

// waitForSync returns once every started informer has its initial list, or an error naming those
// that have not when ctx ends.
func (c *kubeControllers) waitForSync(ctx context.Context) error {
	var missing []string
	for informerType, synced := range c.factory.WaitForCacheSync(ctx.Done()) {
		if !synced {
			missing = append(missing, informerType.String())
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("not synced: %v", missing)
	}
	return ctx.Err()
}

// run runs every controller until ctx ends; the channel closes once all have returned.
func (c *kubeControllers) run(ctx context.Context) <-chan struct{} {
	var wg sync.WaitGroup
	for _, run := range c.runs {
		wg.Go(func() { run(ctx) })
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		// The informers' goroutines end with ctx too; Shutdown waits for them, so nothing is
		// still watching once the process exits 0.
		c.factory.Shutdown()
		for _, shutdown := range c.shutdown {
			shutdown()
		}
		close(done)
	}()
	return done
}
