package main

// The controllers a DaemonSet on a container node needs (testkit/container_node.py), each built
// as kube-controller-manager builds it (cmd/kube-controller-manager/app: apps.go, core.go,
// certificates.go) with its default settings.

import (
	"context"
	"fmt"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	cacheddiscovery "k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	restclient "k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/controller-manager/pkg/informerfactory"
	"k8s.io/kubernetes/pkg/controller/certificates/rootcacertpublisher"
	"k8s.io/kubernetes/pkg/controller/daemon"
	"k8s.io/kubernetes/pkg/controller/garbagecollector"
	namespacecontroller "k8s.io/kubernetes/pkg/controller/namespace"

	v1 "k8s.io/api/core/v1"
)

// The controller-manager's defaults (each controller's config/v1alpha1 defaults.go).
const (
	daemonSetWorkers        = 2
	garbageCollectorWorkers = 20
	// core.go: the garbage collector's discovery resync and first-sync wait.
	garbageCollectorSyncPeriod = 30 * time.Second
	// The namespace controller's defaults: ConcurrentNamespaceSyncs, NamespaceSyncPeriod.
	namespaceWorkers    = 10
	namespaceSyncPeriod = 5 * time.Minute
)

// newNamespace: core.go, newNamespaceController. Without it a deleted namespace stays
// Terminating for ever (its content is never deleted): `kubectl delete -k` of the base never ends.
func newNamespace(ctx context.Context, config *restclient.Config, factory informers.SharedInformerFactory) (func(context.Context), error) {
	nsConfig := restclient.CopyConfig(restclient.AddUserAgent(config, "namespace-controller"))
	// core.go: deleting a namespace's content takes many calls.
	nsConfig.QPS *= 20
	nsConfig.Burst *= 100
	client, err := clientFor(nsConfig, "namespace-controller")
	if err != nil {
		return nil, err
	}
	metadataClient, err := metadata.NewForConfig(nsConfig)
	if err != nil {
		return nil, err
	}
	nc := namespacecontroller.NewNamespaceController(
		ctx,
		client,
		metadataClient,
		client.Discovery().ServerPreferredNamespacedResources,
		factory.Core().V1().Namespaces(),
		namespaceSyncPeriod,
		v1.FinalizerKubernetes,
	)
	return func(ctx context.Context) { nc.Run(ctx, namespaceWorkers) }, nil
}

// newDaemonSet: apps.go, newDaemonSetController.
func newDaemonSet(ctx context.Context, config *restclient.Config, factory informers.SharedInformerFactory) (func(context.Context), error) {
	client, err := clientFor(config, "daemon-set-controller")
	if err != nil {
		return nil, err
	}
	dsc, err := daemon.NewDaemonSetsController(
		ctx,
		factory.Apps().V1().DaemonSets(),
		factory.Apps().V1().ControllerRevisions(),
		factory.Core().V1().Pods(),
		factory.Core().V1().Nodes(),
		client,
		flowcontrol.NewBackOff(1*time.Second, 15*time.Minute),
	)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) { dsc.Run(ctx, daemonSetWorkers) }, nil
}

// newGarbageCollector: controllermanager.go (CreateControllerContext: the metadata informers,
// the resettable REST mapper, the dependency graph builder) and core.go
// (newGarbageCollectorController and its Run: the collector and its discovery resync together).
// Without it nothing deletes what a deleted object owns: a DaemonSet's pods, a Job's pods.
func (c *kubeControllers) newGarbageCollector(ctx context.Context, config *restclient.Config, factory informers.SharedInformerFactory) (func(context.Context), error) {
	metadataConfig := restclient.CopyConfig(restclient.AddUserAgent(config, "generic-garbage-collector"))
	// core.go: each deletion takes two calls, so twice the QPS.
	metadataConfig.QPS *= 2
	metadataClient, err := metadata.NewForConfig(metadataConfig)
	if err != nil {
		return nil, err
	}
	trim := func(obj interface{}) (interface{}, error) {
		if accessor, err := meta.Accessor(obj); err == nil && accessor.GetManagedFields() != nil {
			accessor.SetManagedFields(nil)
		}
		return obj, nil
	}
	metadataInformers := metadatainformer.NewSharedInformerFactoryWithOptions(metadataClient, 0, metadatainformer.WithTransform(trim))
	discoveryClient, err := discovery.NewDiscoveryClientForConfig(restclient.AddUserAgent(config, "controller-discovery"))
	if err != nil {
		return nil, err
	}
	restMapper := restmapper.NewDeferredDiscoveryRESTMapper(cacheddiscovery.NewMemCacheClient(discoveryClient))
	graphBuilder := garbagecollector.NewDependencyGraphBuilder(
		ctx,
		metadataClient,
		restMapper,
		garbagecollector.DefaultIgnoredResources(),
		informerfactory.NewInformerFactory(factory, metadataInformers),
		c.informersStarted,
	)
	client, err := clientFor(config, "generic-garbage-collector")
	if err != nil {
		return nil, err
	}
	gc, err := garbagecollector.NewComposedGarbageCollector(ctx, client, metadataClient, restMapper, graphBuilder)
	if err != nil {
		return nil, err
	}
	// Its own discovery client: Sync must not share the mapper's (garbagecollector.go says why).
	gcDiscovery, err := discovery.NewDiscoveryClientForConfig(restclient.AddUserAgent(config, "generic-garbage-collector"))
	if err != nil {
		return nil, err
	}
	c.extraStart = func(ctx context.Context) { metadataInformers.Start(ctx.Done()) }
	c.shutdown = append(c.shutdown, metadataInformers.Shutdown)
	return func(ctx context.Context) {
		done := make(chan struct{}, 3)
		go func() { restMapperResets(ctx, restMapper); done <- struct{}{} }()
		go func() { gc.Run(ctx, garbageCollectorWorkers, garbageCollectorSyncPeriod); done <- struct{}{} }()
		go func() { gc.Sync(ctx, gcDiscovery, garbageCollectorSyncPeriod); done <- struct{}{} }()
		for range 3 {
			<-done
		}
	}, nil
}

// restMapperResets: controllermanager.go resets the mapper every 30 s, so new resources (CRDs)
// are found.
func restMapperResets(ctx context.Context, mapper *restmapper.DeferredDiscoveryRESTMapper) {
	wait.Until(mapper.Reset, 30*time.Second, ctx.Done())
}

// newRootCACertPublisher: certificates.go. It writes the kube-root-ca.crt ConfigMap into every
// namespace: a pod's projected service-account token volume includes it, and such a pod does not
// start without it. The CA is the kubeconfig's, as the controller-manager's without --root-ca-file.
func newRootCACertPublisher(config *restclient.Config, factory informers.SharedInformerFactory) (func(context.Context), error) {
	rootCA := config.CAData
	if len(rootCA) == 0 && config.CAFile != "" {
		data, err := os.ReadFile(config.CAFile)
		if err != nil {
			return nil, err
		}
		rootCA = data
	}
	if len(rootCA) == 0 {
		return nil, fmt.Errorf("the kubeconfig names no certificate authority to publish")
	}
	client, err := clientFor(config, "root-ca-cert-publisher")
	if err != nil {
		return nil, err
	}
	publisher, err := rootcacertpublisher.NewPublisher(factory.Core().V1().ConfigMaps(), factory.Core().V1().Namespaces(), client, rootCA)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) { publisher.Run(ctx, 1) }, nil
}
