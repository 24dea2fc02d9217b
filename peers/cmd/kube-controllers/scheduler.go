package main

import (
	"context"
	"fmt"

	"k8s.io/client-go/tools/cache"
	basecompatibility "k8s.io/component-base/compatibility"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	schedulerconfig "k8s.io/kubernetes/cmd/kube-scheduler/app/config"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	"k8s.io/kubernetes/pkg/scheduler"
)

// kubeScheduler is upstream's kube-scheduler as its binary builds it (app.Setup, then app.Run),
// kept apart so that readiness can be awaited on the scheduler itself: the command
// (app.NewSchedulerCommand) hides it, and its /readyz needs a serving port.
type kubeScheduler struct {
	config *schedulerconfig.CompletedConfig
	sched  *scheduler.Scheduler
}

// newScheduler sets the scheduler's own flags, on its own flag sets, as a command line would:
// the kubeconfig (the deprecated --kubeconfig, which the binary still honours without --config),
// no leader election (one scheduler, and no Lease to wait for) and no serving port.
func newScheduler(ctx context.Context, kubeconfig, verbosity string) (*kubeScheduler, error) {
	opts := options.NewOptions()
	for _, f := range []struct{ set, name, value string }{
		{"deprecated", "kubeconfig", kubeconfig},
		{"leader election", "leader-elect", "false"},
		{"secure serving", "secure-port", "0"},
		{"logs", "v", verbosity},
	} {
		if err := opts.Flags.FlagSet(f.set).Set(f.name, f.value); err != nil {
			return nil, fmt.Errorf("--%s=%s: %w", f.name, f.value, err)
		}
	}
	// What NewSchedulerCommand's PersistentPreRunE and runCommand do before Setup: settle the
	// feature gates and emulation version, apply the logging options (process-wide, so the
	// controllers log the same way), name the informers for client-go's metrics.
	if err := opts.ComponentGlobalsRegistry.Set(); err != nil {
		return nil, err
	}
	if err := logsapi.ValidateAndApply(opts.Logs, opts.ComponentGlobalsRegistry.FeatureGateFor(basecompatibility.DefaultKubeComponent)); err != nil {
		return nil, err
	}
	informerName, err := cache.NewInformerName("kube-scheduler")
	if err != nil {
		return nil, err
	}
	opts.InformerName = informerName
	config, sched, err := app.Setup(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &kubeScheduler{config: config, sched: sched}, nil
}

// run starts the scheduler's informers and schedules until ctx ends.
func (s *kubeScheduler) run(ctx context.Context) error {
	return app.Run(ctx, s.config, s.sched)
}

// waitForSync returns once every event handler of the scheduler has seen its informer's initial
// list: what app.Run itself waits for before it schedules the first pod.
func (s *kubeScheduler) waitForSync(ctx context.Context) error {
	return s.sched.WaitForHandlersSync(ctx)
}
