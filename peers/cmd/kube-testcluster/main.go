// Command kube-testcluster runs a control plane for the tests: an embedded etcd and upstream's
// kube-apiserver, both in this process, serving TLS on 127.0.0.1 with static-token users and
// service-account tokens. It prints one JSON line once /readyz answers and runs until SIGTERM
// or SIGINT. Run with --help for the flags.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"github.com/pod-resources-watcher/peers/internal/peerkit"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

type options struct {
	dir        string
	identities identityFlags
	timeout    time.Duration
	extraArgs  stringList
	listenIP   string
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, " ") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("kube-testcluster", flag.ContinueOnError)
	fs.StringVar(&o.dir, "dir", "", "directory for etcd's data, the keys, certificates, kubeconfigs and logs (required; created if missing)")
	fs.Var(&o.identities, "identity", "a static-token user `name[:group1,group2]` with a <dir>/<name>.kubeconfig; repeatable. The user admin (group system:masters) always exists")
	fs.DurationVar(&o.timeout, "timeout", 60*time.Second, "how long etcd and the API server may take to become ready before the start fails")
	fs.StringVar(&o.listenIP, "listen-ip", "", "also serve on this address (a container node's host-side veth, which may not exist yet): bind 0.0.0.0, advertise it, put it in the serving certificate, report it as listen_server; kubelets are then reached at their InternalIP")
	fs.Var(&o.extraArgs, "apiserver-arg", "one more kube-apiserver flag, e.g. --apiserver-arg=--feature-gates=X=true; repeatable, after (and so overriding) the built-in ones")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: kube-testcluster --dir DIR [--identity NAME[:GROUPS]]... [--timeout D] [--listen-ip IP] [--apiserver-arg FLAG]...

Runs an embedded etcd (go.etcd.io/etcd/server/v3/embed) and upstream's kube-apiserver
(k8s.io/kubernetes/cmd/kube-apiserver/app) in this process, on 127.0.0.1 with free ports:
TLS with a generated CA, static-token authentication, RBAC authorization, the default
admission plugins (ValidatingAdmissionPolicy among them) and service-account tokens
(TokenRequest; pod-bound tokens carry the pod's node name).

With --listen-ip IP it binds 0.0.0.0 instead (IP, a container node's host-side veth address,
may only appear later), advertises IP, serves a certificate valid for IP besides 127.0.0.1,
asks kubelets for logs at their InternalIP, and adds "listen_server": "https://IP:PORT" to the
ready line: where kubelets and pods in a node's network namespace reach it. The kubeconfigs
and the issuer keep 127.0.0.1.

When /readyz answers ok it prints one JSON line on stdout:
  {"ready": true, "server": ..., "ca": ..., "admin_kubeconfig": ..., "kubeconfigs": {...},
   "service_account_issuer": ..., "pid": ...}  (and "listen_server" with --listen-ip)
On failure: {"ready": false, "error": ...} on stdout, the error on stderr, exit 1.
Logs: DIR/kube-apiserver.log and DIR/etcd.log. SIGTERM or SIGINT stops the API server, then etcd.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.dir == "" {
		return o, fmt.Errorf("--dir is required")
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if o.listenIP != "" && net.ParseIP(o.listenIP) == nil {
		return o, fmt.Errorf("--listen-ip %q is not an IP address", o.listenIP)
	}
	return o, nil
}

// report is the one line on stdout that the caller waits for.
type report struct {
	Ready                bool              `json:"ready"`
	Error                string            `json:"error,omitempty"`
	Server               string            `json:"server,omitempty"`
	ListenServer         string            `json:"listen_server,omitempty"`
	CA                   string            `json:"ca,omitempty"`
	AdminKubeconfig      string            `json:"admin_kubeconfig,omitempty"`
	Kubeconfigs          map[string]string `json:"kubeconfigs,omitempty"`
	ServiceAccountIssuer string            `json:"service_account_issuer,omitempty"`
	PID                  int               `json:"pid,omitempty"`
}

func main() {
	peerkit.DieWithParent()
	o, err := parseFlags(os.Args[1:])
	if err == flag.ErrHelp {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kube-testcluster:", err)
		os.Exit(2)
	}
	stderr, err := redirectStderr(o.dir)
	if err != nil {
		fail(os.Stderr, err)
	}
	if err := run(o, stderr); err != nil {
		fail(stderr, err)
	}
}

func fail(stderr *os.File, err error) {
	line, _ := json.Marshal(report{Ready: false, Error: err.Error()})
	fmt.Println(string(line))
	fmt.Fprintln(stderr, "kube-testcluster:", err)
	os.Exit(1)
}

// redirectStderr points file descriptor 2 at DIR/kube-apiserver.log, where klog writes, so that
// the caller's stderr carries only our own error line; it returns the original stderr for that.
func redirectStderr(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	logFile, err := os.OpenFile(filepath.Join(dir, "kube-apiserver.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
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

func run(o options, stderr *os.File) error {
	dir, err := filepath.Abs(o.dir)
	if err != nil {
		return err
	}
	// Built first: it installs the SIGTERM/SIGINT handler whose context stops the API server.
	command := app.NewAPIServerCommand()
	ctx := command.Context()

	certs, err := makeCertificates(dir, o.listenIP)
	if err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	server := fmt.Sprintf("https://127.0.0.1:%d", port)
	bind, advertise, listenServer := "127.0.0.1", "127.0.0.1", ""
	if o.listenIP != "" {
		bind, advertise = "0.0.0.0", o.listenIP
		listenServer = "https://" + net.JoinHostPort(o.listenIP, strconv.Itoa(port))
	}
	ids := append([]identity{{name: "admin", groups: []string{"system:masters"}}}, o.identities...)
	for i := range ids {
		if ids[i].token, err = newToken(); err != nil {
			return err
		}
	}
	admin := ids[0]
	tokenFile := filepath.Join(dir, "tokens.csv")
	if err := writeTokenFile(tokenFile, ids); err != nil {
		return err
	}
	kubeconfigs := map[string]string{}
	for _, id := range ids {
		path, err := writeKubeconfig(dir, server, certs.caFile, id)
		if err != nil {
			return err
		}
		kubeconfigs[id.name] = path
	}

	// On a failed start etcd is left to die with the process: closing it would wait for the
	// API server's open watches, which nothing stops.
	etcd, etcdURL, err := startEtcd(dir, o.timeout)
	if err != nil {
		return err
	}

	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=" + bind,
		"--advertise-address=" + advertise,
		fmt.Sprintf("--secure-port=%d", port),
		"--tls-cert-file=" + certs.certFile,
		"--tls-private-key-file=" + certs.keyFile,
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--token-auth-file=" + tokenFile,
		"--authorization-mode=RBAC",
		// As kubeadm, kind and managed clusters run it (the flag's own default is false): the
		// documented privileged alternative of the SELinux overlay must be judged as there.
		"--allow-privileged=true",
		"--service-account-issuer=" + server,
		"--api-audiences=" + server,
		"--service-account-key-file=" + certs.saKeyFile,
		"--service-account-signing-key-file=" + certs.saKeyFile,
		// The kubernetes Service's endpoints would name 127.0.0.1, which endpoint validation
		// refuses; nothing here routes through that Service anyway.
		"--endpoint-reconciler-type=none",
		"--profiling=false",
		"--v=0",
	}
	if o.listenIP != "" {
		// A kubelet's Hostname address is its node name, which nothing resolves here; its
		// InternalIP (--node-ip) is where its server listens (logs, exec).
		args = append(args, "--kubelet-preferred-address-types=InternalIP,Hostname")
	}
	command.SetArgs(append(args, o.extraArgs...))
	done := make(chan error, 1)
	go func() { done <- command.Execute() }()

	if err := waitReady(ctx, server, certs.caFile, admin.token, o.timeout, done); err != nil {
		return err
	}
	line, err := json.Marshal(report{
		Ready:                true,
		Server:               server,
		ListenServer:         listenServer,
		CA:                   certs.caFile,
		AdminKubeconfig:      kubeconfigs["admin"],
		Kubeconfigs:          kubeconfigs,
		ServiceAccountIssuer: server,
		PID:                  os.Getpid(),
	})
	if err != nil {
		return err
	}
	fmt.Println(string(line))

	// The API server returns once the signal context is cancelled and it has drained; etcd
	// is closed after it, so no request loses its storage mid-flight.
	if err := <-done; err != nil && ctx.Err() == nil {
		return fmt.Errorf("kube-apiserver stopped: %w", err)
	}
	etcd.Close()
	return nil
}
