package main

import (
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
	_ "k8s.io/kubernetes/pkg/controller/job"
	_ "k8s.io/kubernetes/pkg/controller/resourceclaim"
)

func main() {}
