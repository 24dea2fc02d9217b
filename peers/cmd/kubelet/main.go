package main

import (
	_ "k8s.io/cri-client/pkg/fake"
	_ "k8s.io/kubernetes/cmd/kubelet/app"
	_ "k8s.io/kubernetes/cmd/kubelet/app/options"
	_ "k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"
)

func main() {}
