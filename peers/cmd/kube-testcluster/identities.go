package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// identity is one static-token user: a name, its groups and the bearer token that proves it.
type identity struct {
	name   string
	groups []string
	token  string
}

// A name becomes a file name (<name>.kubeconfig) and a CSV field: keep it to a safe alphabet.
var identityName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// identityFlags collects repeated --identity name[:group1,group2] flags.
type identityFlags []identity

func (f *identityFlags) String() string {
	names := make([]string, len(*f))
	for i, id := range *f {
		names[i] = id.name
	}
	return strings.Join(names, ",")
}

func (f *identityFlags) Set(value string) error {
	name, groups, _ := strings.Cut(value, ":")
	if !identityName.MatchString(name) || name == "admin" {
		return fmt.Errorf("%q: the name must match %s and not be admin", value, identityName)
	}
	for _, existing := range *f {
		if existing.name == name {
			return fmt.Errorf("%q: identity %s given twice", value, name)
		}
	}
	id := identity{name: name}
	for _, group := range strings.Split(groups, ",") {
		if group == "" {
			continue
		}
		if strings.ContainsAny(group, "\",\n") {
			return fmt.Errorf("%q: a group may not contain a quote, comma or newline", value)
		}
		id.groups = append(id.groups, group)
	}
	*f = append(*f, id)
	return nil
}

func newToken() (string, error) {
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	return hex.EncodeToString(raw), nil
}

// writeTokenFile writes the --token-auth-file: token,user,uid,"group1,group2" per line.
func writeTokenFile(path string, ids []identity) error {
	var b strings.Builder
	for _, id := range ids {
		fmt.Fprintf(&b, "%s,%s,%s,\"%s\"\n", id.token, id.name, id.name, strings.Join(id.groups, ","))
	}
	return os.WriteFile(path, []byte(b.String()), 0o600)
}

// writeKubeconfig writes a kubeconfig that reaches server, trusting only caFile, as id.
func writeKubeconfig(dir, server, caFile string, id identity) (string, error) {
	path := filepath.Join(dir, id.name+".kubeconfig")
	config := clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"kube-testcluster": {Server: server, CertificateAuthority: caFile}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{id.name: {Token: id.token}},
		Contexts:       map[string]*clientcmdapi.Context{id.name: {Cluster: "kube-testcluster", AuthInfo: id.name}},
		CurrentContext: id.name,
	}
	return path, clientcmd.WriteToFile(config, path)
}
