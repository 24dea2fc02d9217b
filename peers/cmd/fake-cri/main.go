package main

import (
	_ "k8s.io/cri-client/pkg/fake"
)

func main() {}
