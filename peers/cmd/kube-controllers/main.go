// Command kube-controllers runs, in one process and against one API server, the control-plane
// pieces a node test needs and kube-testcluster lacks: upstream's kube-scheduler (which also
// allocates DRA ResourceClaims), the resourceclaim controller (claims for pods from
// ResourceClaimTemplates) and the Job controller (pods for Jobs, owned by them); on request
// (--controllers) also the DaemonSet controller, the garbage collector and the root CA
// publisher, for DaemonSets on a container node. It prints one JSON line once every informer has
// synced and runs until SIGTERM or SIGINT. Run with --help for the flags.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"github.com/pod-resources-watcher/peers/internal/peerkit"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type flags struct {
	kubeconfig  string
	logFile     string
	timeout     time.Duration
	verbosity   int
	controllers []string
	scheduler   bool
}

func parseFlags(args []string) (flags, error) {
	var o flags
	fs := flag.NewFlagSet("kube-controllers", flag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of a user allowed everything the three need, e.g. kube-testcluster's admin (required)")
	fs.StringVar(&o.logFile, "log-file", "", "file that klog (and anything else written to stderr) goes to; without it, stderr")
	fs.DurationVar(&o.timeout, "timeout", 60*time.Second, "how long the informers may take to sync before the start fails")
	fs.IntVar(&o.verbosity, "v", 0, "klog verbosity, as the upstream components' --v")
	controllers := fs.String("controllers", strings.Join(defaultControllers, ","), "the controllers to run beside the scheduler, comma-separated, from: "+strings.Join(knownControllers, ", "))
	// A second kube-controllers beside the session's (one controller only) must not run a
	// second scheduler: two would race to bind the same pods.
	fs.BoolVar(&o.scheduler, "scheduler", true, "run kube-scheduler too; false: only --controllers")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: kube-controllers --kubeconfig FILE [--controllers NAMES] [--log-file FILE] [--timeout D] [--v N]

Runs, in this process, against the API server of FILE:
  - upstream's kube-scheduler (k8s.io/kubernetes/cmd/kube-scheduler/app: Setup and Run, with
    --leader-elect=false and --secure-port=0), which binds pods and allocates ResourceClaims;
  - the resourceclaim controller (k8s.io/kubernetes/pkg/controller/resourceclaim), which creates
    the ResourceClaims of pods that name a ResourceClaimTemplate;
  - the Job controller (k8s.io/kubernetes/pkg/controller/job), which creates the pods of Jobs.
Those two are the default --controllers (resourceclaim,job). Also available, as a container
node's DaemonSets need them:
  - daemonset (pkg/controller/daemon): a DaemonSet's pod on each node;
  - garbagecollector (pkg/controller/garbagecollector): what a deleted object owns is deleted
    (a DaemonSet's pods after helm uninstall or kubectl delete);
  - root-ca-cert-publisher (pkg/controller/certificates/rootcacertpublisher): the
    kube-root-ca.crt ConfigMap in every namespace, which projected token volumes include;
  - device-taint-eviction-controller (pkg/controller/devicetainteviction): evicts the pods whose
    allocated devices carry a NoExecute taint (ResourceSlice or DeviceTaintRule), as
    kube-controller-manager does; best run alone in a process of its own with --scheduler=false.

Once all their informers have synced it prints one JSON line on stdout:
  {"ready": true, "pid": N}
On failure: {"ready": false, "error": ...} on stdout, the error on stderr, exit 1 (2 for bad
flags). SIGTERM or SIGINT stops all three and exits 0.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.kubeconfig == "" {
		return o, fmt.Errorf("--kubeconfig is required")
	}
	var err error
	if o.controllers, err = parseControllers(*controllers); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	return o, nil
}

// report is the one line on stdout that the caller waits for.
type report struct {
	Ready bool   `json:"ready"`
	Error string `json:"error,omitempty"`
	PID   int    `json:"pid,omitempty"`
}

func main() {
	peerkit.DieWithParent()
	o, err := parseFlags(os.Args[1:])
	if err == flag.ErrHelp {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kube-controllers:", err)
		os.Exit(2)
	}
	stderr := os.Stderr
	if o.logFile != "" {
		if stderr, err = redirectStderr(o.logFile); err != nil {
			fail(os.Stderr, err)
		}
	}
	if err := run(o); err != nil {
		fail(stderr, err)
	}
}

func fail(stderr *os.File, err error) {
	line, _ := json.Marshal(report{Ready: false, Error: err.Error()})
	fmt.Println(string(line))
	fmt.Fprintln(stderr, "kube-controllers:", err)
	os.Exit(1)
}

// redirectStderr points file descriptor 2 at the log file, where klog writes (as do a panic's
// goroutine dumps), so that the caller's stderr carries only our own error line; it returns the
// original stderr for that.
func redirectStderr(path string) (*os.File, error) {
	logFile, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	saved, err := syscall.Dup(2)
	if err != nil {
		return nil, err
	}
	if err := syscall.Dup3(int(logFile.Fd()), 2, 0); err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(saved), "stderr"), nil
}

func run(o flags) error {
	// Our own handler, not the scheduler's server.SetupSignalHandler (runCommand's): that one may
	// be installed once per process and would stop only the scheduler.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	var scheduler *kubeScheduler
	if o.scheduler {
		var err error
		if scheduler, err = newScheduler(ctx, o.kubeconfig, strconv.Itoa(o.verbosity)); err != nil {
			return fmt.Errorf("kube-scheduler: %w", err)
		}
	}
	controllers, err := newControllers(ctx, o.kubeconfig, o.controllers)
	if err != nil {
		return err
	}

	schedulerDone := make(chan error, 1)
	if scheduler != nil {
		go func() { schedulerDone <- scheduler.run(ctx) }()
	}
	controllers.startInformers(ctx)

	syncCtx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	synced := make(chan error, 1)
	go func() {
		if err := controllers.waitForSync(syncCtx); err != nil {
			synced <- err
			return
		}
		if scheduler == nil {
			synced <- nil
			return
		}
		synced <- scheduler.waitForSync(syncCtx)
	}()
	select {
	case err := <-schedulerDone:
		return fmt.Errorf("kube-scheduler stopped before it was ready: %v", err)
	case err := <-synced:
		if err != nil {
			if ctx.Err() != nil {
				return errors.New("stopped by a signal before the informers synced")
			}
			return fmt.Errorf("informers not synced within %s: %w", o.timeout, err)
		}
	}
	controllersDone := controllers.run(ctx)

	line, err := json.Marshal(report{Ready: true, PID: os.Getpid()})
	if err != nil {
		return err
	}
	fmt.Println(string(line))

	if scheduler == nil {
		<-ctx.Done()
		<-controllersDone
		return nil
	}
	// Without leader election the scheduler's Run always returns an error ("finished without
	// leader elect"), also on a clean stop: only one before the signal is a failure.
	err = <-schedulerDone
	if ctx.Err() == nil {
		return fmt.Errorf("kube-scheduler stopped: %v", err)
	}
	<-controllersDone
	return nil
}
