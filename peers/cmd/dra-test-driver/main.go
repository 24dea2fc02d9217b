package main

import (
	_ "k8s.io/kubernetes/test/e2e/dra/test-driver/app"
)

func main() {}
